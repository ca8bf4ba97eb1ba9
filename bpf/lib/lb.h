/* lb.h — per-packet Service load balancing (Cilium's lb4_* in lib/lb.h).
 *
 * A packet to a Service VIP:port finds the service head (slot 0) in
 * cilium_lb4_services_v2, looks up its SVC entry in the CT map, picks a
 * backend on CT_NEW (the client's affinity, the service's Maglev table at
 * the uplink, or slot = random % count + 1), and is DNATed to the backend. A pod reaching itself through its own
 * Service (hairpin) is also SNATed to LB_LOOPBACK_IPV4 so that the reply
 * comes back through the datapath for reverse NAT.
 */
#ifndef LABKIT_LB_H
#define LABKIT_LB_H

#include "maps_lb.h"
#include "clock.h"
#include "parse.h"
#include "conntrack.h"
#include "hash.h"
#include "dsr.h"
#include "trace.h"

#define TCP_CSUM_OFF 16 /* offsetof(struct tcphdr, check) */
#define UDP_CSUM_OFF 6  /* offsetof(struct udphdr, check) */

#ifndef LB_LOOPBACK_IPV4
#define LB_LOOPBACK_IPV4 0x012afea9 /* 169.254.42.1 in network byte order */
#endif

/* One slot of a service. v1.16 has one service per address and port for
 * every protocol: the agent writes protocol 0 (ANY) into the key and the
 * datapath clears it before the lookup (lb4_fill_key: "FIXME: set after
 * adding support for different L4 protocols in LB"). From 1.17
 * (cilium/cilium#33434) the key carries the protocol, and a lookup that finds
 * nothing tries protocol 0 again, for services written the old way. */
static __always_inline struct lb4_service *lb4_lookup_service(__be32 addr, __be16 port, __u8 proto, __u16 slot,
							       __u8 scope)
{
	struct lb4_key key = {};
	struct lb4_service *svc;

	key.address = addr;
	key.dport = port;
	key.backend_slot = slot;
	key.scope = scope;
#ifdef CILIUM_LB_PROTO_KEYS
	key.proto = proto;
	svc = cilium_lb4_services_v2.lookup(&key);
	if (svc)
		return svc;
#endif
	key.proto = 0;
	svc = cilium_lb4_services_v2.lookup(&key);
	return svc;
}

/* The service head for the packet's destination. A frontend with
 * externalTrafficPolicy=Local lists only this node's backends in its external
 * scope; if it has TWO_SCOPES, traffic from inside the cluster (pods) reads
 * the internal scope, which lists them all. *scope says which one was read. */
static __always_inline struct lb4_service *lb4_lookup_frontend(const struct pkt4 *p, bool from_inside, __u8 *scope)
{
	struct lb4_service *svc = lb4_lookup_service(p->daddr, p->dport, p->proto, 0, LB_LOOKUP_SCOPE_EXT);

	*scope = LB_LOOKUP_SCOPE_EXT;
	if (svc && from_inside && (svc->flags2 & SVC_FLAG_TWO_SCOPES)) {
		*scope = LB_LOOKUP_SCOPE_INT;
		svc = lb4_lookup_service(p->daddr, p->dport, p->proto, 0, LB_LOOKUP_SCOPE_INT);
	}
	return svc;
}

static __always_inline struct lb4_backend *lb4_lookup_backend(__u32 backend_id)
{
	return cilium_lb4_backends_v3.lookup(&backend_id);
}

/* The Maglev slot of a flow: Cilium's hash_from_tuple_v4, a jhash of the
 * source address, both ports (as the CT tuple holds them: the packet's source
 * port in the high half) and the protocol, never the destination. */
static __always_inline __u32 lb4_flow_hash(const struct pkt4 *p)
{
	__u32 ports = ((__u32)p->sport << 16) | p->dport;
	__u32 seed = lab_fault(FAULT_MAGLEV_WRONG_HASH) ? LB_FLOW_HASH_SEED ^ 1 : LB_FLOW_HASH_SEED;

	return jhash_3words(p->saddr, ports, p->proto, seed);
}

