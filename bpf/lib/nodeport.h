/* nodeport.h — Services reached from outside the cluster (Cilium's
 * lib/nodeport.h): NodePort frontends on node addresses and LoadBalancer
 * VIPs, handled on the node's uplink.
 *
 * On the node a client's packet reaches (from-netdev):
 *   - lookup of a routable frontend, SVC entry, backend by Maglev or random,
 *     DNAT;
 *   - a backend on this node: OUT entry (NodePort) and the IN entry its pod's
 *     hooks find, then the kernel delivers it;
 *   - a remote backend in dsr mode: the frontend goes along in the IPv4
 *     option and the backend's node answers the client itself, so this node
 *     keeps no state beyond the SVC entry;
 *   - a remote backend in snat mode: OUT entry (NodePort), SNAT to this node's
 *     address through the NAT map, and the reply comes back here.
 * On the backend's node: the DSR option becomes an OUT entry with
 * DSRInternal and a NAT entry, and at to-netdev the reply leaves with the
 * frontend as its source.
 *
 * Build macros: LB_MODE, NODE_IP, NATIVE_DEV_IFINDEX (labkit/datapath/source.py).
 */
#ifndef LABKIT_NODEPORT_H
#define LABKIT_NODEPORT_H

#include "conntrack.h"
#include "lb.h"
#include "nat.h"
#include "dsr.h"
#include "encap.h"
#include "trace.h"

/* --bpf-lb-mode */
#define LB_MODE_SNAT   0
#define LB_MODE_DSR    1
#define LB_MODE_HYBRID 2 /* DSR for TCP, SNAT for UDP */
#ifndef LB_MODE
#define LB_MODE LB_MODE_DSR
#endif
#ifndef NATIVE_DEV_IFINDEX
#define NATIVE_DEV_IFINDEX 0 /* eth0 of this node (a build macro) */
#endif

/* bpf_redirect_neigh() with the kernel's four arguments (BCC 0.26 declares three). */
static long (*lk_redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

/* What nodeport_lb4 and nodeport_rev_snat4 decided. */
#define NP_PASS    0 /* not a frontend / not ours: the kernel's business */
#define NP_LOCAL   1 /* translated for a pod on this node: let the kernel deliver it */
#define NP_FORWARD 2 /* translated: send it to the fabric with nodeport_fwd() */

static __always_inline bool nodeport_uses_dsr(__u8 proto)
{
	return LB_MODE == LB_MODE_DSR || (LB_MODE == LB_MODE_HYBRID && proto == IPPROTO_TCP);
}

/* The OUT entry a reply from a backend belongs to: NodePort (this node
 * load-balanced the flow) or DSRInternal (another node did, in dsr mode). The
 * client is the reply's destination, so the reply's own tuple is the entry's
 * key (Cilium's CT_INGRESS lookup in SCOPE_REVERSE); the packet counts as the
 * entry's ingress. CT_REPLY, or CT_NEW when there is none. */
static __always_inline int ct_lookup_nodeport_reply4(struct ipv4_ct_tuple *tuple, const struct pkt4 *p, __u32 len,
						     struct ct_state *st)
{
	struct ct_entry *entry;
	int action = ACTION_UNSPEC;

	tuple->daddr = p->daddr;
	tuple->saddr = p->saddr;
	tuple->dport = p->sport;
	tuple->sport = p->dport;
	tuple->nexthdr = p->proto;
	tuple->flags = TUPLE_F_OUT;
	entry = ct_map_lookup(tuple);
	if (!entry || !(entry->flags & (CT_F_NODE_PORT | CT_F_DSR_INTERNAL)))
		return CT_NEW;
	if (p->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN))
		action = ACTION_CLOSE;
	return __ct_lookup4(tuple, action, CT_INGRESS, p->tcp_flags, len, lab_now(), st) == CT_ESTABLISHED ?
		       CT_REPLY : CT_NEW;
}

/* The node forwards the packet itself, so it does the router's part: the TTL
 * goes down by one, and a packet whose TTL would reach 0 is DROP_TTL_EXCEEDED
 * (Cilium's ipv4_l3 → ipv4_dec_ttl, in fib_redirect_v4 and on the NodePort
 * SNAT and reverse-DNAT paths). The TTL shares a 16-bit word with the
 * protocol, so the IP checksum is fixed by that word. 0 or a DROP_* reason. */
static __always_inline int ipv4_dec_ttl(struct __sk_buff *skb, const struct pkt4 *p)
{
	__u32 off = p->l3_off + offsetof(struct iphdr, ttl);
	__u8 word[2], old[2];

	if (bpf_skb_load_bytes(skb, off, word, 2) < 0)
		return DROP_INVALID;
	if (word[0] <= 1)
		return DROP_TTL_EXCEEDED;
	old[0] = word[0];
	old[1] = word[1];
	word[0]--;
	if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), *(__u16 *)old, *(__u16 *)word,
				2) < 0)
		return DROP_CSUM_L3;
	if (bpf_skb_store_bytes(skb, off, word, 1, 0) < 0)
		return DROP_WRITE_ERROR;
	return 0;
}

