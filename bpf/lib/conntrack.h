/* conntrack.h — Cilium's connection tracking (v1.16 behaviour) on labkit's maps.
 *
 * A packet's tuple is first looked up in the reply direction (finding an
 * entry the other side created), then in its own direction; a miss is
 * CT_NEW and the caller creates the entry with ct_create4(). Stored keys are
 * the reversed packet tuple, so an OUT row created by a client C:cp talking
 * to S:sp is {daddr=C, saddr=S, dport=sp, sport=cp, flags=OUT}.
 *
 * TCP state lives in the flag word: CREATE (SYN without ACK) on a closing
 * entry starts it afresh; CLOSE (FIN or RST) marks the direction closing and,
 * once both are, gives the entry CT_CLOSE_TIMEOUT and stops refreshing it.
 */
#ifndef LABKIT_CONNTRACK_H
#define LABKIT_CONNTRACK_H

#include "maps_ct.h"
#include "clock.h"
#include "parse.h"

#define ACTION_UNSPEC 0
#define ACTION_CREATE 1
#define ACTION_CLOSE  2

#define CT_REPORT_INTERVAL 5 /* seconds between reports of an unchanged entry */

static __always_inline struct ct_entry *ct_map_lookup(const struct ipv4_ct_tuple *tuple)
{
	if (tuple->nexthdr == IPPROTO_TCP)
		return cilium_ct4_global.lookup((void *)tuple);
	return cilium_ct_any4_global.lookup((void *)tuple);
}

static __always_inline int ct_map_update(const struct ipv4_ct_tuple *tuple, const struct ct_entry *entry)
{
	if (tuple->nexthdr == IPPROTO_TCP)
		return cilium_ct4_global.update((void *)tuple, (void *)entry);
	return cilium_ct_any4_global.update((void *)tuple, (void *)entry);
}

static __always_inline bool ct_entry_alive(const struct ct_entry *entry)
{
	return !((entry->flags & CT_F_RX_CLOSING) && (entry->flags & CT_F_TX_CLOSING));
}

static __always_inline bool ct_entry_closing(const struct ct_entry *entry)
{
	return entry->flags & (CT_F_RX_CLOSING | CT_F_TX_CLOSING);
}

/* Cilium's TCP_FLAG_SYN is not a flag byte: it is the 32-bit word of the TCP
 * header's offset/flags in network order, __constant_cpu_to_be32(0x00020000)
 * (bpf/include/linux/tcp.h:77@82999990), 0x00000200 on a little-endian CPU.
 * ct_entry_seen_both_syns (bpf/lib/conntrack.h:67@82999990) ANDs it with the
 * 8-bit seen flags, so it is always false as it executes: every RST closes
 * both directions, whatever its comment says, and Cilium's own test relies on
 * it (bpf/tests/bpf_ct_tests.c:207-212@82999990). labkit does what executes. */
#define CT_SYN_BE32_FLAG_WORD lk_htonl(0x00020000)

static __always_inline bool ct_entry_seen_both_syns(const struct ct_entry *entry)
{
	bool rx_syn = entry->rx_flags_seen & CT_SYN_BE32_FLAG_WORD;
	bool tx_syn = entry->tx_flags_seen & CT_SYN_BE32_FLAG_WORD;

	return rx_syn && tx_syn;
}

/* Set the lifetime and OR the packet's TCP flags into the direction's seen
 * flags; the report timestamp moves when the flags change or every
 * CT_REPORT_INTERVAL seconds (Cilium's monitor aggregation clock). True when
 * it moved: Cilium's __ct_update_timeout then returns TRACE_PAYLOAD_LEN, the
 * 'monitor' that lets a trace notification through at medium aggregation.
 *
 * Cilium ANDs the packet's flags with CT_REPORT_FLAGS first (the agent's
 * --monitor-aggregation-flags; pkg/datapath/linux/config/config.go). labkit
 * keeps Helm's default, bpf.monitorFlags "all" (0xff): every flag counts, and
 * the seen flags are the CT rows labkit has always written. */
