/* bpf_lxc.c — the programs on a pod's host-side veth (lxc-<pod>).
 *
 *   cil_from_container  tc ingress: packets the pod sends. Service load
 *                       balancing (SVC entry, backend choice, DNAT, hairpin
 *                       SNAT), then the egress CT lookup (OUT rows, replies
 *                       of IN rows), with ENABLE_POLICY the pod's egress
 *                       policy, then in tunnel mode encapsulation towards
 *                       the destination's node.
 *   cil_to_container    tc egress: packets the node delivers to the pod.
 *                       Ingress CT lookup (IN rows, replies of OUT rows),
 *                       with ENABLE_POLICY the pod's ingress policy, and
 *                       reverse NAT of Service replies.
 *
 * Cilium does the to-container work in the endpoint's policy program,
 * tail-called from from-overlay/from-netdev; labkit lets the node's kernel
 * route to the veth and runs it here (LAB_DIFFERENCES in labkit/config.py).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/conntrack.h"
#include "lib/lb.h"
#include "lib/nodeport.h" /* ipv4_dec_ttl: a hairpin reply's local delivery */
#include "lib/encap.h"
#include "lib/trace.h"
#include "lib/hook.h"
#ifdef ENABLE_POLICY
#include "lib/policy.h"
#endif

/* Per-packet load balancing of a packet to a Service. Returns 0 (not a
 * service, or translated), or a DROP_* reason. On translation *rev_nat and
 * *loopback tell the egress CT entry what to carry. */
static __always_inline int lb4_from_container(struct __sk_buff *skb, struct pkt4 *p, struct trace_event *ev,
					      __be16 *rev_nat, bool *loopback)
{
	struct lb4_backend *backend;
	struct lb4_service *svc;
	struct ct_state st = {};
	__u8 scope;
	int ret;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	svc = lb4_lookup_frontend(p, true, &scope);
	if (!svc)
		return 0;
	ret = lb4_local(skb, p, svc, scope, &st, &backend);
	if (ret < 0)
		return ret;
	ev->svc_ct_result = ret;
	*rev_nat = svc->rev_nat_index;
	/* Hairpin: the pod reached itself. Without a different source, Linux
	 * would drop the packet as a martian and the reply would skip reverse
	 * NAT, so the source becomes the service loopback address. */
	if (backend->address == p->saddr && !lab_fault(FAULT_NO_LOOPBACK_SNAT)) {
		ret = lb4_rewrite(skb, p, false, LB_LOOPBACK_IPV4, p->sport);
		if (ret < 0)
			return ret;
		*loopback = true;
	}
	ret = lb4_rewrite(skb, p, true, backend->address, backend->port);
	if (ret < 0)
		return ret;
	trace_tuple_set(&ev->after, p);
	return 0;
}

/* The reply of a hairpin flow at the pod's ingress: v1.16 ipv4_policy
 * reverse-NATs it with the OUT entry's loopback flag (bpf_lxc.c:1870-1885,
 * lb.h __lb4_rev_nat:1065-1085@82999990): the source becomes the service
 * again, and the destination, the loopback address, becomes the pod itself
 * (the reply's own source: client and backend are one). */
static __always_inline int lb4_rev_nat_loopback(struct __sk_buff *skb, struct pkt4 *p, __be16 rev_nat_index)
{
	struct lb4_reverse_nat *nat = cilium_lb4_reverse_nat.lookup(&rev_nat_index);
	__be32 own = p->saddr;
	int ret;

	if (!nat)
		return 0;
	ret = lb4_rewrite(skb, p, true, own, p->dport);
	if (ret < 0)
		return ret;
	return lb4_rewrite(skb, p, false, nat->address, nat->port);
}

/* The reply of a hairpin flow at from-container: v1.16 handle_ipv4_from_lxc
 * delivers it, untranslated, to the endpoint its source names (hairpin_flow:
 * "Loopback replies are addressed to IPV4_LOOPBACK", bpf_lxc.c:1106-1119@82999990)
 * through ipv4_local_delivery: ipv4_l3 (the TTL, the node's and the pod's MACs,
 * l3.h:52-69, 156-175) and then the pod's ingress program. Here that program
 * is cil_to_container, on the egress of the same host veth. */
static __always_inline int lb4_hairpin_reply(struct __sk_buff *skb, struct pkt4 *p, const struct endpoint_info *ep)
{
	__u64 macs[2];
	int ret = ipv4_dec_ttl(skb, p);

	if (ret < 0)
		return ret;
	macs[0] = ep->mac;      /* destination: the pod */
	macs[1] = ep->node_mac; /* source: its gateway, the host veth */
	if (bpf_skb_store_bytes(skb, 0, &macs[0], 6, 0) < 0 || bpf_skb_store_bytes(skb, 6, &macs[1], 6, 0) < 0)
		return DROP_WRITE_ERROR;
	return 0;
}