/* Send a packet this node translated on to the fabric: into the tunnel when
 * its destination is a pod behind one, else out of eth0 to the next hop the
 * routing table gives, MACs from the neighbour table (Cilium's fib redirect).
 * Either way the node routed it: its TTL goes down first. */
static __always_inline int nodeport_fwd(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev)
{
	int ret = ipv4_dec_ttl(skb, p);

	if (ret < 0) {
		trace_emit(ev, VERDICT_DROPPED, ret);
		return TC_ACT_SHOT;
	}
#ifdef ROUTING_TUNNEL
	ret = tunnel_key_set4(skb, p->daddr, IDENTITY_WORLD, ev);

	if (ret < 0) {
		trace_emit(ev, VERDICT_DROPPED, ret);
		return TC_ACT_SHOT;
	}
	if (ret == 0) {
		trace_emit(ev, VERDICT_REDIRECTED, 0);
		return bpf_redirect(VXLAN_IFINDEX, 0);
	}
#endif
	trace_emit(ev, VERDICT_REDIRECTED, 0);
	return lk_redirect_neigh(NATIVE_DEV_IFINDEX, NULL, 0, 0);
}

/* A packet from outside to a NodePort or LoadBalancer frontend. Returns
 * NP_PASS, NP_LOCAL, NP_FORWARD, or a DROP_* reason. */
static __always_inline int nodeport_lb4(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev)
{
	struct ipv4_ct_tuple tuple = {};
	struct ct_state st = {}, cst = {};
	struct lb4_backend *backend;
	struct lb4_service *svc;
	__be32 vip = p->daddr;
	__be16 vport = p->dport;
	bool local, dsr;
	__u8 scope;
	int ret;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return NP_PASS;
	svc = lb4_lookup_frontend(p, false, &scope);
	if (!svc || !(svc->flags & SVC_FLAG_ROUTABLE))
		return NP_PASS; /* a ClusterIP is not reachable from outside */
	ret = lb4_local_nodeport(skb, p, svc, scope, &st, &backend);
	if (ret < 0)
		return ret;
	ev->svc_ct_result = ret;
	ret = lb4_rewrite(skb, p, true, backend->address, backend->port);
	if (ret < 0)
		return ret;
	local = lookup_endpoint4(p->daddr) != NULL;
	dsr = !local && nodeport_uses_dsr(p->proto);
	if (!dsr) {
		/* The replies pass this node again: track the flow. */
		ret = ct_lookup4(&tuple, p, skb->len, CT_EGRESS, &cst);
		if (ret < 0)
			return ret;
		if (ret == CT_NEW) {
			cst.src_sec_id = IDENTITY_WORLD;
			cst.rev_nat_index = svc->rev_nat_index;
			cst.flags = CT_F_NODE_PORT;
			/* No RELATED twin: Cilium's nodeport_lb4 passes no related map. */
			ret = ct_create4(&tuple, skb->len, CT_EGRESS, &cst, false);
			if (ret < 0)
				return ret;
			if (local) {
				/* The entry the pod's hooks find; reverse NAT is
				 * done at to-netdev, not by the pod's hooks. */
				struct ct_state in = cst;

				in.rev_nat_index = 0;
				tuple.flags = TUPLE_F_IN;
				ret = ct_create4(&tuple, skb->len, CT_INGRESS, &in, true);
				if (ret < 0)
					return ret;
			}
			ret = CT_NEW;
		}
		trace_ct(ev, CT_EGRESS, ret, &cst);
	}
	if (!local) {
		if (!dsr) {
			if (lab_fault(FAULT_NO_SNAT))
				ret = 0;
			else
				ret = snat_v4_nodeport(skb, p);
			ev->flags |= lab_fault(FAULT_NO_SNAT) ? 0 : TRACE_F_SNAT;
		} else if (p->proto == IPPROTO_UDP || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
			ret = dsr_add_opt4(skb, p, vip, vport);
			ev->flags |= TRACE_F_DSR_OPT_ADDED;
		}
		if (ret < 0)
			return ret;
	}
	trace_tuple_set(&ev->after, p);
	return local ? NP_LOCAL : NP_FORWARD;
}

/* snat mode, on the node that load-balanced: a reply to its own address from
 * a backend. Destination back to the client (NAT map), source back to the
 * frontend (the OUT entry's reverse NAT). NP_PASS if it is not one. */
