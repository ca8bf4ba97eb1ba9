/* trace.h — one struct trace_event per packet per hook into labkit_events.
 * labkit's monitor drains the ring buffer; `labkit trace` shows the records. */
#ifndef LABKIT_TRACE_H
#define LABKIT_TRACE_H

#include "maps_lab.h"
#include "clock.h"
#include "parse.h"

static __always_inline void trace_tuple_set(struct trace_tuple *t, const struct pkt4 *p)
{
	t->saddr = p->saddr;
	t->daddr = p->daddr;
	t->sport = p->sport;
	t->dport = p->dport;
	t->proto = p->proto;
	t->tcp_flags = p->tcp_flags;
	t->icmp_type = p->icmp_type;
	t->icmp_code = p->icmp_code;
}

/* What every hook's record starts with besides the time, device and length,
 * which each kind of program reads from its own context (trace_init, and
 * xdp_trace_init in xdp.h). */
static __always_inline void __trace_init(struct trace_event *ev, __u8 hook, const struct pkt4 *p)
{
	ev->node_id = NODE_ID;
	ev->hook = hook;
	ev->ct_result = CT_NONE;
	ev->ct_dir = CT_NONE;
	ev->svc_ct_result = CT_NONE;
	trace_tuple_set(&ev->before, p);
	trace_tuple_set(&ev->after, p);
}

static __always_inline void trace_init(struct trace_event *ev, struct __sk_buff *skb, __u8 hook,
				       const struct pkt4 *p)
{
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = skb->ifindex;
	ev->len = skb->len;
	__trace_init(ev, hook, p);
}

static __always_inline void trace_ct(struct trace_event *ev, int dir, int result, const struct ct_state *st)
{
	ev->ct_dir = dir;
	ev->ct_result = result;
	ev->ct_flags = st->flags;
	ev->ct_lifetime = st->lifetime;
	ev->ct_tx_seen = st->tx_flags_seen;
	ev->ct_rx_seen = st->rx_flags_seen;
	ev->rev_nat_index = lk_ntohs(st->rev_nat_index);
	if (st->monitor)
		ev->report |= REPORT_MONITOR;
}

/* The trace notification Cilium sends for this hook's outcome. The pod's
 * program reports where the packet goes next (bpf_lxc.c: to-overlay when it
 * is tunnelled, to-stack when handed to the stack, to-endpoint when delivered
 * to a pod); labkit has no separate from-endpoint record. A hook that knows
 * better names its point itself (trace_emit_at: from-container's packet to a
 * pod of its own node, or to the DNS proxy). */
static __always_inline __u8 trace_obs_point(const struct trace_event *ev)
{
	switch (ev->hook) {
	case HOOK_FROM_CONTAINER:
		if (ev->verdict == VERDICT_REDIRECTED)
			return ev->tunnel_endpoint ? OBS_TO_OVERLAY : OBS_TO_LXC;
		return OBS_TO_STACK;
	case HOOK_TO_CONTAINER:
		return OBS_TO_LXC;
	case HOOK_FROM_NETDEV:
		return OBS_FROM_NETWORK;
	case HOOK_TO_NETDEV:
		return OBS_TO_NETWORK;
	case HOOK_FROM_OVERLAY:
		return OBS_FROM_OVERLAY;
#ifdef ENABLE_NODEPORT_ACCELERATION
	case HOOK_XDP: /* Cilium's XDP program reports as from-network (METRIC_INGRESS on the native device) */
		return OBS_FROM_NETWORK;
#endif
	default:
		return OBS_TO_OVERLAY;
	}
}

/* Would Cilium at aggregation level 'level' have emitted this record?
 * Drops: always (bpf/lib/drop.h's send_drop_notify does not aggregate).
 * Traces: bpf/lib/trace.h's emit_trace_notify(): from TRACE_AGGREGATE_RX on,
 * no from-* point; from TRACE_AGGREGATE_ACTIVE_CT on, only when the CT lookup
 * returned a non-zero monitor (a hook without CT information passes 0). */
static __always_inline bool trace_reported(const struct trace_event *ev, __u32 level)
{
	if (ev->verdict == VERDICT_DROPPED)
		return true;
	/* Cilium's tail_no_service_ipv4 answers with its ICMP error and sends
	 * no notification: the record is labkit's, for the step's path. */
	if (ev->flags & TRACE_F_NO_BACKEND_REPLY)
		return false;
	/* cil_to_overlay (bpf_overlay.c) and cil_xdp_entry (bpf_xdp.c) send
	 * drop notifications only, whatever the level: their other records
	 * are labkit's, for the step's path. */
	if (ev->hook == HOOK_TO_OVERLAY || ev->hook == HOOK_XDP)
		return false;
	if (level >= TRACE_AGGREGATE_RX) {
		switch (ev->obs_point) {
		case OBS_FROM_LXC:
		case OBS_FROM_OVERLAY:
		case OBS_FROM_NETWORK:
			return false;
		}
	}
	if (level >= TRACE_AGGREGATE_ACTIVE_CT && !(ev->report & REPORT_MONITOR))
		return false;
	return true;
}

/* Write the record with its verdict, as observation point obs. */
static __always_inline void trace_emit_at(struct trace_event *ev, __u8 verdict, int reason, __u8 obs)
{
	const struct lab_config *cfg = lab_config_get();
	__u32 mode = cfg ? cfg->trace_mode : TRACE_ALL;

	__u32 zero = 0;
	__u64 *lost;

	ev->verdict = verdict;
	ev->drop_reason = reason;
	ev->obs_point = obs;
	if (trace_reported(ev, cfg ? cfg->monitor_aggregation : MONITOR_AGG_NONE))
		ev->report |= REPORT_REPORTED;
	if (mode == TRACE_NONE || (mode == TRACE_DROPS && verdict != VERDICT_DROPPED))
		return;
	if (labkit_events.ringbuf_output(ev, sizeof(*ev), 0) < 0) {
		lost = labkit_events_lost.lookup(&zero);
		if (lost)
			__sync_fetch_and_add(lost, 1);
	}
}

/* Write the record with its verdict, at the hook's usual point (trace_obs_point). */
static __always_inline void trace_emit(struct trace_event *ev, __u8 verdict, int reason)
{
	ev->verdict = verdict;
	trace_emit_at(ev, verdict, reason, trace_obs_point(ev));
}

#endif /* LABKIT_TRACE_H */
