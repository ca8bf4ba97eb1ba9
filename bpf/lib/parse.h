/* parse.h — reading a packet's IPv4 and L4 headers into struct pkt4.
 *
 * Every read goes through bpf_skb_load_bytes(), which checks bounds against
 * the whole (possibly non-linear) packet: a truncated header becomes a drop
 * reason instead of a verifier puzzle.
 */
#ifndef LABKIT_PARSE_H
#define LABKIT_PARSE_H

#include "trace_types.h"

#define PARSE_NOT_IPV4 1 /* not an IPv4 frame: hooks pass it untouched */
#define IP_MF_FLAG     0x2000
#define IP_OFFSET_MASK 0x1fff
#define VXLAN_HLEN     8

struct pkt4 {
	__u32 l3_off;
	__u32 l4_off;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;    /* ICMP echo: the identifier */
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 is_frag;    /* any fragment: ports unknown or incomplete */
	__u8 icmp_code;
};

/* Parse IPv4 at l3_off. Returns 0, or a DROP_* reason for a malformed header. */
static __always_inline int parse_ipv4_at(struct __sk_buff *skb, __u32 l3_off, struct pkt4 *p)
{
	struct iphdr ip;
	__u8 l4[14];

	if (bpf_skb_load_bytes(skb, l3_off, &ip, sizeof(ip)) < 0)
		return DROP_INVALID;
	if (ip.version != 4 || ip.ihl < 5)
		return DROP_INVALID;
	p->l3_off = l3_off;
	p->l4_off = l3_off + ip.ihl * 4;
	if (p->l4_off > skb->len)
		return DROP_INVALID; /* the header's options run past the packet */
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->proto = ip.protocol;
	p->is_frag = (lk_ntohs(ip.frag_off) & (IP_MF_FLAG | IP_OFFSET_MASK)) != 0;
	if (lk_ntohs(ip.frag_off) & IP_OFFSET_MASK)
		return 0; /* a later fragment carries no L4 header */

	switch (p->proto) {
	case IPPROTO_TCP:
		if (bpf_skb_load_bytes(skb, p->l4_off, l4, 14) < 0)
			return DROP_CT_INVALID_HDR;
		p->tcp_flags = l4[13];
		break;
	case IPPROTO_UDP:
		if (bpf_skb_load_bytes(skb, p->l4_off, l4, 8) < 0)
			return DROP_CT_INVALID_HDR;
		break;
	case IPPROTO_ICMP:
		if (bpf_skb_load_bytes(skb, p->l4_off, l4, 8) < 0)
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

/* Parse an Ethernet frame. PARSE_NOT_IPV4 for ARP, IPv6 and the rest. */
static __always_inline int parse_eth_ipv4(struct __sk_buff *skb, struct pkt4 *p)
{
	__be16 proto;

	if (bpf_skb_load_bytes(skb, 12, &proto, sizeof(proto)) < 0)
		return PARSE_NOT_IPV4;
	if (proto != lk_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;
	return parse_ipv4_at(skb, ETH_HLEN, p);
}

/* A VXLAN packet on the underlay: parse the encapsulated IPv4 packet. */
static __always_inline int parse_vxlan_inner(struct __sk_buff *skb, const struct pkt4 *outer,
					     struct pkt4 *inner)
{
	__u32 off = outer->l4_off + 8 /* UDP */ + VXLAN_HLEN;
	__be16 proto;

	if (outer->proto != IPPROTO_UDP || outer->is_frag)
		return PARSE_NOT_IPV4;
	if (outer->dport != lk_htons(VXLAN_PORT) && outer->sport != lk_htons(VXLAN_PORT))
		return PARSE_NOT_IPV4;
	if (bpf_skb_load_bytes(skb, off + 12, &proto, sizeof(proto)) < 0 || proto != lk_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;
	return parse_ipv4_at(skb, off + ETH_HLEN, inner);
}

#endif /* LABKIT_PARSE_H */
