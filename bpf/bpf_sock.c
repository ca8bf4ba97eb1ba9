/* bpf_sock.c — socket-level load balancing on cgroup hooks (Cilium v1.16's
 * bpf_sock.c), attached to the cgroups of the pods (socket LB "full") or
 * only of the node's own processes ("hostns").
 *
 *   cil_sock4_connect      cgroup/connect4: a connect() (TCP, or UDP that is
 *                          connected) to a Service VIP:port is rewritten to a
 *                          backend before any packet exists, so no SVC entry
 *                          and no per-packet NAT.
 *   cil_sock4_sendmsg      cgroup/sendmsg4: the same for each datagram of an
 *                          unconnected UDP socket (sendto() naming the VIP).
 *   cil_sock4_recvmsg      cgroup/recvmsg4: recvfrom() reports the VIP:port
 *                          as the source of the backend's reply.
 *   cil_sock4_getpeername  cgroup/getpeername4: the socket's peer reads as
 *                          the VIP again.
 *
 * Every forward rewrite is remembered in cilium_lb4_reverse_sk under
 * {socket cookie, backend address, backend port}; the reverse hooks look it
 * up there (Cilium's __sock4_xlate_rev). A TCP connect() picks slot
 * random % count + 1, a UDP socket slot cookie % count + 1 (sock_select_slot
 * in lib/sock.h); never Maglev. A service without backends fails connect()
 * and sendto() with EHOSTUNREACH.
 *
 * A connect() to a node's address (this node's or another's, by its
 * ipcache identity host or remote-node) on a port of the NodePort range that
 * is no frontend here, since each node's maps hold only its own NodePort
 * addresses, takes the NodePort's surrogate frontend 0.0.0.0:port (Cilium's
 * sock4_wildcard_lookup_full, NodePort part).
 *
 * Left out, as labkit has no use for them: the health-check redirect
 * (__sock4_health_fwd), L7 load balancers, the hostPort half of the wildcard
 * lookup and its loopback case (127.0.0.0/8 from the host namespace), and
 * bind4 / post_bind4 (health-check binds; refusing a bind() on a NodePort).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/encap.h"
#include "lib/lb.h"
#include "lib/sock.h"

#define SYS_REJECT 0
#define SYS_PROCEED 1
#ifndef ENXIO
#define ENXIO 6
#endif
#ifndef ENOENT
#define ENOENT 2
#endif
#ifndef ENOMEM
#define ENOMEM 12
#endif
#ifndef EPERM
#define EPERM 1
#endif
#ifndef ENOTSUP
#define ENOTSUP 95
#endif
#ifndef EHOSTUNREACH
#define EHOSTUNREACH 113
#endif
/* Cilium's node_config.h defaults (the agent writes its --node-port-range). */
#ifndef NODEPORT_PORT_MIN
#define NODEPORT_PORT_MIN 30000
#endif
#ifndef NODEPORT_PORT_MAX
#define NODEPORT_PORT_MAX 32767
#endif

/* Cilium's sock4_wildcard_lookup(key, include_remote_hosts = true, inv_match =
 * false) under sock4_wildcard_lookup_full: a node's address (identity host or
 * remote-node in the ipcache) on a NodePort-range port reads the surrogate
 * frontend 0.0.0.0:port, in the scope a socket reads (internal for two-scope
 * frontends); only a NodePort frontend counts. NULL otherwise. */
static __always_inline struct lb4_service *sock4_wildcard_lookup(__be32 addr, __be16 port, __u8 proto, __u8 *scope)
{
	struct remote_endpoint_info *info;
	__u16 p = lk_ntohs(port);
	struct lb4_service *svc;

	if (p < NODEPORT_PORT_MIN || p > NODEPORT_PORT_MAX)
		return NULL;
	info = ipcache_lookup4(addr);
	if (!info || (info->sec_identity != IDENTITY_HOST && info->sec_identity != IDENTITY_REMOTE_NODE))
		return NULL;
	*scope = LB_LOOKUP_SCOPE_EXT;
	svc = lb4_lookup_service(0, port, proto, 0, LB_LOOKUP_SCOPE_EXT);
	if (svc && (svc->flags2 & SVC_FLAG_TWO_SCOPES)) {
		*scope = LB_LOOKUP_SCOPE_INT;
		svc = lb4_lookup_service(0, port, proto, 0, LB_LOOKUP_SCOPE_INT);
	}
	return svc && (svc->flags & SVC_FLAG_NODEPORT) ? svc : NULL;
}

