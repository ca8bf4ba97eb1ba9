/* bpf_sockops.c — socket-level redirect, part 1: record same-node pod
 * sockets (`labkit up --sockmap on`; Cilium's --sockops-enable).
 *
 *   cil_sockops  cgroup/sock_ops on the cgroup of every pod of the node: when
 *                a TCP socket of a pod becomes established to another pod of
 *                this node, put it in cilium_sock_ops. bpf_redir.c then hands
 *                every send of its peer straight to it.
 *
 * Cilium had this from 1.4 (PR 6013, "Initial sockmap implementation") to
 * 1.13, a beta feature off by default: bpf/sockops/bpf_sockops.c's
 * bpf_sockmap() and bpf_sock_ops_ipv4(). 1.13 deprecated --sockops-enable and
 * 1.14 removed it (issue 23556, PR 23606) because it was no longer maintained.
 * The lab follows 1.13's program, without its L7 proxy branch (the lab has no
 * proxy; Cilium asked policy_sk_egress for a proxy port first).
 *
 * A socket is stored under its *peer's* view of the connection: the key has
 * the addresses and ports swapped. So when the peer sends, the key it builds
 * from its own socket (source = itself, destination = this socket) finds
 * this socket, and its data lands in this socket's receive queue.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/encap.h"
#include "lib/sockops.h"
#include "lib/clock.h"

/* Cilium's bpf_sock_ops_ipv4: only a peer that is a local endpoint
 * (cilium_lxc: a pod of this node) is recorded, with BPF_NOEXIST so an entry
 * already there is kept. Cilium first let Services take the packet path
 * (lb4_lookup_service: "If endpoint a service use L4/L3 stack for now"); the
 * lab needs no such lookup, since a VIP is never in cilium_lxc. (With socket
 * LB the socket's peer is already the backend, which is.) */
static __always_inline void sock_ops_ipv4(struct bpf_sock_ops *skops)
{
	struct sock_key key = {};
	__be32 dip4;
	__u32 dport;

	if (lab_fault(FAULT_SOCK_NO_REDIRECT))
		return; /* as with the program detached: no socket recorded, every send takes the stack */
	sk_extract4_key(skops->local_ip4, skops->remote_ip4, skops->local_port, skops->remote_port, &key);
	if (!lookup_endpoint4(key.dip4))
		return;
	dip4 = key.dip4;
	dport = key.dport;
	key.dip4 = key.sip4;
	key.dport = key.sport;
	key.sip4 = dip4;
	key.sport = dport;
	cilium_sock_ops.sock_hash_update(skops, &key, BPF_NOEXIST);
}

/* Cilium's bpf_sockmap: only the two "established" callbacks, which the
 * kernel calls without being asked (no BPF_SOCK_OPS_*_CB_FLAG needed):
 * ACTIVE for the connect()ing side once the SYN-ACK arrives, PASSIVE for the
 * accepted socket once the handshake's last ACK arrives. */
int cil_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		if (skops->family == 2 /* AF_INET */)
			sock_ops_ipv4(skops);
		break;
	default:
		break;
	}
	/* The kernel ignores what the established callbacks return; 1 is sock_ops' "ok" (Cilium returns 0). */
	return 1;
}
