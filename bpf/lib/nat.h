/* nat.h — cilium_snat_v4_external, the NAT map, as NodePort uses it (Cilium's
 * lib/nat.h, the parts labkit needs):
 *
 *   snat mode, on the node that load-balanced: the request to a remote backend
 *   leaves with the node's address and a port from 32768-65535 as its source;
 *   an OUT entry remembers the mapping, an IN entry keyed by the reply turns
 *   the reply's destination back into the client.
 *   dsr mode, on the backend's node: one OUT entry keyed by the reply holds
 *   the frontend (VIP:port) the reply must come from.
 *
 * Keys are CT tuples with the ports *not* swapped (nat_types.h).
 */
#ifndef LABKIT_NAT_H
#define LABKIT_NAT_H

#include "maps_nat.h"
#include "clock.h"
#include "lb.h"

/* Cilium's NODEPORT_PORT_MIN_NAT..NODEPORT_PORT_MAX_NAT, the SNAT source ports. */
#define NAT_PORT_MIN 32768
#define NAT_PORT_MAX 65535
/* Ports tried before giving up (Cilium signals the agent to collect once
 * more than half were taken; labkit has no such signal). */
#ifdef CILIUM_SNAT_RETRIES_32
#define SNAT_COLLISION_RETRIES 32
#else
#define SNAT_COLLISION_RETRIES 128
#endif

#ifndef NODE_IP
#define NODE_IP 0 /* this node's underlay address, network byte order (a build macro) */
#endif

static __always_inline void nat_key4(struct ipv4_ct_tuple *key, __be32 saddr, __be32 daddr, __be16 sport,
				     __be16 dport, __u8 proto, __u8 dir)
{
	key->saddr = saddr;
	key->daddr = daddr;
	key->sport = sport;
	key->dport = dport;
	key->nexthdr = proto;
	key->flags = dir;
}

/* Cilium's __snat_clamp_port_range: v1.16 maps a value into [min, max-1];
 * the closed range [min, max] came with cilium/cilium#33271. */
static __always_inline __u16 nat_clamp_port(__u16 value)
{
#ifdef CILIUM_SNAT_RETRIES_32
	__u32 n = NAT_PORT_MAX - NAT_PORT_MIN + 1;

	return NAT_PORT_MIN + (((__u32)value * n) >> 16);
#else
	return (value % (__u16)(NAT_PORT_MAX - NAT_PORT_MIN)) + NAT_PORT_MIN;
#endif
}

/* SNAT a request leaving for a remote backend: reuse the flow's mapping, or
 * make one (Cilium's snat_v4_new_mapping): keep the client's port when it is
 * in range, else a random one; on a collision try a fresh random port once,
 * then the ports after it, one by one. */
static __always_inline int snat_v4_nodeport(struct __sk_buff *skb, struct pkt4 *p)
{
	struct ipv4_nat_entry ostate = {}, rstate = {};
	struct ipv4_ct_tuple okey = {}, rkey = {};
	struct ipv4_nat_entry *found;
	__u32 now = lab_now();
	__u16 port = lk_ntohs(p->sport);
	int i;

	nat_key4(&okey, p->saddr, p->daddr, p->sport, p->dport, p->proto, NAT_DIR_EGRESS);
	found = cilium_snat_v4_external.lookup(&okey);
	if (found)
		return lb4_rewrite(skb, p, false, found->to_addr, found->to_port);
	if (port < NAT_PORT_MIN) /* __snat_try_keep_port: NAT_PORT_MAX is 65535, no port is above it */
		port = nat_clamp_port((__u16)bpf_get_prandom_u32());
	for (i = 0; i < SNAT_COLLISION_RETRIES; i++) {
		nat_key4(&rkey, p->daddr, NODE_IP, p->dport, lk_htons(port), p->proto, NAT_DIR_INGRESS);
		if (!cilium_snat_v4_external.lookup(&rkey))
			break;
		port = nat_clamp_port(i ? port + 1 : (__u16)bpf_get_prandom_u32());
	}
	if (i == SNAT_COLLISION_RETRIES)
		return DROP_NAT_NO_MAPPING;
	rstate.created = now;
	rstate.to_addr = p->saddr;
	rstate.to_port = p->sport;
	ostate.created = now;
	ostate.to_addr = NODE_IP;
	ostate.to_port = lk_htons(port);
	if (cilium_snat_v4_external.insert(&rkey, &rstate) < 0)
		return DROP_NAT_NO_MAPPING;
	if (cilium_snat_v4_external.insert(&okey, &ostate) < 0) {
		cilium_snat_v4_external.delete(&rkey);
		return DROP_NAT_NO_MAPPING;
	}
	return lb4_rewrite(skb, p, false, NODE_IP, ostate.to_port);
}

/* Translate a packet through the NAT entry keyed by its own tuple: an IN
 * entry (the reply to a SNATed request) restores its destination, the client;
 * an OUT entry (a DSR reply on the backend's node) rewrites its source to the
 * frontend. 1 when translated, 0 when the map has no such entry. */
static __always_inline int nat_apply4(struct __sk_buff *skb, struct pkt4 *p, __u8 dir)
{
	struct ipv4_ct_tuple key = {};
	struct ipv4_nat_entry *state;
	int ret;

	nat_key4(&key, p->saddr, p->daddr, p->sport, p->dport, p->proto, dir);
	state = cilium_snat_v4_external.lookup(&key);
	if (!state)
		return 0;
	ret = lb4_rewrite(skb, p, dir == NAT_DIR_INGRESS, state->to_addr, state->to_port);
	return ret < 0 ? ret : 1;
}

/* DSR, on the backend's node: the reply to this request must leave with
 * svc_addr:svc_port as its source. Keyed by the reply {backend → client}
 * (Cilium's snat_v4_create_dsr: created now, NeedsCT 0). */
static __always_inline int dsr_nat_create4(const struct pkt4 *p, __be32 svc_addr, __be16 svc_port)
{
	struct ipv4_nat_entry state = {};
	struct ipv4_ct_tuple key = {};

	nat_key4(&key, p->daddr, p->saddr, p->dport, p->sport, p->proto, NAT_DIR_EGRESS);
	state.created = lab_now();
	state.to_addr = svc_addr;
	state.to_port = svc_port;
	if (cilium_snat_v4_external.update(&key, &state) < 0)
		return DROP_NAT_NO_MAPPING;
	return 0;
}

#endif /* LABKIT_NAT_H */
