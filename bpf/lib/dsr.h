/* dsr.h — the IPv4 option that carries a Service frontend from the node that
 * load-balanced to the backend's node (Cilium's --bpf-lb-dsr-dispatch=opt):
 *
 *   type 0x9a (copied on fragmentation, number 26), length 8,
 *   then the frontend port and address.
 *
 * Cilium writes the port and address with bpf_htons()/bpf_htonl() applied to
 * values that are already in network byte order, and undoes it the same way
 * when reading (nodeport.h, dsr_set_opt4 and nodeport_extract_dsr_v4; its
 * tc_nodeport_dsr_backend test builds the option the same way). On a
 * little-endian host the frontend therefore crosses the wire byte-reversed:
 * 203.0.113.10:80 travels as `9a 08 50 00 0a 71 00 cb`. labkit does the same.
 *
 * It rides on TCP SYNs and every UDP packet; the backend's node reads it,
 * remembers the frontend for the replies and removes it again.
 */
#ifndef LABKIT_DSR_H
#define LABKIT_DSR_H

#include "parse.h"

#define DSR_IPV4_OPT_TYPE 0x9a
#define DSR_IPV4_OPT_LEN  8
#define IPV4_HLEN         20 /* the header without options */

struct dsr_opt_v4 {
	__u8 type;
	__u8 len;
	__be16 port;
	__be32 addr;
};

static __always_inline __u16 csum_fold32(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/* Write the 20-byte header plus the option (or the header alone) at l3_off,
 * with a freshly computed header checksum. */
static __always_inline int ipv4_store_header(struct __sk_buff *skb, __u32 l3_off, struct iphdr *ip,
					     const struct dsr_opt_v4 *opt)
{
	__u32 buf[(IPV4_HLEN + DSR_IPV4_OPT_LEN) / 4] = {};

	ip->check = 0;
	__builtin_memcpy(buf, ip, IPV4_HLEN);
	if (opt) {
		__builtin_memcpy((__u8 *)buf + IPV4_HLEN, opt, DSR_IPV4_OPT_LEN);
		ip->check = csum_fold32((__u32)bpf_csum_diff(NULL, 0, buf, IPV4_HLEN + DSR_IPV4_OPT_LEN, 0));
	} else {
		ip->check = csum_fold32((__u32)bpf_csum_diff(NULL, 0, buf, IPV4_HLEN, 0));
	}
	__builtin_memcpy(buf, ip, IPV4_HLEN);
	if (bpf_skb_store_bytes(skb, l3_off, buf, opt ? IPV4_HLEN + DSR_IPV4_OPT_LEN : IPV4_HLEN, 0) < 0)
		return DROP_WRITE_ERROR;
	return 0;
}

/* The option for frontend svc_addr:svc_port, byte-swapped as Cilium's (see above). */
static __always_inline void dsr_opt4_init(struct dsr_opt_v4 *opt, __be32 svc_addr, __be16 svc_port)
{
	opt->type = DSR_IPV4_OPT_TYPE;
	opt->len = DSR_IPV4_OPT_LEN;
	opt->port = lk_htons(svc_port);
	opt->addr = lk_htonl(svc_addr);
}

/* Insert the option after the 20-byte header. A packet that already has
 * options has no room for it: DROP_INVALID. */
static __always_inline int dsr_add_opt4(struct __sk_buff *skb, struct pkt4 *p, __be32 svc_addr, __be16 svc_port)
{
	struct dsr_opt_v4 opt = {};
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, p->l3_off, &ip, sizeof(ip)) < 0 || ip.ihl != 5)
		return DROP_INVALID;
	if (bpf_skb_adjust_room(skb, DSR_IPV4_OPT_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return DROP_INVALID;
	ip.ihl = 5 + DSR_IPV4_OPT_LEN / 4;
	ip.tot_len = lk_htons(lk_ntohs(ip.tot_len) + DSR_IPV4_OPT_LEN);
	dsr_opt4_init(&opt, svc_addr, svc_port);
	p->l4_off += DSR_IPV4_OPT_LEN;
	return ipv4_store_header(skb, p->l3_off, &ip, &opt);
}

/* Read the frontend from the option. 1 with addr and port set; 0 if the packet
 * has no IP options; DROP_INVALID for anything else in the options space
 * (another option, a wrong length, more than one option). */
static __always_inline int dsr_parse_opt4(struct __sk_buff *skb, const struct pkt4 *p, __be32 *addr, __be16 *port)
{
	__u32 optlen = p->l4_off - p->l3_off - IPV4_HLEN;
	struct dsr_opt_v4 opt;

	if (optlen == 0)
		return 0;
	if (optlen != DSR_IPV4_OPT_LEN)
		return DROP_INVALID;
	if (bpf_skb_load_bytes(skb, p->l3_off + IPV4_HLEN, &opt, sizeof(opt)) < 0)
		return DROP_INVALID;
	if (opt.type != DSR_IPV4_OPT_TYPE || opt.len != DSR_IPV4_OPT_LEN)
		return DROP_INVALID;
	*addr = lk_ntohl(opt.addr);
	*port = lk_ntohs(opt.port);
	return 1;
}

/* Remove the option again, so the pod receives a plain packet. */
static __always_inline int dsr_strip_opt4(struct __sk_buff *skb, struct pkt4 *p)
{
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, p->l3_off, &ip, sizeof(ip)) < 0)
		return DROP_INVALID;
	if (bpf_skb_adjust_room(skb, -DSR_IPV4_OPT_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return DROP_INVALID;
	ip.ihl = 5;
	ip.tot_len = lk_htons(lk_ntohs(ip.tot_len) - DSR_IPV4_OPT_LEN);
	p->l4_off -= DSR_IPV4_OPT_LEN;
	return ipv4_store_header(skb, p->l3_off, &ip, NULL);
}

#endif /* LABKIT_DSR_H */