int cil_from_container(struct __sk_buff *skb)
{
	struct ipv4_ct_tuple tuple = {};
	struct trace_event ev = {};
	struct ct_state st = {};
	struct endpoint_info *ep;
	struct pkt4 p = {};
	__be16 rev_nat = 0;
	bool loopback = false;
	__u32 identity;
	int ret;

	ret = hook_start(skb, HOOK_FROM_CONTAINER, &p, &ev, true);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (ret < 0)
		goto drop;
	/* Only the pod's own address may leave its veth. */
	ep = lookup_endpoint4(p.saddr);
	if (!ep) {
		ret = DROP_INVALID_SIP;
		goto drop;
	}
	identity = ep->sec_id;
	ev.identity = identity;

	ret = lb4_from_container(skb, &p, &ev, &rev_nat, &loopback);
	if (ret == DROP_NO_SERVICE)
		return lb4_no_service(skb, &p, &ev, true);
	if (ret < 0)
		goto drop;

	ret = ct_lookup4(&tuple, &p, skb->len, CT_EGRESS, &st);
	if (ret < 0)
		goto drop;
#ifdef ENABLE_POLICY
	__u16 proxy_port = 0;

	/* v1.16 handle_ipv4_from_lxc: new and established packets must match
	 * the pod's egress policy on the destination's identity after the
	 * Service DNAT; replies and related packets skip it, and so does a
	 * hairpin flow (the pod reaching itself through a Service). A denied
	 * packet creates no CT entry. */
	if ((ret == CT_NEW || ret == CT_ESTABLISHED) && !loopback) {
		int verdict = policy_verdict4(&ev, ep->lxc_id, policy_peer_id4(p.daddr), CT_EGRESS, &p, skb->len,
					      ret, &proxy_port);

		if (verdict < 0) {
			trace_ct(&ev, CT_EGRESS, ret, &st);
			ret = verdict;
			goto drop;
		}
	}
#endif
	if (ret == CT_NEW && !lab_fault(FAULT_NO_OUT_ENTRY)) {
		st.src_sec_id = identity;
		st.rev_nat_index = rev_nat;
		st.flags = loopback ? CT_F_LB_LOOPBACK : 0;
		int err = ct_create4(&tuple, skb->len, CT_EGRESS, &st, true);
		if (err < 0) {
			ret = err;
			goto drop;
		}
	}
	trace_ct(&ev, CT_EGRESS, ret, &st);
#ifdef ENABLE_POLICY
	/* v1.16 handle_ipv4_from_lxc: an allowed packet whose policy entry
	 * names a proxy port goes to the proxy (ctx_redirect_to_proxy4), after
	 * its CT entry exists: the proxy's answer, sent from the original
	 * destination's address, is then this entry's reply and passes the
	 * pod's ingress without a policy lookup. */
	if (proxy_port) {
		ret = proxy_assign_udp4(skb, &p, proxy_port);
		if (ret < 0)
			goto drop;
		/* v1.16 handle_ipv4_from_lxc: TRACE_TO_PROXY before the redirect */
		trace_emit_at(&ev, VERDICT_FORWARDED, 0, OBS_TO_PROXY);
		return TC_ACT_OK;
	}
#endif
	if (ret == CT_REPLY && (st.flags & CT_F_LB_LOOPBACK)) {
		/* The reply of a hairpin flow goes back to the pod itself, to
		 * be reverse-NATed at its ingress (lb4_hairpin_reply above). */
		ret = lb4_hairpin_reply(skb, &p, ep);
		if (ret < 0)
			goto drop;
		trace_emit_at(&ev, VERDICT_FORWARDED, 0, OBS_FROM_LXC);
		return bpf_redirect(skb->ifindex, 0);
	}

#ifdef ROUTING_TUNNEL
	/* The reply of a NodePort flow this node load-balanced to this pod, for
	 * a client behind the tunnel (a pod of another node that reached this
	 * node's address:nodePort): the tunnel takes it past to-netdev, so its
	 * source goes back to the frontend here. Cilium's bpf_lxc does this for
	 * every node_port reply (its tail call to IPV4_NODEPORT_REVNAT,
	 * bpf_lxc.c:1031-1037 at v1.16.0); labkit leaves the others to to-netdev. */
	if (ret == CT_REPLY && (st.flags & CT_F_NODE_PORT)) {
		struct remote_endpoint_info *peer = ipcache_lookup4(p.daddr);

		if (peer && peer->tunnel_endpoint) {
			ret = nodeport_rev_egress4(skb, &p, &ev);
			if (ret < 0)
				goto drop;
			trace_tuple_set(&ev.after, &p);
		}
	}
	ret = tunnel_key_set4(skb, p.daddr, identity, &ev);
	if (ret < 0)
		goto drop;
	if (ret == 0) {
		trace_emit(&ev, VERDICT_REDIRECTED, 0);
		return bpf_redirect(VXLAN_IFINDEX, 0);
	}
#endif
	/* A pod of this node (hairpin flows too). v1.16 handle_ipv4_from_lxc
	 * hands it to ipv4_local_delivery, and the destination's policy
	 * program sends the one TRACE_TO_LXC: here the node's stack routes it
	 * to that pod's veth, where cil_to_container writes the to-endpoint
	 * record. This record is the from-endpoint trace cil_from_container
	 * sends as the packet enters (TRACE_FROM_LXC): no to-stack. */
	if (lookup_endpoint4(p.daddr)) {
		trace_emit_at(&ev, VERDICT_FORWARDED, 0, OBS_FROM_LXC);
		return TC_ACT_OK;
	}
	return hook_forward(&ev);
drop:
	return hook_drop(&ev, ret);
}

