/* nodeport_xdp.h — nodeport_lb4() for the XDP entry (Cilium compiles its
 * lib/nodeport.h a second time for bpf_xdp.c, with IS_BPF_XDP; labkit has one
 * translation unit per node, so the XDP variant has its own functions).
 *
 * The decisions and the map rows are nodeport_lb4's, and must stay so (a
 * datapath test compares the rows of a tc lab and an XDP lab): the lookups
 * (lb4_lookup_frontend, __lb4_local, lookup_endpoint4) and ct_lookup4 /
 * ct_create4 are the same functions; the two blocks below repeat
 * nodeport_lb4's CT block and snat_v4_nodeport's new mapping without the
 * packet writes, which in XDP go through xdp.h. They are repeated rather than
 * shared because sharing them changed the instructions clang emits for
 * cil_from_netdev, and builds without XDP stay byte for byte what they were.
 * Keep in sync with nodeport_lb4 (nodeport.h) and snat_v4_nodeport (nat.h).
 */
#ifndef LABKIT_NODEPORT_XDP_H
#define LABKIT_NODEPORT_XDP_H

#include "nodeport.h"
#include "xdp.h"

/* nodeport_lb4's CT block: the NodePort OUT entry (and a local backend's IN
 * entry) of a flow whose replies pass this node again. 0 or a DROP_* reason. */
static __always_inline int nodeport_track4_xdp(__u32 len, const struct pkt4 *p, const struct lb4_service *svc,
					       bool local, struct trace_event *ev)
{
	struct ipv4_ct_tuple tuple = {};
	struct ct_state cst = {};
	int ret;

	ret = ct_lookup4(&tuple, p, len, CT_EGRESS, &cst);
	if (ret < 0)
		return ret;
	if (ret == CT_NEW) {
		cst.src_sec_id = IDENTITY_WORLD;
		cst.rev_nat_index = svc->rev_nat_index;
		cst.flags = CT_F_NODE_PORT;
		ret = ct_create4(&tuple, len, CT_EGRESS, &cst, false); /* no RELATED twin */
		if (ret < 0)
			return ret;
		if (local) {
			struct ct_state in = cst;

			in.rev_nat_index = 0;
			tuple.flags = TUPLE_F_IN;
			ret = ct_create4(&tuple, len, CT_INGRESS, &in, true);
			if (ret < 0)
				return ret;
		}
		ret = CT_NEW;
	}
	trace_ct(ev, CT_EGRESS, ret, &cst);
	return 0;
}

/* snat_v4_nodeport's mapping (Cilium's snat_v4_new_mapping), the new source
 * returned in *to_addr:*to_port instead of written. 0 or a DROP_* reason. */
static __always_inline int snat_v4_nodeport_xdp(const struct pkt4 *p, __be32 *to_addr, __be16 *to_port)
{
	struct ipv4_nat_entry ostate = {}, rstate = {};
	struct ipv4_ct_tuple okey = {}, rkey = {};
	struct ipv4_nat_entry *found;
	__u32 now = lab_now();
	__u16 port = lk_ntohs(p->sport);
	int i;

	nat_key4(&okey, p->saddr, p->daddr, p->sport, p->dport, p->proto, NAT_DIR_EGRESS);
	found = cilium_snat_v4_external.lookup(&okey);
	if (found) {
		*to_addr = found->to_addr;
		*to_port = found->to_port;
		return 0;
	}
	if (port < NAT_PORT_MIN)
		port = nat_clamp_port((__u16)bpf_get_prandom_u32());
	for (i = 0; i < SNAT_COLLISION_RETRIES; i++) {
		nat_key4(&rkey, p->daddr, NODE_IP, p->dport, lk_htons(port), p->proto, NAT_DIR_INGRESS);
		if (!cilium_snat_v4_external.lookup(&rkey))
			break;
		port = nat_clamp_port(i ? port + 1 : (__u16)bpf_get_prandom_u32());
	}
	if (i == SNAT_COLLISION_RETRIES)
		return DROP_NAT_NO_MAPPING;
	rstate.created = now;
	rstate.to_addr = p->saddr;
	rstate.to_port = p->sport;
	ostate.created = now;
	ostate.to_addr = NODE_IP;
	ostate.to_port = lk_htons(port);
	if (cilium_snat_v4_external.insert(&rkey, &rstate) < 0)
		return DROP_NAT_NO_MAPPING;
	if (cilium_snat_v4_external.insert(&okey, &ostate) < 0) {
		cilium_snat_v4_external.delete(&rkey);
		return DROP_NAT_NO_MAPPING;
	}
	*to_addr = NODE_IP;
	*to_port = ostate.to_port;
	return 0;
}

