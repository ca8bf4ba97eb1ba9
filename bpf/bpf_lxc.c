/* bpf_lxc.c — the programs on a pod's host-side veth (lxc-<pod>).
 *
 *   cil_from_container  tc ingress: packets the pod sends. Egress CT lookup
 *                       (OUT rows, replies of IN rows), then in tunnel mode
 *                       encapsulation towards the destination's node.
 *   cil_to_container    tc egress: packets the node delivers to the pod.
 *                       Ingress CT lookup (IN rows, replies of OUT rows).
 *
 * Cilium does the to-container work in the endpoint's policy program,
 * tail-called from from-overlay/from-netdev; labkit lets the node's kernel
 * route to the veth and runs it here (LAB_DIFFERENCES in labkit/config.py).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/conntrack.h"
#include "lib/encap.h"
#include "lib/trace.h"

int cil_from_container(struct __sk_buff *skb)
{
	struct ipv4_ct_tuple tuple = {};
	struct trace_event ev = {};
	struct ct_state st = {};
	struct endpoint_info *ep;
	struct pkt4 p = {};
	__u32 identity;
	int ret;

	ret = parse_eth_ipv4(skb, &p);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	trace_init(&ev, skb, HOOK_FROM_CONTAINER, &p);
	if (ret < 0)
		goto drop;
	if (p.is_frag) {
		ret = DROP_FRAG_NOSUPPORT;
		goto drop;
	}
	/* Only the pod's own address may leave its veth. */
	ep = lookup_endpoint4(p.saddr);
	if (!ep) {
		ret = DROP_INVALID_SIP;
		goto drop;
	}
	identity = ep->sec_id;
	ev.identity = identity;

	ret = ct_lookup4(&tuple, &p, skb->len, CT_EGRESS, &st);
	if (ret < 0)
		goto drop;
	if (ret == CT_NEW) {
		st.src_sec_id = identity;
		int err = ct_create4(&tuple, skb->len, CT_EGRESS, &st);
		if (err < 0) {
			ret = err;
			goto drop;
		}
	}
	trace_ct(&ev, CT_EGRESS, ret, &st);

#ifdef ROUTING_TUNNEL
	ret = tunnel_key_set4(skb, p.daddr, identity, &ev);
	if (ret < 0)
		goto drop;
	if (ret == 0) {
		trace_emit(&ev, VERDICT_REDIRECTED, 0);
		return bpf_redirect(VXLAN_IFINDEX, 0);
	}
#endif
	trace_emit(&ev, VERDICT_FORWARDED, 0);
	return TC_ACT_OK;
drop:
	trace_emit(&ev, VERDICT_DROPPED, ret);
	return TC_ACT_SHOT;
}

int cil_to_container(struct __sk_buff *skb)
{
	struct ipv4_ct_tuple tuple = {};
	struct trace_event ev = {};
	struct ct_state st = {};
	struct pkt4 p = {};
	int ret;

	ret = parse_eth_ipv4(skb, &p);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	trace_init(&ev, skb, HOOK_TO_CONTAINER, &p);
	if (ret < 0)
		goto drop;
	if (p.is_frag) {
		ret = DROP_FRAG_NOSUPPORT;
		goto drop;
	}
	ev.identity = ipcache_identity4(p.saddr);

	ret = ct_lookup4(&tuple, &p, skb->len, CT_INGRESS, &st);
	if (ret < 0)
		goto drop;
	if (ret == CT_NEW && !lab_fault(FAULT_NO_IN_ENTRY)) {
		st.src_sec_id = ev.identity;
		int err = ct_create4(&tuple, skb->len, CT_INGRESS, &st);
		if (err < 0) {
			ret = err;
			goto drop;
		}
	}
	trace_ct(&ev, CT_INGRESS, ret, &st);
	trace_emit(&ev, VERDICT_FORWARDED, 0);
	return TC_ACT_OK;
drop:
	trace_emit(&ev, VERDICT_DROPPED, ret);
	return TC_ACT_SHOT;
}