int cil_to_container(struct __sk_buff *skb)
{
	struct ipv4_ct_tuple tuple = {};
	struct trace_event ev = {};
	struct ct_state st = {};
	struct pkt4 p = {};
	bool from_tunnel;
	int ret;

	ret = hook_start(skb, HOOK_TO_CONTAINER, &p, &ev, true);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (ret < 0)
		goto drop;
	ev.identity = ipcache_identity4(p.saddr);

	/* Cilium's from-overlay tells the endpoint's program the packet came
	 * through the tunnel (CB_FROM_TUNNEL); here the kernel routes between the
	 * two hooks, so bpf_overlay.c marks the packet instead. */
	from_tunnel = (skb->mark & MARK_FROM_OVERLAY) == MARK_FROM_OVERLAY;
	if (from_tunnel)
		skb->mark &= ~MARK_FROM_OVERLAY;

	ret = ct_lookup4(&tuple, &p, skb->len, CT_INGRESS, &st);
	if (ret < 0)
		goto drop;
#ifdef ENABLE_POLICY
	/* v1.16 ipv4_policy: new and established packets must match the pod's
	 * ingress policy on the source's identity; replies and related packets
	 * skip it, and so does a hairpin flow: the first packet from the
	 * loopback address with an LBLoopback OUT entry, then its IN entry's
	 * LBLoopback flag. */
	if (ret == CT_NEW || ret == CT_ESTABLISHED) {
		struct endpoint_info *dst_ep = lookup_endpoint4(p.daddr);
		__be16 unused;
		bool hairpin;

		if (ret == CT_NEW)
			hairpin = p.saddr == LB_LOOPBACK_IPV4 && ct_has_loopback_egress_entry4(&tuple, &unused);
		else
			hairpin = (st.flags & CT_F_LB_LOOPBACK) != 0;

		if (dst_ep && !hairpin) {
			__u16 unused_proxy;
			int verdict = policy_verdict4(&ev, dst_ep->lxc_id, policy_peer_id4(p.saddr), CT_INGRESS, &p,
						      skb->len, ret, &unused_proxy);

			if (verdict < 0) {
				trace_ct(&ev, CT_INGRESS, ret, &st);
				ret = verdict;
				goto drop;
			}
		}
	}
#endif
	if (ret == CT_NEW && !lab_fault(FAULT_NO_IN_ENTRY)) {
		__be16 loopback_rev_nat = 0;

		st.src_sec_id = ev.identity;
		st.flags = from_tunnel ? CT_F_FROM_TUNNEL : 0;
		st.rev_nat_index = 0;
		if (ct_has_loopback_egress_entry4(&tuple, &loopback_rev_nat)) {
			/* A hairpin flow looping back into its pod. Cilium hands it
			 * back to the endpoint with the pod's own identity as the
			 * source (ipv4_local_delivery with SECLABEL). */
			struct endpoint_info *self = lookup_endpoint4(p.daddr);

			if (self)
				st.src_sec_id = self->sec_id;
			st.flags |= CT_F_LB_LOOPBACK;
#ifndef CILIUM_HAIRPIN_IN_NO_REVNAT
			/* v1.16 still copies the OUT entry's RevNAT, for downgrades
			 * (cilium/cilium#32480; dropped in 1.17). */
			st.rev_nat_index = loopback_rev_nat;
#endif
		}
		int err = ct_create4(&tuple, skb->len, CT_INGRESS, &st, true);
		if (err < 0) {
			ret = err;
			goto drop;
		}
	}
	trace_ct(&ev, CT_INGRESS, ret, &st);
	if (ret == CT_REPLY && st.rev_nat_index && !lab_fault(FAULT_SKIP_REV_NAT)) {
		if (st.flags & CT_F_LB_LOOPBACK)
			ret = lb4_rev_nat_loopback(skb, &p, st.rev_nat_index);
		else
			ret = lb4_rev_nat(skb, &p, st.rev_nat_index);
		if (ret < 0)
			goto drop;
		trace_tuple_set(&ev.after, &p);
	}
	return hook_forward(&ev);
drop:
	return hook_drop(&ev, ret);
}