/* Backend for a new flow: with maglev (the uplink's programs), the service's
 * Maglev table if the agent wrote one (external scope only), else Cilium's
 * random pick, slot = rand % count + 1. A pod's traffic is always random:
 * Cilium compiles bpf_lxc with LB_SELECTION_RANDOM whatever --bpf-lb-algorithm
 * says, since ClusterIPs get no Maglev table (bpf_lxc.c:41-42, and
 * svcInfo.useMaglev in pkg/service/service.go:173 at v1.16.0). */
static __always_inline __u32 lb4_select_backend_id(const struct pkt4 *p, const struct lb4_service *svc, __u8 scope,
						   bool maglev)
{
	__be16 id = svc->rev_nat_index;
	void *inner = maglev && scope == LB_LOOKUP_SCOPE_EXT ? cilium_lb4_maglev.lookup(&id) : NULL;

	if (inner) {
		__u32 zero = 0, index = lb4_flow_hash(p) % LB_MAGLEV_LUT_SIZE;
		struct lb4_maglev_lut *lut = bpf_map_lookup_elem(inner, &zero);

		/* The compiler knows index < M and would drop the check the verifier needs. */
		asm volatile("" : "+r"(index));
		if (!lut || index >= LB_MAGLEV_LUT_SIZE)
			return 0;
		return lut->backend_ids[index];
	}
	/* The fault: count one slot more, so a terminating backend (listed after count) may be picked. */
	__u16 slot = (bpf_get_prandom_u32() % (svc->count + (lab_fault(FAULT_PICK_TERMINATING) ? 1 : 0))) + 1;
	struct lb4_service *be = lb4_lookup_service(p->daddr, p->dport, p->proto, slot, scope);

	return be ? be->backend_id : 0;
}

/* The client's remembered backend while the affinity timeout (slot 0's
 * backend_id field) has not run out and the backend still belongs to the
 * service (Cilium's __lb4_affinity_backend_id). The session is sticky for
 * [last_used, last_used + timeout): an entry whose last_used + timeout <= now
 * is gone. Whether the backend is still the service's is the agent's
 * cilium_lb_affinity_match, not the backend's state: a terminating backend
 * keeps its affinity clients; one the agent removed loses them, and the
 * client's entry is deleted. A backend id with no backend row falls back to a
 * new choice (lb4_local's check). */
static __always_inline __u32 lb4_affinity_backend(__be32 client, const struct lb4_service *svc, __u32 now)
{
	struct lb_affinity_match match = {};
	struct lb4_affinity_key key = {};
	struct lb_affinity_val *val;

	key.client_id = client;
	key.rev_nat_id = svc->rev_nat_index;
	val = cilium_lb4_affinity.lookup(&key);
	if (!val)
		return 0;
	if (val->last_used + svc->backend_id <= now) {
		cilium_lb4_affinity.delete(&key);
		return 0;
	}
	match.backend_id = val->backend_id;
	match.rev_nat_id = svc->rev_nat_index;
	if (!cilium_lb_affinity_match.lookup(&match)) {
		cilium_lb4_affinity.delete(&key);
		return 0;
	}
	val->last_used = now;
	if (!lb4_lookup_backend(val->backend_id))
		return 0;
	return val->backend_id;
}

/* Remember (or refresh) the client's backend: every packet to the service
 * does this, so an active session never runs out (lb4_update_affinity_by_addr). */
static __always_inline void lb4_affinity_update(__be32 client, const struct lb4_service *svc, __u32 backend_id,
						__u32 now)
{
	struct lb4_affinity_key key = {};
	struct lb_affinity_val val = {};

	key.client_id = client;
	key.rev_nat_id = svc->rev_nat_index;
	val.last_used = now;
	val.backend_id = backend_id;
	cilium_lb4_affinity.update(&key, &val);
}

/* Rewrite one address (and port) of the packet, fixing the IP and L4
 * checksums incrementally (BPF_F_PSEUDO_HDR: the address is in the TCP/UDP
 * pseudo-header; BPF_F_MARK_MANGLED_0 keeps a zero UDP checksum valid). */
