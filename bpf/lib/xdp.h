/* xdp.h — reading and rewriting a frame in XDP, before the kernel has built
 * an skb (the role of Cilium's bpf/include/bpf/ctx/xdp.h). tc programs use
 * bpf_skb_* helpers that check bounds and fix checksums; here the program
 * reads and writes the frame directly between ctx->data and ctx->data_end,
 * proves every access in bounds to the verifier, and updates checksums
 * itself (RFC 1624's incremental update). The frame always starts with its
 * Ethernet header, so the IPv4 header is at ETH_HLEN.
 */
#ifndef LABKIT_XDP_H
#define LABKIT_XDP_H

#include "parse.h"
#include "dsr.h"
#include "trace.h"

/* Cilium's XDP-to-skb metadata (bpf/lib/common.h, "XDP to SKB transferred
 * meta data"): the XDP program found no service, so the tc program on the same
 * device need not look again (bpf_host.c's cil_from_netdev reads it). */
#define XFER_PKT_NO_SVC 1

#define XDP_L4_OFF_MAX (ETH_HLEN + 60) /* the longest IPv4 header: ihl 15 */

static __always_inline __u32 xdp_len(const struct xdp_md *ctx)
{
	return ctx->data_end - ctx->data;
}

/* trace_init() for a frame in XDP: the device it arrived on, its length. */
static __always_inline void xdp_trace_init(struct trace_event *ev, struct xdp_md *ctx, __u8 hook,
					   const struct pkt4 *p)
{
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = ctx->ingress_ifindex;
	ev->len = xdp_len(ctx);
	__trace_init(ev, hook, p);
}

/* parse_eth_ipv4() for a frame in XDP: the same fields and the same DROP_*
 * reasons for the same malformed headers, so both hooks judge a frame alike. */
static __always_inline int xdp_parse4(struct xdp_md *ctx, struct pkt4 *p)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u8 *l4;

	if ((void *)(eth + 1) > data_end || eth->h_proto != lk_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5)
		return DROP_INVALID;
	p->l3_off = ETH_HLEN;
	p->l4_off = ETH_HLEN + ip->ihl * 4;
	l4 = data + p->l4_off;
	if ((void *)l4 > data_end)
		return DROP_INVALID; /* the header's options run past the frame */
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = ip->protocol;
	p->is_frag = (lk_ntohs(ip->frag_off) & (IP_MF_FLAG | IP_OFFSET_MASK)) != 0;
	if (lk_ntohs(ip->frag_off) & IP_OFFSET_MASK)
		return 0;
	switch (p->proto) {
	case IPPROTO_TCP:
		if ((void *)(l4 + 14) > data_end)
			return DROP_CT_INVALID_HDR;
		p->tcp_flags = l4[13];
		break;
	case IPPROTO_UDP:
		if ((void *)(l4 + 8) > data_end)
			return DROP_CT_INVALID_HDR;
		break;
	case IPPROTO_ICMP:
		if ((void *)(l4 + 8) > data_end)
			return DROP_CT_INVALID_HDR;
		p->icmp_type = l4[0];
		p->icmp_code = l4[1];
		if (l4[0] == ICMP_ECHO || l4[0] == ICMP_ECHOREPLY)
			__builtin_memcpy(&p->sport, &l4[4], 2);
		return 0;
	default:
		return 0;
	}
	__builtin_memcpy(&p->sport, &l4[0], 2);
	__builtin_memcpy(&p->dport, &l4[2], 2);
	return 0;
}

/* RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m'), 16 bits at a time. The sums are
 * taken over the bytes as they lie in the frame, so byte order does not matter. */
static __always_inline __u16 xdp_csum_replace4(__u16 check, __be32 from, __be32 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~(from & 0xffff) + (__u16)~(from >> 16);
	sum += (to & 0xffff) + (to >> 16);
	return csum_fold32(sum);
}

static __always_inline __u16 xdp_csum_replace2(__u16 check, __be16 from, __be16 to)
{
	return csum_fold32((__u32)(__u16)~check + (__u16)~from + to);
}

/* lb4_rewrite() in XDP: one address (and port) of the frame, with the IPv4
 * and TCP/UDP checksums updated. A UDP datagram without a checksum keeps none;
 * one whose new checksum folds to 0 sends 0xffff (as BPF_F_MARK_MANGLED_0
 * does at tc). A TCP header too short to hold its checksum: DROP_CSUM_L4, what
 * bpf_l4_csum_replace() makes of it at tc. */
static __always_inline int xdp_rewrite4(struct xdp_md *ctx, struct pkt4 *p, bool dst, __be32 new_addr,
					__be16 new_port)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__u32 l4_off = p->l4_off;
	__be32 old_addr = dst ? p->daddr : p->saddr;
	__be16 old_port = dst ? p->dport : p->sport;
	__u16 *csum = NULL, check;
	__u8 *l4;

	if (l4_off > XDP_L4_OFF_MAX) /* bounds the offset for the verifier */
		return DROP_INVALID;
	l4 = data + l4_off;
	if ((void *)(ip + 1) > data_end || (void *)(l4 + 8) > data_end)
		return DROP_WRITE_ERROR;
	if (p->proto == IPPROTO_TCP) {
		if ((void *)(l4 + 18) > data_end)
			return DROP_CSUM_L4;
		csum = (__u16 *)(l4 + TCP_CSUM_OFF);
	} else if (p->proto == IPPROTO_UDP) {
		csum = (__u16 *)(l4 + UDP_CSUM_OFF);
	}
	ip->check = xdp_csum_replace4(ip->check, old_addr, new_addr);
	if (dst)
		ip->daddr = new_addr;
	else
		ip->saddr = new_addr;
	if (csum && !(p->proto == IPPROTO_UDP && *csum == 0)) {
		check = xdp_csum_replace4(*csum, old_addr, new_addr);
		check = xdp_csum_replace2(check, old_port, new_port);
		if (p->proto == IPPROTO_UDP && check == 0)
			check = 0xffff;
		*csum = check;
	}
	if (csum)
		__builtin_memcpy(l4 + (dst ? 2 : 0), &new_port, 2);
	if (dst) {
		p->daddr = new_addr;
		p->dport = new_port;
	} else {
		p->saddr = new_addr;
		p->sport = new_port;
	}
	return 0;
}

