/* hook.h — the skeleton every tc program repeats (Cilium's handle_xgress
 * and send_drop_notify pattern): parse the frame, start its trace record, run
 * the hook's own work, and leave through one of two exits that report the
 * verdict, so every drop reaches the trace with its DROP_* reason.
 *
 *	ret = hook_start(skb, HOOK_FROM_CONTAINER, &p, &ev, true);
 *	if (ret == PARSE_NOT_IPV4)
 *		return TC_ACT_OK;      // ARP, IPv6: not ours, untouched, untraced
 *	if (ret < 0)
 *		goto drop;
 *	...                            // the hook's work; errors: ret = DROP_*; goto drop
 *	return hook_forward(&ev);
 * drop:
 *	return hook_drop(&ev, ret);
 *
 * Redirects stay in the programs: they report VERDICT_REDIRECTED and return
 * what bpf_redirect*() answers.
 */
#ifndef LABKIT_HOOK_H
#define LABKIT_HOOK_H

#include "parse.h"
#include "trace.h"

/* Parse the frame and start its trace record. PARSE_NOT_IPV4 (nothing
 * traced), 0, or the DROP_* reason of a malformed header; with need_ports, a
 * fragment is DROP_FRAG_NOSUPPORT (its ports are unknown or incomplete). */
static __always_inline int hook_start(struct __sk_buff *skb, __u8 hook, struct pkt4 *p, struct trace_event *ev,
				      bool need_ports)
{
	int ret = parse_eth_ipv4(skb, p);

	if (ret == PARSE_NOT_IPV4)
		return ret;
	trace_init(ev, skb, hook, p);
	if (ret < 0)
		return ret;
	if (need_ports && p->is_frag)
		return DROP_FRAG_NOSUPPORT;
	return 0;
}

/* Hand the packet back to the kernel: VERDICT_FORWARDED. */
static __always_inline int hook_forward(struct trace_event *ev)
{
	trace_emit(ev, VERDICT_FORWARDED, 0);
	return TC_ACT_OK;
}

/* The one drop exit: VERDICT_DROPPED with the reason. */
static __always_inline int hook_drop(struct trace_event *ev, int reason)
{
	trace_emit(ev, VERDICT_DROPPED, reason);
	return TC_ACT_SHOT;
}

#endif /* LABKIT_HOOK_H */