static __always_inline int lb4_rewrite(struct __sk_buff *skb, struct pkt4 *p, bool dst, __be32 new_addr,
				       __be16 new_port)
{
	__u32 addr_off = p->l3_off + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
	__u32 port_off = p->l4_off + (dst ? 2 : 0);
	__be32 old_addr = dst ? p->daddr : p->saddr;
	__be16 old_port = dst ? p->dport : p->sport;
	__u32 csum_off = 0, flags = 0;

	if (p->proto == IPPROTO_TCP) {
		csum_off = p->l4_off + TCP_CSUM_OFF;
	} else if (p->proto == IPPROTO_UDP) {
		csum_off = p->l4_off + UDP_CSUM_OFF;
		flags = BPF_F_MARK_MANGLED_0;
	}
	if (csum_off && bpf_l4_csum_replace(skb, csum_off, old_addr, new_addr, flags | BPF_F_PSEUDO_HDR | 4) < 0)
		return DROP_CSUM_L4;
	if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), old_addr, new_addr, 4) < 0)
		return DROP_CSUM_L3;
	if (bpf_skb_store_bytes(skb, addr_off, &new_addr, 4, 0) < 0)
		return DROP_WRITE_ERROR;
	if (csum_off && old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port, flags | 2) < 0)
			return DROP_CSUM_L4;
		if (bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0) < 0)
			return DROP_WRITE_ERROR;
	}
	if (dst) {
		p->daddr = new_addr;
		p->dport = new_port;
	} else {
		p->saddr = new_addr;
		p->sport = new_port;
	}
	return 0;
}

/* Reverse NAT of a reply: its source becomes the service's VIP:port again. */
static __always_inline int lb4_rev_nat(struct __sk_buff *skb, struct pkt4 *p, __be16 rev_nat_index)
{
	struct lb4_reverse_nat *nat = cilium_lb4_reverse_nat.lookup(&rev_nat_index);

	if (!nat)
		return 0;
	return lb4_rewrite(skb, p, false, nat->address, nat->port);
}

/* Cilium's lb4_local: the SVC entry of a packet to a service frontend, and its
 * backend. A new flow gets one by affinity, Maglev or random. An established
 * flow keeps its backend while that is active; if the backend is gone the flow
 * moves to another at once, and if it is only no longer active (terminating)
 * the flow drains on it until a new SYN, which moves it ("drain existing
 * connections, but redirect new ones to only active backends"). The SVC entry
 * carries no identity and no flags but its closing state: callers hand it a
 * fresh ct_state, whether the client is a pod or outside the cluster. Every
 * packet refreshes the client's affinity. Returns the service CT result, or a DROP_*
 * reason; *backend is set on success. */
static __always_inline int __lb4_local(const __u32 *len, const struct pkt4 *p, const struct lb4_service *svc,
				       __u8 scope, struct ct_state *st, struct lb4_backend **backend, bool maglev)
{
	struct ipv4_ct_tuple tuple = {};
	__u32 backend_id = 0, now = lab_now();
	int ret;

	*backend = NULL;
	ret = ct_lookup4(&tuple, p, *len, CT_SERVICE, st);
	if (ret < 0)
		return ret;
	if (ret == CT_NEW) {
		if (svc->count == 0)
			return DROP_NO_SERVICE;
		if (svc->flags & SVC_FLAG_AFFINITY)
			backend_id = lb4_affinity_backend(p->saddr, svc, now);
		if (!backend_id)
			backend_id = lb4_select_backend_id(p, svc, scope, maglev);
		*backend = lb4_lookup_backend(backend_id);
		if (!*backend)
			return DROP_NO_SERVICE;
		st->backend_id = backend_id;
		st->rev_nat_index = svc->rev_nat_index;
		st->flags = 0;
		ret = lab_fault(FAULT_NO_SVC_ENTRY) ? 0 : ct_create4(&tuple, *len, CT_SERVICE, st, false);
		if (ret < 0)
			return ret;
		ret = CT_NEW;
	} else {
		backend_id = st->backend_id;
		*backend = lb4_lookup_backend(backend_id);
		if (!*backend || ((*backend)->flags != BE_STATE_ACTIVE && st->syn)) {
			if (svc->count == 0)
				return DROP_NO_SERVICE;
			backend_id = lb4_select_backend_id(p, svc, scope, maglev);
			*backend = lb4_lookup_backend(backend_id);
			if (!*backend)
				return DROP_NO_SERVICE;
			st->backend_id = backend_id;
			st->rev_nat_index = svc->rev_nat_index;
			struct ct_entry *entry = ct_map_lookup(&tuple);

			if (entry) { /* Cilium's ct_update_svc_entry */
				entry->backend_id = backend_id;
				entry->rev_nat_index = svc->rev_nat_index;
			}
		}
	}
	if (svc->flags & SVC_FLAG_AFFINITY)
		lb4_affinity_update(p->saddr, svc, backend_id, now);
	return ret;
}