/* dsr_add_opt4() in XDP: there is no bpf_skb_adjust_room() here, so the frame
 * grows at its head (bpf_xdp_adjust_head) and the Ethernet and IPv4 headers
 * move forward over the new room, leaving it between the IPv4 header and L4. */
static __always_inline int xdp_dsr_add_opt4(struct xdp_md *ctx, struct pkt4 *p, __be32 svc_addr, __be16 svc_port)
{
	__u32 buf[(ETH_HLEN + IPV4_HLEN + DSR_IPV4_OPT_LEN + 2) / 4] = {}; /* 2: pads 42 bytes to 44 */
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	__u8 *hdr = (__u8 *)buf + 2; /* the IPv4 header 4-byte aligned, for bpf_csum_diff */
	struct iphdr ip;
	struct dsr_opt_v4 opt = {};

	if (data + ETH_HLEN + IPV4_HLEN > data_end)
		return DROP_INVALID;
	__builtin_memcpy(hdr, data, ETH_HLEN);
	__builtin_memcpy(&ip, data + ETH_HLEN, IPV4_HLEN);
	if (ip.ihl != 5)
		return DROP_INVALID;
	if (bpf_xdp_adjust_head(ctx, -DSR_IPV4_OPT_LEN) < 0)
		return DROP_INVALID;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + ETH_HLEN + IPV4_HLEN + DSR_IPV4_OPT_LEN > data_end)
		return DROP_INVALID;
	ip.ihl = 5 + DSR_IPV4_OPT_LEN / 4;
	ip.tot_len = lk_htons(lk_ntohs(ip.tot_len) + DSR_IPV4_OPT_LEN);
	ip.check = 0;
	dsr_opt4_init(&opt, svc_addr, svc_port);
	__builtin_memcpy(hdr + ETH_HLEN, &ip, IPV4_HLEN);
	__builtin_memcpy(hdr + ETH_HLEN + IPV4_HLEN, &opt, DSR_IPV4_OPT_LEN);
	ip.check = csum_fold32((__u32)bpf_csum_diff(NULL, 0, (__be32 *)(hdr + ETH_HLEN),
						   IPV4_HLEN + DSR_IPV4_OPT_LEN, 0));
	__builtin_memcpy(hdr + ETH_HLEN + offsetof(struct iphdr, check), &ip.check, 2);
	__builtin_memcpy(data, hdr, ETH_HLEN + IPV4_HLEN + DSR_IPV4_OPT_LEN);
	p->l4_off += DSR_IPV4_OPT_LEN;
	return 0;
}

#ifndef BPF_FIB_LKUP_RET_SUCCESS
#define BPF_FIB_LKUP_RET_SUCCESS 0
#endif

/* Send a translated frame on from XDP: the routing table gives the device and
 * next hop, the neighbour table the MACs (bpf_fib_lookup, as Cilium's
 * fib_redirect at XDP). Out of the device it came in on: XDP_TX; another:
 * bpf_redirect(). A next hop without a neighbour entry cannot be resolved in
 * XDP (Cilium's XDP path has no bpf_redirect_neigh either): DROP_NO_FIB. */
static __always_inline int xdp_fib_tx(struct xdp_md *ctx, const struct pkt4 *p)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct bpf_fib_lookup fib = {};
	struct ethhdr *eth = data;
	long ret;

	fib.family = 2; /* AF_INET */
	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = p->proto;
	fib.tot_len = xdp_len(ctx) - ETH_HLEN;
	fib.ipv4_src = p->saddr;
	fib.ipv4_dst = p->daddr;
	ret = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	if (ret != BPF_FIB_LKUP_RET_SUCCESS)
		return DROP_NO_FIB;
	if ((void *)(eth + 1) > data_end)
		return DROP_INVALID;
	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
	if (fib.ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(fib.ifindex, 0);
}

/* Leave the frame to the stack carrying XFER_PKT_NO_SVC in its metadata area
 * (bpf_xdp_adjust_meta: the 4 bytes before ctx->data, which tc reads as
 * skb->data_meta), as Cilium's bpf_xdp_exit moves its xfer marker. */
static __always_inline int xdp_pass_no_svc(struct xdp_md *ctx)
{
	void *meta, *data;

	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u32)) < 0)
		return XDP_PASS; /* no room: tc simply looks again */
	meta = (void *)(long)ctx->data_meta;
	data = (void *)(long)ctx->data;
	if (meta + sizeof(__u32) > data)
		return XDP_PASS;
	*(__u32 *)meta = XFER_PKT_NO_SVC;
	return XDP_PASS;
}

/* The tc side of the marker: did the XDP program pass this skb with
 * XFER_PKT_NO_SVC? (Cilium's ctx_get_xfer, read in cil_from_netdev.) */
static __always_inline bool skb_xfer_no_svc(const struct __sk_buff *skb)
{
	void *meta = (void *)(long)skb->data_meta, *data = (void *)(long)skb->data;

	return meta + sizeof(__u32) <= data && *(__u32 *)meta == XFER_PKT_NO_SVC;
}

#endif /* LABKIT_XDP_H */