static __always_inline int nodeport_rev_snat4(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev)
{
	struct ipv4_ct_tuple tuple = {};
	struct ct_state st = {};
	int ret;

	if (p->daddr != NODE_IP || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return NP_PASS;
	ret = nat_apply4(skb, p, NAT_DIR_INGRESS);
	if (ret <= 0)
		return ret;
	ev->flags |= TRACE_F_REV_SNAT;
	if (ct_lookup_nodeport_reply4(&tuple, p, skb->len, &st) == CT_REPLY) {
		trace_ct(ev, CT_INGRESS, CT_REPLY, &st);
		if (st.rev_nat_index) {
			ret = lb4_rev_nat(skb, p, st.rev_nat_index);
			if (ret < 0)
				return ret;
		}
	}
	trace_tuple_set(&ev->after, p);
	return NP_FORWARD;
}

/* On the backend's node, a packet from the fabric to a local pod (Cilium's
 * nodeport_dsr_ingress_ipv4). The DSR entry is an OUT entry keyed as a client
 * on this node would key one, {daddr=client, saddr=backend, dport=backend
 * port, sport=client port}, printed `OUT client -> backend [ DSRInternal ]`:
 * the packet carrying the DSR option creates it with a NAT entry that holds
 * the frontend; every later packet of the flow refreshes it as its egress (the
 * reply, at to-netdev, as its ingress). It gets no RELATED twin; the pod's own
 * hooks then create their ordinary IN entry. The option is removed. Returns 1
 * when an option was handled, 0 otherwise, or a DROP_* reason. */
static __always_inline int nodeport_dsr_ingress4(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev)
{
	bool has_opt = p->l4_off != p->l3_off + IPV4_HLEN;
	struct ipv4_ct_tuple tuple = {};
	struct ct_state st = {};
	int action = ACTION_UNSPEC, ret;
	__be32 addr = 0;
	__be16 port = 0;

	if (p->is_frag || !lookup_endpoint4(p->daddr))
		return 0;
	if (has_opt) {
		ret = dsr_parse_opt4(skb, p, &addr, &port);
		if (ret <= 0)
			return ret;
		if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
			return DROP_INVALID;
	} else if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP) {
		return 0;
	}
	tuple.daddr = p->saddr;
	tuple.saddr = p->daddr;
	tuple.dport = p->dport;
	tuple.sport = p->sport;
	tuple.nexthdr = p->proto;
	tuple.flags = TUPLE_F_OUT;
	if (p->proto == IPPROTO_UDP || ((p->tcp_flags & TCP_FLAG_SYN) && !(p->tcp_flags & TCP_FLAG_ACK)))
		action = ACTION_CREATE;
	if (p->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN))
		action = ACTION_CLOSE;
	/* Only a DSR entry may be refreshed here: a miss without the option is
	 * an ordinary packet for the pod's hooks. */
	struct ct_entry *entry = ct_map_lookup(&tuple);

	if (entry && !(entry->flags & CT_F_DSR_INTERNAL))
		entry = NULL;
	if (!entry && !has_opt)
		return 0;
	ret = entry ? __ct_lookup4(&tuple, action, CT_EGRESS, p->tcp_flags, skb->len, lab_now(), &st) : CT_NEW;
	/* A TCP SYN with the option on an existing entry is a new connection on
	 * the same ports: start both entries afresh, as Cilium does. */
	if (has_opt && (ret == CT_NEW || (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_FLAG_SYN)))) {
		ret = dsr_nat_create4(p, addr, port);
		if (ret < 0)
			return ret;
		st.src_sec_id = IDENTITY_WORLD;
		st.flags = CT_F_DSR_INTERNAL;
		st.rev_nat_index = 0;
		ret = ct_create4(&tuple, skb->len, CT_EGRESS, &st, false);
		if (ret < 0)
			return ret;
		ret = CT_NEW;
	}
	trace_ct(ev, CT_EGRESS, ret, &st);
	if (!has_opt)
		return 0;
	ret = dsr_strip_opt4(skb, p);
	if (ret < 0)
		return ret;
	ev->flags |= TRACE_F_DSR_OPT_STRIPPED;
	return 1;
}

/* At to-netdev: a reply leaving for an outside client. Its OUT entry says
 * how it goes back: DSRInternal (dsr mode, on the backend's node) — source to
 * the frontend through the NAT map (Cilium's xlate_dsr_v4); NodePort (a local
 * backend of a flow this node load-balanced) — source to the frontend through
 * the entry's reverse NAT. 1 when translated, 0 when not, or a DROP_* reason. */
static __always_inline int nodeport_rev_egress4(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev)
{
	struct ipv4_ct_tuple tuple = {};
	struct ct_state st = {};
	int ret;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	if (ct_lookup_nodeport_reply4(&tuple, p, skb->len, &st) != CT_REPLY)
		return 0;
	trace_ct(ev, CT_INGRESS, CT_REPLY, &st);
	if (st.flags & CT_F_DSR_INTERNAL) {
		ret = lab_fault(FAULT_NO_DSR_SNAT) ? 0 : nat_apply4(skb, p, NAT_DIR_EGRESS);
		if (ret > 0)
			ev->flags |= TRACE_F_SNAT;
		return ret;
	}
	if (!st.rev_nat_index)
		return 0;
	ret = lb4_rev_nat(skb, p, st.rev_nat_index);
	return ret < 0 ? ret : 1;
}

#endif /* LABKIT_NODEPORT_H */