/* lb4_local for a pod's tc program (bpf_lxc): random selection only. The
 * worker takes the length by address so that it reads skb->len where the CT
 * calls need it, as it always has. */
static __always_inline int lb4_local(struct __sk_buff *skb, const struct pkt4 *p, const struct lb4_service *svc,
				     __u8 scope, struct ct_state *st, struct lb4_backend **backend)
{
	return __lb4_local(&skb->len, p, svc, scope, st, backend, false);
}

/* lb4_local for the uplink's tc program: the service's Maglev table when it has one. */
static __always_inline int lb4_local_nodeport(struct __sk_buff *skb, const struct pkt4 *p,
					      const struct lb4_service *svc, __u8 scope, struct ct_state *st,
					      struct lb4_backend **backend)
{
	return __lb4_local(&skb->len, p, svc, scope, st, backend, true);
}

/* A Service without backends (DROP_NO_SERVICE). Cilium v1.16's default
 * --service-no-backend-response=reject (SERVICE_NO_BACKEND_RESPONSE) answers
 * the client with ICMP destination unreachable, port unreachable, instead of
 * dropping the packet: bpf_lxc.c and nodeport.h tail-call
 * tail_no_service_ipv4 (lib/lb.h), which turns the packet itself into the
 * answer and sends it back out of the device it came in on. Build with
 * SERVICE_NO_BACKEND_DROP for --service-no-backend-response=drop. */
#ifndef SERVICE_NO_BACKEND_DROP
#define SERVICE_NO_BACKEND_RESPONSE
#endif
#define ICMP_PACKET_MAX_SAMPLE_SIZE 64

struct lb4_icmp_unreach {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__u32 unused;
};

/* Cilium's __tail_no_service_ipv4, for a tc program: the frame is cut to
 * Ethernet + 64 bytes (ctx_adjust_troom(sample_len + ETH_HLEN - len), with
 * sample_len = min(len, 64) counting the Ethernet header: a frame of 64 bytes
 * or less grows by 14 zero bytes, as Cilium's does), 28 bytes of room go in
 * after the MAC header, and the new headers are written over the front: MACs
 * swapped, an IPv4 header from the frontend to the client (the client's TOS,
 * TTL 64, id 0) and the ICMP header, its checksum over the sample. 0 or a
 * DROP_* reason. */