static __always_inline bool __ct_update_timeout(struct ct_entry *entry, __u32 lifetime, int dir,
						__u8 tcp_flags, __u32 now)
{
	__u8 accumulated, seen;
	__u32 last_report;

	entry->lifetime = now + lifetime;
	if (dir == CT_INGRESS) {
		accumulated = entry->rx_flags_seen;
		last_report = entry->last_rx_report;
	} else {
		accumulated = entry->tx_flags_seen;
		last_report = entry->last_tx_report;
	}
	seen = lab_fault(FAULT_NO_FLAGS_SEEN) ? accumulated : accumulated | tcp_flags;
	if (last_report + CT_REPORT_INTERVAL < now || accumulated != seen) {
		if (dir == CT_INGRESS) {
			entry->rx_flags_seen = seen;
			entry->last_rx_report = now;
		} else {
			entry->tx_flags_seen = seen;
			entry->last_tx_report = now;
		}
		return true;
	}
	return false;
}

/* Choose the lifetime for this packet: SYN timeout until a TCP packet without
 * SYN is seen (seen_non_syn is sticky), then the established lifetime. */
static __always_inline bool ct_update_timeout(struct ct_entry *entry, bool is_tcp, int dir,
					      __u8 tcp_flags, __u32 now)
{
	__u32 lifetime = dir == CT_SERVICE ? CT_SERVICE_LIFETIME_NONTCP : CT_CONNECTION_LIFETIME_NONTCP;

	if (is_tcp) {
		if (!(tcp_flags & TCP_FLAG_SYN) && !lab_fault(FAULT_WRONG_LIFETIME))
			entry->flags |= CT_F_SEEN_NON_SYN;
		if (entry->flags & CT_F_SEEN_NON_SYN)
			lifetime = dir == CT_SERVICE ? CT_SERVICE_LIFETIME_TCP : CT_CONNECTION_LIFETIME_TCP;
		else
			lifetime = CT_SYN_TIMEOUT;
	}
	return __ct_update_timeout(entry, lifetime, dir, tcp_flags, now);
}

static __always_inline void ct_state_fill(struct ct_state *state, const struct ct_entry *entry)
{
	state->backend_id = entry->backend_id;
	state->lifetime = entry->lifetime;
	state->src_sec_id = entry->src_sec_id;
	state->rev_nat_index = entry->rev_nat_index;
	state->flags = entry->flags;
	state->tx_flags_seen = entry->tx_flags_seen;
	state->rx_flags_seen = entry->rx_flags_seen;
}

/* One lookup of one stored key. CT_ESTABLISHED on a hit, CT_NEW on a miss or
 * when a SYN reopens a closing entry (Cilium v1.16's __ct_lookup).
 *
 * state->monitor follows __ct_lookup's *monitor: set on a miss, on a FIN or
 * RST, and from the timeout update of a live entry; a hit on an entry closed
 * both ways leaves it as the previous lookup of ct_lookup4 set it. */
