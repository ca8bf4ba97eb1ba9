/* bpf_sock.c — socket-level load balancing on cgroup hooks (Cilium's
 * bpf_sock.c), attached to the cgroups of the pods (socket LB "full") or
 * only of the node's own processes ("hostns").
 *
 *   cil_sock4_connect      cgroup/connect4: a connect() to a Service VIP:port
 *                          is rewritten to a backend before any packet
 *                          exists, so no SVC entry and no per-packet NAT;
 *                          the rewrite is remembered in cilium_lb4_reverse_sk.
 *   cil_sock4_getpeername  cgroup/getpeername4: the socket's peer reads as
 *                          the VIP again.
 *
 * Backends are chosen as Cilium does here: slot = random % count + 1 (never
 * Maglev). A service without backends fails connect() with EHOSTUNREACH.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/lb.h"

#define SYS_REJECT 0
#define SYS_PROCEED 1
#ifndef EHOSTUNREACH
#define EHOSTUNREACH 113
#endif

int cil_sock4_connect(struct bpf_sock_addr *ctx)
{
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry rval = {};
	struct lb4_service *svc, *slot;
	struct lb4_backend *backend;
	__be32 vip = ctx->user_ip4;
	__be16 vport = (__be16)ctx->user_port;
	__u8 proto = ctx->protocol;
	__u8 scope = LB_LOOKUP_SCOPE_EXT;
	__u16 n;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	svc = lb4_lookup_service(vip, vport, proto, 0, scope);
	if (svc && (svc->flags2 & SVC_FLAG_TWO_SCOPES)) {
		scope = LB_LOOKUP_SCOPE_INT; /* eTP=Local lists only local backends outside; sockets are inside */
		svc = lb4_lookup_service(vip, vport, proto, 0, scope);
	}
	if (!svc)
		return SYS_PROCEED;
	if (svc->count == 0) {
		bpf_set_retval(-EHOSTUNREACH);
		return SYS_REJECT;
	}
	n = (bpf_get_prandom_u32() % svc->count) + 1;
	slot = lb4_lookup_service(vip, vport, proto, n, scope);
	if (!slot)
		return SYS_PROCEED;
	backend = lb4_lookup_backend(slot->backend_id);
	if (!backend)
		return SYS_PROCEED;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = backend->address;
	rkey.port = backend->port;
	rval.address = vip;
	rval.port = vport;
	rval.rev_nat_index = svc->rev_nat_index;
	cilium_lb4_reverse_sk.update(&rkey, &rval);

	ctx->user_ip4 = backend->address;
	ctx->user_port = backend->port;
	return SYS_PROCEED;
}

int cil_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = cilium_lb4_reverse_sk.lookup(&rkey);
	if (rval) {
		ctx->user_ip4 = rval->address;
		ctx->user_port = rval->port;
	}
	return SYS_PROCEED;
}