/* Cilium's sock4_update_revnat: write only when the entry differs, so a busy
 * UDP socket does not rewrite the same LRU entry on every datagram. */
static __always_inline int sock4_update_revnat(struct bpf_sock_addr *ctx, const struct lb4_backend *backend,
					       __be32 vip, __be16 vport, __be16 rev_nat_index)
{
	struct ipv4_revnat_entry val = {}, *tmp;
	struct ipv4_revnat_tuple key = {};

	key.cookie = sock_local_cookie(ctx);
	key.address = backend->address;
	key.port = backend->port;
	val.address = vip;
	val.port = vport;
	val.rev_nat_index = rev_nat_index;
	tmp = cilium_lb4_reverse_sk.lookup(&key);
	if (tmp && tmp->address == val.address && tmp->port == val.port && tmp->rev_nat_index == val.rev_nat_index)
		return 0;
	return cilium_lb4_reverse_sk.update(&key, &val);
}

/* Cilium's sock4_skip_xlate: an externalIP, or a hostPort on an address that
 * is not loopback, is translated only when the address is this node's own
 * (identity host), "because we don't want a k8s service to easily do MITM
 * attacks for a public IP address". A ClusterIP never skips. */
static __always_inline bool sock4_skip_xlate(const struct lb4_service *svc, __be32 address)
{
	if ((svc->flags & SVC_FLAG_EXTERNAL_IP) || ((svc->flags & SVC_FLAG_HOSTPORT) && !is_v4_loopback(address))) {
		struct remote_endpoint_info *info = ipcache_lookup4(address);

		if (!info || info->sec_identity != IDENTITY_HOST)
			return true;
	}
	return false;
}

/* Cilium's sock4_skip_xlate_if_same_netns: a local-redirect service whose
 * chosen backend is a socket of the caller's own namespace (the backend
 * itself calling the frontend) stays untranslated. */