/* ipv4_dec_ttl() in XDP: the frame is about to be routed on (XDP_TX or a
 * redirect), so the node does the router's part (Cilium's fib_redirect_v4 →
 * ipv4_l3 at XDP). 0 or a DROP_* reason. */
static __always_inline int xdp_dec_ttl4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 old, new;

	if ((void *)(ip + 1) > data_end)
		return DROP_INVALID;
	if (ip->ttl <= 1)
		return DROP_TTL_EXCEEDED;
	__builtin_memcpy(&old, &ip->ttl, 2); /* the TTL and protocol word */
	ip->ttl--;
	__builtin_memcpy(&new, &ip->ttl, 2);
	ip->check = xdp_csum_replace2(ip->check, old, new);
	return 0;
}

/* bpf_xdp_load_bytes(), which BCC 0.26 does not declare. */
static long (*lk_xdp_load_bytes)(struct xdp_md *ctx, __u32 off, void *buf, __u32 len) =
	(void *)BPF_FUNC_xdp_load_bytes;

/* lb4_no_service_reply() in XDP (Cilium's __tail_no_service_ipv4 under
 * __ctx_is == __ctx_xdp: xdp_adjust_tail for ctx_adjust_troom, xdp_adjust_head
 * for the room): the frame becomes ICMP port unreachable from the frontend to
 * the client, MACs swapped, the sample min(length, 64) bytes from the IPv4
 * header on. 0 or a DROP_* reason. */
static __always_inline int xdp_no_service_reply(struct xdp_md *ctx, const struct pkt4 *p)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	__u8 sample[ICMP_PACKET_MAX_SAMPLE_SIZE] = {};
	struct lb4_icmp_unreach icmp = {};
	struct iphdr ip = {};
	__u32 len = xdp_len(ctx), sample_len = len, size;
	__u8 eth[ETH_HLEN];
	__s64 sum;

	if (data + ETH_HLEN + IPV4_HLEN > data_end)
		return DROP_INVALID;
	__builtin_memcpy(eth, data + 6, 6); /* to the client: the sender's MAC */
	__builtin_memcpy(eth + 6, data, 6);
	eth[12] = 0x08;
	eth[13] = 0x00;
	ip.tos = ((struct iphdr *)(data + ETH_HLEN))->tos;
	if (sample_len > ICMP_PACKET_MAX_SAMPLE_SIZE)
		sample_len = ICMP_PACKET_MAX_SAMPLE_SIZE;
	bpf_xdp_adjust_tail(ctx, (int)(sample_len + ETH_HLEN) - (int)len); /* unchecked, as Cilium's */
	if (sample_len < 1)
		return DROP_INVALID;
	sample_len = ((sample_len - 1) & (ICMP_PACKET_MAX_SAMPLE_SIZE - 1)) + 1;
	if (lk_xdp_load_bytes(ctx, ETH_HLEN, sample, sample_len) < 0)
		return DROP_INVALID;
	size = (sample_len + 3) & ~3U;
	if (size > ICMP_PACKET_MAX_SAMPLE_SIZE)
		return DROP_INVALID;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)sample, size, 0);
	if (sum < 0)
		return DROP_INVALID;
	if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(ip) + sizeof(icmp))) < 0)
		return DROP_INVALID;
	ip.version = 4;
	ip.ihl = sizeof(ip) >> 2;
	ip.tot_len = lk_htons(sizeof(ip) + sizeof(icmp) + sample_len);
	ip.ttl = 64; /* IPDEFTTL */
	ip.protocol = IPPROTO_ICMP;
	ip.saddr = p->daddr;
	ip.daddr = p->saddr;
	ip.check = csum_fold32((__u32)bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
	icmp.type = ICMP_DEST_UNREACH;
	icmp.code = ICMP_PORT_UNREACH;
	icmp.checksum = csum_fold32((__u32)bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), (__u32)sum));
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + ETH_HLEN + sizeof(ip) + sizeof(icmp) > data_end)
		return DROP_INVALID;
	__builtin_memcpy(data, eth, ETH_HLEN);
	__builtin_memcpy(data + ETH_HLEN, &ip, sizeof(ip));
	__builtin_memcpy(data + ETH_HLEN + sizeof(ip), &icmp, sizeof(icmp));
	return 0;
}

