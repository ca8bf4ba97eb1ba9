/* bpf_host.c — the programs on a node's uplink (eth0, Cilium's "native
 * device").
 *
 *   cil_from_netdev  tc ingress: everything arriving from the fabric.
 *                    Malformed headers and IP fragments are dropped here;
 *                    VXLAN packets are reported with their inner packet;
 *                    replies to SNATed NodePort flows are translated back
 *                    and returned to the client; the DSR option is read on
 *                    the backend's node; packets to NodePort and
 *                    LoadBalancer frontends are load-balanced (nodeport.h).
 *   cil_to_netdev    tc egress: everything the node sends to the fabric.
 *                    Replies to outside clients leave with the frontend as
 *                    their source.
 *
 * With --nodeport-accel xdp, bpf_xdp.c's cil_xdp_entry runs on eth0 first
 * and load-balances ext's requests before they reach cil_from_netdev.
 *
 * Pod-to-pod traffic needs no state here (Cilium tracks it at the pods).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/nodeport.h"
#include "lib/trace.h"
#include "lib/hook.h"
#ifdef ENABLE_NODEPORT_ACCELERATION
#include "lib/xdp.h"
#endif

/* A VXLAN packet between nodes: report it with its inner packet and let it
 * pass (cilium_vxlan's hooks see the inner packet). False if it is not one. */
static __always_inline bool trace_vxlan(struct __sk_buff *skb, const struct pkt4 *p, struct trace_event *ev,
					__be32 peer)
{
	struct pkt4 inner = {};

	if (parse_vxlan_inner(skb, p, &inner) != 0)
		return false;
	trace_tuple_set(&ev->inner, &inner);
	ev->tunnel_endpoint = peer;
	trace_emit(ev, VERDICT_FORWARDED, 0);
	return true;
}

int cil_from_netdev(struct __sk_buff *skb)
{
	struct trace_event ev = {};
	struct pkt4 p = {};
	int ret;

	ret = hook_start(skb, HOOK_FROM_NETDEV, &p, &ev, true);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (ret < 0)
		goto drop;
	if (trace_vxlan(skb, &p, &ev, p.saddr))
		return TC_ACT_OK;

	ret = nodeport_rev_snat4(skb, &p, &ev);
	if (ret < 0)
		goto drop;
	if (ret == NP_FORWARD)
		return nodeport_fwd(skb, &p, &ev);

	ret = nodeport_dsr_ingress4(skb, &p, &ev);
	if (ret < 0)
		goto drop;
	if (ret > 0) {
		trace_tuple_set(&ev.after, &p);
		return hook_forward(&ev);
	}

#ifdef ENABLE_NODEPORT_ACCELERATION
	/* cil_xdp_entry already looked: no frontend (XFER_PKT_NO_SVC). */
	if (skb_xfer_no_svc(skb))
		return hook_forward(&ev);
#endif
	ret = nodeport_lb4(skb, &p, &ev);
	if (ret == DROP_NO_SERVICE)
		return lb4_no_service(skb, &p, &ev, false);
	if (ret < 0)
		goto drop;
	if (ret == NP_FORWARD)
		return nodeport_fwd(skb, &p, &ev);
	return hook_forward(&ev);
drop:
	return hook_drop(&ev, ret);
}

int cil_to_netdev(struct __sk_buff *skb)
{
	struct trace_event ev = {};
	struct pkt4 p = {};
	int ret;

	ret = hook_start(skb, HOOK_TO_NETDEV, &p, &ev, false);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (ret < 0) {
		/* The node's own malformed packet is the kernel's to judge: report, then pass. */
		trace_emit(&ev, VERDICT_FORWARDED, ret);
		return TC_ACT_OK;
	}
	if (trace_vxlan(skb, &p, &ev, p.daddr))
		return TC_ACT_OK;
	/* The fault: the node has no route for its pods' traffic to another node. */
	if (lab_fault(FAULT_NO_FIB) && lookup_endpoint4(p.saddr) && !lookup_endpoint4(p.daddr))
		return hook_drop(&ev, DROP_NO_FIB);
	if (!p.is_frag) {
		ret = nodeport_rev_egress4(skb, &p, &ev);
		if (ret < 0)
			return hook_drop(&ev, ret);
		trace_tuple_set(&ev.after, &p);
	}
	return hook_forward(&ev);
}
