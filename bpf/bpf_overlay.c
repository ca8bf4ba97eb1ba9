/* bpf_overlay.c — the programs on cilium_vxlan, the node's flow-based VXLAN
 * device (tunnel routing mode only).
 *
 *   cil_from_overlay  tc ingress: packets just decapsulated. Their inner
 *                     Ethernet header still carries the sending pod's
 *                     gateway MAC, so mark them for this host before the
 *                     kernel routes them to the pod. A Service request
 *                     another node load-balanced in dsr mode carries the
 *                     DSR option: read and remove it (nodeport.h).
 *   cil_to_overlay    tc egress: packets about to be encapsulated. Those the
 *                     node's own stack routed here carry no tunnel key yet:
 *                     take the endpoint from cilium_ipcache. Cilium's sends
 *                     drop notifications only: its other records are the
 *                     step's path, never reported (trace.h trace_reported).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/encap.h"
#include "lib/nodeport.h"
#include "lib/trace.h"
#include "lib/hook.h"

int cil_from_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct trace_event ev = {};
	struct pkt4 p = {};
	int ret;

	ret = hook_start(skb, HOOK_FROM_OVERLAY, &p, &ev, false);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) == 0) {
		ev.tunnel_endpoint = lk_htonl(key.remote_ipv4);
		ev.identity = key.tunnel_id;
	}
	if (ret < 0)
		goto drop;
	ret = nodeport_dsr_ingress4(skb, &p, &ev);
	if (ret < 0)
		goto drop;
	if (ret > 0)
		trace_tuple_set(&ev.after, &p);
	bpf_skb_change_type(skb, PACKET_HOST);
	skb->mark |= MARK_FROM_OVERLAY; /* for to-container: the IN entry gets FromTunnel */
	return hook_forward(&ev);
drop:
	return hook_drop(&ev, ret);
}

int cil_to_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct trace_event ev = {};
	struct pkt4 p = {};
	int ret;

	ret = hook_start(skb, HOOK_TO_OVERLAY, &p, &ev, false);
	if (ret == PARSE_NOT_IPV4)
		return TC_ACT_OK;
	if (ret < 0)
		goto drop;
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) == 0) {
		ev.tunnel_endpoint = lk_htonl(key.remote_ipv4);
		ev.identity = key.tunnel_id;
	} else {
		ret = tunnel_key_set4(skb, p.daddr, IDENTITY_HOST, &ev);
		if (ret != 0) {
			ret = ret < 0 ? ret : DROP_NO_TUNNEL_ENDPOINT;
			goto drop;
		}
		ev.identity = IDENTITY_HOST;
	}
	return hook_forward(&ev);
drop:
	return hook_drop(&ev, ret);
}
