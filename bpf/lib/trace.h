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
}

static __always_inline void trace_init(struct trace_event *ev, struct __sk_buff *skb, __u8 hook,
				       const struct pkt4 *p)
{
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = skb->ifindex;
	ev->len = skb->len;
	ev->node_id = NODE_ID;
	ev->hook = hook;
	ev->ct_result = CT_NONE;
	ev->ct_dir = CT_NONE;
	ev->svc_ct_result = CT_NONE;
	trace_tuple_set(&ev->before, p);
	trace_tuple_set(&ev->after, p);
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
}

static __always_inline void trace_emit(struct trace_event *ev, __u8 verdict, int reason)
{
	const struct lab_config *cfg = lab_config_get();
	__u32 mode = cfg ? cfg->trace_mode : TRACE_ALL;

	ev->verdict = verdict;
	ev->drop_reason = reason;
	if (mode == TRACE_NONE || (mode == TRACE_DROPS && verdict != VERDICT_DROPPED))
		return;
	labkit_events.ringbuf_output(ev, sizeof(*ev), 0);
}

#endif /* LABKIT_TRACE_H */