static __always_inline int lb4_no_service_reply(struct __sk_buff *skb, const struct pkt4 *p)
{
	__u8 sample[ICMP_PACKET_MAX_SAMPLE_SIZE] = {};
	struct lb4_icmp_unreach icmp = {};
	struct iphdr ip = {};
	__u8 macs[12], eth[ETH_HLEN];
	__u32 sample_len = skb->len, size;
	__s64 sum;
	__u8 tos;

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0 ||
	    bpf_skb_load_bytes(skb, p->l3_off + offsetof(struct iphdr, tos), &tos, 1) < 0)
		return DROP_INVALID;
	if (sample_len > ICMP_PACKET_MAX_SAMPLE_SIZE)
		sample_len = ICMP_PACKET_MAX_SAMPLE_SIZE;
	bpf_skb_change_tail(skb, sample_len + ETH_HLEN, 0); /* Cilium does not check it either */
	if (sample_len < 1)
		return DROP_INVALID;
	sample_len = ((sample_len - 1) & (ICMP_PACKET_MAX_SAMPLE_SIZE - 1)) + 1; /* 1..64, in a form the verifier sees */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, sample, sample_len) < 0)
		return DROP_INVALID;
	size = (sample_len + 3) & ~3U; /* bpf_csum_diff takes whole words; the padding is 0 */
	if (size > ICMP_PACKET_MAX_SAMPLE_SIZE)
		return DROP_INVALID;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)sample, size, 0);
	if (sum < 0)
		return DROP_INVALID;
	if (bpf_skb_adjust_room(skb, sizeof(ip) + sizeof(icmp), BPF_ADJ_ROOM_MAC, 0) < 0)
		return DROP_INVALID;

	__builtin_memcpy(eth, macs + 6, 6); /* to the client: the sender's MAC */
	__builtin_memcpy(eth + 6, macs, 6);
	eth[12] = 0x08;
	eth[13] = 0x00;
	ip.version = 4;
	ip.ihl = sizeof(ip) >> 2;
	ip.tos = tos;
	ip.tot_len = lk_htons(sizeof(ip) + sizeof(icmp) + sample_len);
	ip.ttl = 64; /* IPDEFTTL */
	ip.protocol = IPPROTO_ICMP;
	ip.saddr = p->daddr;
	ip.daddr = p->saddr;
	ip.check = csum_fold32((__u32)bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
	icmp.type = ICMP_DEST_UNREACH;
	icmp.code = ICMP_PORT_UNREACH;
	icmp.checksum = csum_fold32((__u32)bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), (__u32)sum));
	if (bpf_skb_store_bytes(skb, 0, eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), &icmp, sizeof(icmp), 0) < 0)
		return DROP_WRITE_ERROR;
	return 0;
}

#ifdef SERVICE_NO_BACKEND_RESPONSE
/* The trace record of a packet answered with port unreachable (tc and XDP):
 * the answer's addresses as "after", REDIRECTED for DROP_NO_SERVICE. */
static __always_inline void lb4_no_service_answered(struct trace_event *ev, const struct pkt4 *p)
{
	struct pkt4 reply = {};

	reply.saddr = p->daddr;
	reply.daddr = p->saddr;
	reply.proto = IPPROTO_ICMP;
	reply.icmp_type = ICMP_DEST_UNREACH;
	trace_tuple_set(&ev->after, &reply);
	ev->flags |= TRACE_F_NO_BACKEND_REPLY;
	trace_emit(ev, VERDICT_REDIRECTED, DROP_NO_SERVICE);
}
#endif

/* What a hook does with DROP_NO_SERVICE: with SERVICE_NO_BACKEND_RESPONSE,
 * answer and send the answer back where the packet came from — into the pod
 * (to_pod: bpf_lxc's from-container; Cilium redirects to the lxc device,
 * which hands it to the pod) or out of the uplink (from-netdev). The record
 * says so (REDIRECTED, reason DROP_NO_SERVICE, flag NO_BACKEND_REPLY, the
 * answer as its translated tuple) and is not reported to Hubble: Cilium sends
 * no notification for it. A failure to build the answer is a drop with its
 * reason (tail_no_service_ipv4's send_drop_notify_error). The tc verdict. */
static __always_inline int lb4_no_service(struct __sk_buff *skb, const struct pkt4 *p, struct trace_event *ev,
					  bool to_pod)
{
#ifdef SERVICE_NO_BACKEND_RESPONSE
	int ret = lb4_no_service_reply(skb, p);

	if (ret < 0) {
		trace_emit(ev, VERDICT_DROPPED, ret);
		return TC_ACT_SHOT;
	}
	lb4_no_service_answered(ev, p);
	return to_pod ? bpf_redirect_peer(skb->ifindex, 0) : bpf_redirect(skb->ifindex, 0);
#else
	trace_emit(ev, VERDICT_DROPPED, DROP_NO_SERVICE);
	return TC_ACT_SHOT;
#endif
}

#endif /* LABKIT_LB_H */
