/* sock.h — what the socket hooks of bpf_sock.c need beyond lib/lb.h: the
 * socket cookie that picks a UDP backend and keys cilium_lb4_reverse_sk, the
 * port access of a bpf_sock_addr, and session affinity keyed on the client's
 * network namespace instead of its address.
 *
 * Everything here runs on a struct bpf_sock_addr (cgroup/connect4, sendmsg4,
 * recvmsg4, getpeername4), never on a packet.
 */
#ifndef LABKIT_SOCK_H
#define LABKIT_SOCK_H

#include "maps_lb.h"
#include "clock.h"
#include "lb.h"

#ifndef IPPROTO_UDPLITE
#define IPPROTO_UDPLITE 136
#endif

/* Cilium's ctx_dst_port (bpf_sock.c): "Hack due to missing narrow ctx
 * access." user_port is a u32 holding a be16; read it whole. */
static __always_inline __be16 ctx_dst_port(const struct bpf_sock_addr *ctx)
{
	volatile __u32 dport = ctx->user_port;

	return (__be16)dport;
}

static __always_inline void ctx_set_port(struct bpf_sock_addr *ctx, __be16 dport)
{
	ctx->user_port = (__u32)dport;
}

/* Cilium's is_v4_loopback (bpf_sock.c): 127.0.0.0/8. */
static __always_inline bool is_v4_loopback(__be32 daddr)
{
	return (daddr & lk_htonl(0x7f000000)) == lk_htonl(0x7f000000);
}

/* Cilium v1.16's sock_local_cookie (lib/lb.h), with HAVE_SOCKET_COOKIE, which
 * every kernel labkit runs on has: "prandom() breaks down on UDP, hence
 * preference is on socket cookie as built-in selector." The cookie is one
 * number per socket for its whole life, unique across namespaces. */
static __always_inline __u64 sock_local_cookie(struct bpf_sock_addr *ctx)
{
	return bpf_get_socket_cookie(ctx);
}

/* Cilium's sock_select_slot (bpf_sock.c), to the letter:
 *
 *	return ctx->protocol == IPPROTO_TCP ?
 *	       get_prandom_u32() : sock_local_cookie(ctx);
 *
 * A TCP connect() draws a random slot; a UDP socket always gets the slot of
 * its cookie, so every datagram of one socket goes to the same backend while
 * the service's backends stay the same, and different sockets spread by
 * cookie % count. */
static __always_inline __u64 sock_select_slot(struct bpf_sock_addr *ctx)
{
	return ctx->protocol == IPPROTO_TCP ? bpf_get_prandom_u32() : sock_local_cookie(ctx);
}

/* Cilium v1.16's sock_proto_enabled (bpf_sock.c): TCP, UDP and UDP-Lite. */
static __always_inline bool sock_proto_enabled(__u32 proto)
{
	switch (proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDPLITE:
	case IPPROTO_UDP:
		return true;
	default:
		return false;
	}
}

/* Session affinity at the socket layer (Cilium's
 * lb4_affinity_backend_id_by_netns → __lb4_affinity_backend_id(svc, true, id)
 * in lib/lb.h). The socket has no client address yet, so the client is its
 * network namespace: client_id = bpf_get_netns_cookie(ctx), netns_cookie = 1,
 * in the same cilium_lb4_affinity map the tc path keys by address
 * (netns_cookie = 0). Every process of one pod (or of one node) shares it.
 *
 * As Cilium: an entry is stale once last_used + timeout <= now ("Session is
 * sticky for range [current, last_used + affinity_timeout)") and is deleted;
 * so is one whose backend is no longer the service's (no row in the agent's
 * cilium_lb_affinity_match); a live one is refreshed. Times are on the lab
 * clock, as tc's. */
static __always_inline __u32 lb4_affinity_backend_id_by_netns(const struct lb4_service *svc, __u64 netns_cookie)
{
	struct lb_affinity_match match = {};
	struct lb4_affinity_key key = {};
	struct lb_affinity_val *val;
	__u32 now;

	key.client_id = netns_cookie;
	key.rev_nat_id = svc->rev_nat_index;
	key.netns_cookie = 1;
	val = cilium_lb4_affinity.lookup(&key);
	if (!val)
		return 0;
	now = lab_now();
	if (val->last_used + svc->backend_id <= now) { /* slot 0's backend_id: the timeout */
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
	return val->backend_id;
}

/* Cilium's lb4_update_affinity_by_netns → __lb4_update_affinity(svc, true, id, backend_id). */
static __always_inline void lb4_update_affinity_by_netns(const struct lb4_service *svc, __u64 netns_cookie,
							 __u32 backend_id)
{
	struct lb4_affinity_key key = {};
	struct lb_affinity_val val = {};

	key.client_id = netns_cookie;
	key.rev_nat_id = svc->rev_nat_index;
	key.netns_cookie = 1;
	val.last_used = lab_now();
	val.backend_id = backend_id;
	cilium_lb4_affinity.update(&key, &val);
}

#endif /* LABKIT_SOCK_H */
