/* bpf_xdp.c — the XDP program on a node's uplink (eth0), compiled in only
 * with --nodeport-accel xdp (ENABLE_NODEPORT_ACCELERATION; Cilium's
 * --bpf-lb-acceleration=native and its bpf_xdp.c, cil_xdp_entry).
 *
 *   cil_xdp_entry  runs in the driver, before the kernel builds an skb:
 *                  malformed headers and IP fragments are dropped here with
 *                  their DROP_* reasons; a packet from outside to a NodePort
 *                  or LoadBalancer frontend is load-balanced with the same
 *                  maps and the same CT, SVC and NAT rows as cil_from_netdev
 *                  (nodeport.h) and, for a remote backend, sent straight
 *                  back out of eth0 (XDP_TX) — DNATed, and SNATed in snat
 *                  mode or given the DSR option in dsr mode; a service
 *                  without backends is answered with ICMP port unreachable
 *                  (XDP_TX) before any skb exists.
 *                  A local backend's packet is translated and passed up; the
 *                  tc program then sees a packet to a pod, not a frontend, and
 *                  does not load-balance it again. Everything else passes
 *                  with XFER_PKT_NO_SVC in the frame's metadata, so tc skips
 *                  the frontend lookup (Cilium's ctx_set_xfer in nodeport_lb4
 *                  at skip_service_lookup, read by cil_from_netdev).
 *   lab_xdp_pass   not Cilium's: XDP_PASS on the fabric end of the node's
 *                  veth, which takes XDP_TX frames only with an XDP program
 *                  of its own (labkit/datapath/xdp.py).
 *
 * Replies (snat mode's reverse SNAT, DSR on the backend's node) stay with the
 * tc programs: this file handles the client's direction only. Traces: a
 * record (hook xdp) for each packet it drops or translates, none for the
 * packets it passes untouched (Cilium's XDP program sends drop notifications
 * only; labkit also records its translations so the step's path shows them,
 * never marked reported: Hubble sees the drops only, trace.h trace_reported).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/xdp.h"
#include "lib/nodeport_xdp.h"

int cil_xdp_entry(struct xdp_md *ctx)
{
	struct trace_event ev = {};
	struct pkt4 p = {};
	int ret;

	if (lab_fault(FAULT_XDP_PASS))
		return XDP_PASS; /* as with the program detached: tc's from-netdev sees every frame */
	ret = xdp_parse4(ctx, &p);
	if (ret == PARSE_NOT_IPV4)
		return XDP_PASS;
	xdp_trace_init(&ev, ctx, HOOK_XDP, &p);
	if (ret < 0)
		goto drop;
	if (p.is_frag) {
		ret = DROP_FRAG_NOSUPPORT;
		goto drop;
	}
	ret = nodeport_lb4_xdp(ctx, &p, &ev);
	if (ret == DROP_NO_SERVICE)
		return xdp_no_service(ctx, &p, &ev);
	if (ret < 0)
		goto drop;
	if (ret == NP_PASS)
		return xdp_pass_no_svc(ctx);
	if (ret == NP_LOCAL) {
		/* DNATed to a backend on this node: up to the stack, and tc
		 * need not look the service up again (Cilium's nodeport_svc_lb4:
		 * backend_local → XFER_PKT_NO_SVC, CTX_ACT_OK) */
		trace_emit(&ev, VERDICT_FORWARDED, 0);
		return xdp_pass_no_svc(ctx);
	}
	ret = xdp_dec_ttl4(ctx);
	if (ret < 0)
		goto drop;
	ret = xdp_fib_tx(ctx, &p);
	if (ret < 0)
		goto drop;
	trace_emit(&ev, VERDICT_REDIRECTED, 0);
	return ret;
drop:
	trace_emit(&ev, VERDICT_DROPPED, ret);
	return XDP_DROP;
}

int lab_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