static __always_inline int __ct_lookup4(const struct ipv4_ct_tuple *tuple, int action, int dir,
					__u8 tcp_flags, __u32 len, __u32 now, struct ct_state *state)
{
	bool is_tcp = tuple->nexthdr == IPPROTO_TCP;
	struct ct_entry *entry = ct_map_lookup(tuple);

	state->syn = is_tcp && (tcp_flags & TCP_FLAG_SYN);
	if (!entry) {
		state->monitor = 1;
		return CT_NEW;
	}
	if (ct_entry_alive(entry))
		state->monitor = ct_update_timeout(entry, is_tcp, dir, tcp_flags, now);
#ifdef CONNTRACK_ACCOUNTING
	/* Counted only when the datapath is built with accounting (the agent
	 * leaves it off by default, so a node prints Packets=0 Bytes=0). */
	if (!lab_fault(FAULT_NO_ACCOUNTING)) {
		__sync_fetch_and_add(&entry->packets, 1);
		__sync_fetch_and_add(&entry->bytes, len);
	}
#endif

	switch (action) {
	case ACTION_CREATE:
		if (ct_entry_closing(entry)) {
			/* A new connection on the same ports: the caller creates
			 * the entry afresh (Cilium reinitialises it fully). */
			entry->flags &= ~(CT_F_RX_CLOSING | CT_F_TX_CLOSING | CT_F_SEEN_NON_SYN);
			entry->rx_flags_seen = 0;
			entry->tx_flags_seen = 0;
			state->monitor = ct_update_timeout(entry, is_tcp, dir, tcp_flags, now);
			ct_state_fill(state, entry);
			return CT_NEW;
		}
		break;
	case ACTION_CLOSE:
		state->monitor = 1; /* Cilium reports every FIN and RST */
		if (lab_fault(FAULT_NO_CLOSE))
			break;
		if (dir == CT_SERVICE) {
			/* Only the forward direction passes here: close both
			 * (cilium/cilium#33907, in every v1.16 release). */
			entry->flags |= CT_F_RX_CLOSING | CT_F_TX_CLOSING;
		} else if (!ct_entry_seen_both_syns(entry) && (tcp_flags & TCP_FLAG_RST)) {
			/* Meant for an RST before the handshake completed; as it
			 * executes, every RST (ct_entry_seen_both_syns above). */
			entry->flags |= CT_F_RX_CLOSING | CT_F_TX_CLOSING;
		} else if (dir == CT_INGRESS) {
			entry->flags |= CT_F_RX_CLOSING;
		} else {
			entry->flags |= CT_F_TX_CLOSING;
		}
		if (!ct_entry_alive(entry))
			__ct_update_timeout(entry, CT_CLOSE_TIMEOUT, dir, tcp_flags, now);
		break;
	}
	ct_state_fill(state, entry);
	return CT_ESTABLISHED;
}

/* The hairpin case at to-container (Cilium v1.16's ct_has_loopback_egress_entry4):
 * is there an OUT entry with LBLoopback for the IN key *tuple? Its RevNAT in
 * *rev_nat_index. */
static __always_inline bool ct_has_loopback_egress_entry4(const struct ipv4_ct_tuple *tuple, __be16 *rev_nat_index)
{
	struct ipv4_ct_tuple out = *tuple;
	struct ct_entry *entry;

	out.flags = TUPLE_F_OUT;
	entry = ct_map_lookup(&out);
	if (!entry || !(entry->flags & CT_F_LB_LOOPBACK))
		return false;
	*rev_nat_index = entry->rev_nat_index;
	return true;
}

static __always_inline void ipv4_ct_tuple_reverse(struct ipv4_ct_tuple *tuple)
{
	__be32 addr = tuple->saddr;
	__be16 port = tuple->sport;

	tuple->saddr = tuple->daddr;
	tuple->daddr = addr;
	tuple->sport = tuple->dport;
	tuple->dport = port;
	tuple->flags ^= TUPLE_F_IN;
}

/* Build the lookup tuple for a packet and find its entry. Returns a CT_*
 * result, or a negative DROP_* reason. On CT_NEW, *tuple is the key to
 * create; otherwise it is the key that was found. */
static __always_inline int ct_lookup4(struct ipv4_ct_tuple *tuple, const struct pkt4 *p, __u32 len, int dir,
				      struct ct_state *state)
{
	__u32 now = lab_now();
	int action = ACTION_UNSPEC;
	int ret;

	tuple->daddr = p->daddr;
	tuple->saddr = p->saddr;
	tuple->nexthdr = p->proto;
	tuple->dport = 0;
	tuple->sport = 0;
	if (dir == CT_INGRESS)
		tuple->flags = TUPLE_F_OUT;
	else if (dir == CT_EGRESS)
		tuple->flags = TUPLE_F_IN;
	else
		tuple->flags = TUPLE_F_SERVICE;

