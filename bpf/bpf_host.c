/* bpf_host.c — the programs on a node's uplink (eth0, Cilium's "native
 * device").
 *
 *   cil_from_netdev  tc ingress: everything arriving from the fabric.
 *   cil_to_netdev    tc egress: everything the node sends to the fabric.
 *
 * Pod-to-pod traffic needs no state here (Cilium tracks it at the pods), so
 * both hooks report the packet, including the inner packet of VXLAN
 * traffic, and hand it to the kernel. NodePort, LoadBalancer and SNAT arrive
 * here in later labs.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/trace.h"

static __always_inline int handle_netdev(struct __sk_buff *skb, __u8 hook)
{
	struct trace_event ev = {};
	struct pkt4 inner = {};
	struct pkt4 p = {};
	int ret;

	ret = parse_eth_ipv4(skb, &p);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	trace_init(&ev, skb, hook, &p);
	if (ret == 0 && parse_vxlan_inner(skb, &p, &inner) == 0) {
		trace_tuple_set(&ev.inner, &inner);
		ev.tunnel_endpoint = hook == HOOK_FROM_NETDEV ? p.saddr : p.daddr;
	}
	/* A malformed header is the kernel's to judge here: report, then pass. */
	trace_emit(&ev, VERDICT_FORWARDED, ret < 0 ? ret : 0);
	return TC_ACT_OK;
}

int cil_from_netdev(struct __sk_buff *skb)
{
	return handle_netdev(skb, HOOK_FROM_NETDEV);
}

int cil_to_netdev(struct __sk_buff *skb)
{
	return handle_netdev(skb, HOOK_TO_NETDEV);
}