static __always_inline bool sock4_skip_xlate_if_same_netns(struct bpf_sock_addr *ctx,
							   const struct lb4_backend *backend)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_sock *sk = NULL;

	tuple.ipv4.daddr = backend->address;
	tuple.ipv4.dport = backend->port;
	switch (ctx->protocol) {
	case IPPROTO_TCP:
		sk = bpf_sk_lookup_tcp(ctx, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
		break;
	case IPPROTO_UDP:
		sk = bpf_sk_lookup_udp(ctx, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
		break;
	}
	if (sk) {
		bpf_sk_release(sk);
		return true;
	}
	return false;
}

/* Cilium v1.16's __sock4_xlate_fwd: the forward translation of connect() and
 * sendmsg(). 0 when the destination was rewritten to a backend; a negative
 * errno otherwise, of which only -EHOSTUNREACH and -ENOMEM fail the call. */
static __always_inline int __sock4_xlate_fwd(struct bpf_sock_addr *ctx, const bool udp_only)
{
	__u64 netns_cookie = bpf_get_netns_cookie(ctx);
	__be32 vip = ctx->user_ip4, frontend = vip; /* frontend: 0 when the surrogate answered */
	__be16 vport = ctx_dst_port(ctx);
	__u8 proto = ctx->protocol;
	__u8 scope = LB_LOOKUP_SCOPE_EXT;
	struct lb4_service *svc, *backend_slot;
	struct lb4_backend *backend = NULL;
	bool backend_from_affinity = false;
	__u32 backend_id = 0;
	__u16 slot;

	if (!udp_only && !sock_proto_enabled(proto))
		return -ENOTSUP;
	if (lab_fault(FAULT_SOCK_LB_OFF))
		return -ENXIO; /* the fault: the socket goes where it asked */
	/* lb4_lookup_service(&key, true, false): scope switch on (a socket is
	 * inside the cluster, so a two-scope frontend reads its internal scope),
	 * and a head is returned even with no backends, to answer for it here. */
	svc = lb4_lookup_service(vip, vport, proto, 0, scope);
	if (svc && (svc->flags2 & SVC_FLAG_TWO_SCOPES)) {
		scope = LB_LOOKUP_SCOPE_INT;
		svc = lb4_lookup_service(vip, vport, proto, 0, scope);
	}
	if (!svc) {
		svc = sock4_wildcard_lookup(vip, vport, proto, &scope);
		frontend = 0;
	}
	if (!svc)
		return -ENXIO;
	if (svc->count == 0)
		return lab_fault(FAULT_SOCK_NO_REJECT) ? -ENXIO : -EHOSTUNREACH;
	if (sock4_skip_xlate(svc, vip))
		return -EPERM;

	if (svc->flags & SVC_FLAG_AFFINITY) {
		backend_id = lb4_affinity_backend_id_by_netns(svc, netns_cookie);
		backend_from_affinity = true;
		if (backend_id != 0) {
			backend = lb4_lookup_backend(backend_id);
			if (!backend)
				backend_id = 0;
		}
	}
	if (backend_id == 0) {
		backend_from_affinity = false;
		slot = (sock_select_slot(ctx) % svc->count) + 1;
		backend_slot = lb4_lookup_service(frontend, vport, proto, slot, scope);
		if (!backend_slot)
			return -EHOSTUNREACH;
		backend_id = backend_slot->backend_id;
		backend = lb4_lookup_backend(backend_id);
	}
	if (!backend)
		return -EHOSTUNREACH;

	if ((svc->flags2 & SVC_FLAG_LOCALREDIRECT) && sock4_skip_xlate_if_same_netns(ctx, backend))
		return -ENXIO;
	if ((svc->flags & SVC_FLAG_AFFINITY) && !backend_from_affinity)
		lb4_update_affinity_by_netns(svc, netns_cookie, backend_id);
	if (sock4_update_revnat(ctx, backend, vip, vport, svc->rev_nat_index) < 0)
		return -ENOMEM;

	ctx->user_ip4 = backend->address;
	ctx_set_port(ctx, backend->port);
	return 0;
}

/* Cilium v1.16's __sock4_xlate_rev: the peer a reply came from (recvmsg) or
 * a socket is connected to (getpeername) is the backend this socket's
 * forward translation chose; report the VIP:port instead. An entry whose
 * service is gone, has another id now, or has no backends left is stale and
 * deleted, and the backend's address shows. */
static __always_inline int __sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct ipv4_revnat_tuple key = {};
	struct ipv4_revnat_entry *val;
	struct lb4_service *svc;

	if (lab_fault(FAULT_NO_GETPEERNAME))
		return -ENXIO; /* the fault: the peer shows as the backend */
	key.cookie = sock_local_cookie(ctx);
	key.address = ctx->user_ip4;
	key.port = ctx_dst_port(ctx);
	val = cilium_lb4_reverse_sk.lookup(&key);
	if (!val)
		return -ENXIO;
	svc = lb4_lookup_service(val->address, val->port, ctx->protocol, 0, LB_LOOKUP_SCOPE_EXT);
	if (svc && (svc->flags2 & SVC_FLAG_TWO_SCOPES))
		svc = lb4_lookup_service(val->address, val->port, ctx->protocol, 0, LB_LOOKUP_SCOPE_INT);
	if (!svc) {
		__u8 scope;

		svc = sock4_wildcard_lookup(val->address, val->port, ctx->protocol, &scope);
	}
	if (!svc || svc->rev_nat_index != val->rev_nat_index || svc->count == 0) {
		cilium_lb4_reverse_sk.delete(&key);
		return -ENOENT;
	}
	ctx->user_ip4 = val->address;
	ctx_set_port(ctx, val->port);
	return 0;
}

int cil_sock4_connect(struct bpf_sock_addr *ctx)
{
	int err = __sock4_xlate_fwd(ctx, false);

	if (err == -EHOSTUNREACH || err == -ENOMEM) {
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* The kernel runs sendmsg4 only for a datagram that names its destination
 * (an unconnected socket's sendto/sendmsg); a connected UDP socket was
 * translated once, at connect(). */
int cil_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	int err = __sock4_xlate_fwd(ctx, true);

	if (err == -EHOSTUNREACH || err == -ENOMEM) {
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* recvmsg4 and getpeername4 may only proceed (the verifier holds them to 1). */
int cil_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	__sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

int cil_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	__sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}