/* lb4_no_service() in XDP: the answer goes back out of the device the frame
 * came in on (Cilium's ctx_redirect to the ingress ifindex: XDP_TX). The XDP
 * verdict. */
static __always_inline int xdp_no_service(struct xdp_md *ctx, const struct pkt4 *p, struct trace_event *ev)
{
#ifdef SERVICE_NO_BACKEND_RESPONSE
	int ret = xdp_no_service_reply(ctx, p);

	if (ret < 0) {
		trace_emit(ev, VERDICT_DROPPED, ret);
		return XDP_DROP;
	}
	lb4_no_service_answered(ev, p);
	return XDP_TX;
#else
	trace_emit(ev, VERDICT_DROPPED, DROP_NO_SERVICE);
	return XDP_DROP;
#endif
}

/* nodeport_lb4() in XDP: the same decisions and state, the frame rewritten in
 * place. NP_PASS, NP_LOCAL, NP_FORWARD or a DROP_* reason. */
static __always_inline int nodeport_lb4_xdp(struct xdp_md *ctx, struct pkt4 *p, struct trace_event *ev)
{
	struct ct_state st = {};
	struct lb4_backend *backend;
	struct lb4_service *svc;
	__be32 vip = p->daddr, addr = 0;
	__be16 vport = p->dport, port = 0;
	__u32 len = xdp_len(ctx);
	bool local, dsr;
	__u8 scope;
	int ret;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return NP_PASS;
	svc = lb4_lookup_frontend(p, false, &scope);
	if (!svc || !(svc->flags & SVC_FLAG_ROUTABLE))
		return NP_PASS;
	ret = __lb4_local(&len, p, svc, scope, &st, &backend, true);
	if (ret < 0)
		return ret;
	ev->svc_ct_result = ret;
	ret = xdp_rewrite4(ctx, p, true, backend->address, backend->port);
	if (ret < 0)
		return ret;
	local = lookup_endpoint4(p->daddr) != NULL;
	dsr = !local && nodeport_uses_dsr(p->proto);
	if (!dsr) {
		ret = nodeport_track4_xdp(len, p, svc, local, ev);
		if (ret < 0)
			return ret;
	}
	if (!local) {
		ret = 0;
		if (!dsr && !lab_fault(FAULT_NO_SNAT)) {
			ret = snat_v4_nodeport_xdp(p, &addr, &port);
			if (ret == 0)
				ret = xdp_rewrite4(ctx, p, false, addr, port);
			ev->flags |= TRACE_F_SNAT;
		} else if (dsr && (p->proto == IPPROTO_UDP ||
				   (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)) {
			ret = xdp_dsr_add_opt4(ctx, p, vip, vport);
			ev->flags |= TRACE_F_DSR_OPT_ADDED;
		}
		if (ret < 0)
			return ret;
	}
	trace_tuple_set(&ev->after, p);
	return local ? NP_LOCAL : NP_FORWARD;
}

#endif /* LABKIT_NODEPORT_XDP_H */