	switch (p->proto) {
	case IPPROTO_ICMP:
		switch (p->icmp_type) {
		case ICMP_DEST_UNREACH:
		case ICMP_TIME_EXCEEDED:
		case ICMP_PARAMETERPROB:
			tuple->flags |= TUPLE_F_RELATED;
			break;
		case ICMP_ECHOREPLY:
			tuple->sport = p->sport;
			break;
		case ICMP_ECHO:
			tuple->dport = p->sport;
			action = ACTION_CREATE;
			break;
		default:
			action = ACTION_CREATE;
			break;
		}
		break;
	case IPPROTO_TCP:
		tuple->dport = p->sport;
		tuple->sport = p->dport;
		if (p->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN))
			action = ACTION_CLOSE;
		else if ((p->tcp_flags & TCP_FLAG_SYN) && !(p->tcp_flags & TCP_FLAG_ACK))
			action = ACTION_CREATE;
		break;
	case IPPROTO_UDP:
		tuple->dport = p->sport;
		tuple->sport = p->dport;
		action = ACTION_CREATE;
		break;
	default:
		return DROP_CT_UNKNOWN_PROTO;
	}

	if (dir != CT_SERVICE) {
		ret = __ct_lookup4(tuple, action, dir, p->tcp_flags, len, now, state);
		if (ret == CT_ESTABLISHED)
			return (tuple->flags & TUPLE_F_RELATED) ? CT_RELATED : CT_REPLY;
		ipv4_ct_tuple_reverse(tuple);
	}
	return __ct_lookup4(tuple, action, dir, p->tcp_flags, len, now, state);
}

/* Create the entry for *tuple (as returned by ct_lookup4 on CT_NEW) and, when
 * related is set, its RELATED twin in the any map, so ICMP errors about the
 * flow are recognised. Cilium passes no related map for SVC entries
 * (lb4_local) and for the DSR entry on a backend's node.
 *
 * The twin is written before the counters are touched (Cilium v1.16's
 * ct_create4): it is the main entry as created — flags, seen flags and
 * lifetime of the first packet — with no packets or bytes. state carries
 * what the caller decided: identity, rev NAT, backend, flags. */
static __always_inline int ct_create4(const struct ipv4_ct_tuple *tuple, __u32 len, int dir,
				      struct ct_state *state, bool related)
{
	struct ct_entry entry = {};
	struct ipv4_ct_tuple twin = {};
	bool is_tcp = tuple->nexthdr == IPPROTO_TCP;

	entry.flags = state->flags & (CT_F_LB_LOOPBACK | CT_F_NODE_PORT | CT_F_DSR_INTERNAL | CT_F_FROM_TUNNEL);
	entry.rev_nat_index = state->rev_nat_index;
	entry.src_sec_id = state->src_sec_id;
	if (dir == CT_SERVICE)
		entry.backend_id = state->backend_id;
	ct_update_timeout(&entry, is_tcp, dir, is_tcp ? TCP_FLAG_SYN : 0, lab_now());

	if (related && !lab_fault(FAULT_NO_RELATED)) {
		twin.daddr = tuple->daddr;
		twin.saddr = tuple->saddr;
		twin.nexthdr = IPPROTO_ICMP;
		twin.flags = tuple->flags | TUPLE_F_RELATED;
		if (cilium_ct_any4_global.update(&twin, &entry) < 0)
			return DROP_CT_CREATE_FAILED;
	}
#ifdef CONNTRACK_ACCOUNTING
	if (!lab_fault(FAULT_NO_ACCOUNTING)) {
		entry.packets = 1;
		entry.bytes = len;
	}
#endif
	if (ct_map_update(tuple, &entry) < 0)
		return DROP_CT_CREATE_FAILED;
	ct_state_fill(state, &entry);
	return 0;
}

#endif /* LABKIT_CONNTRACK_H */
