/* bpf_redir.c — socket-level redirect, part 2: hand each send of a recorded
 * socket to its peer (`labkit up --sockmap on`).
 *
 *   cil_redir  sk_msg, attached to cilium_sock_ops (BPF_SK_MSG_VERDICT): runs
 *              for every sendmsg() of a socket in the map. The key built
 *              from the sending socket (its own address and port as source,
 *              its peer's as destination) is the key bpf_sockops.c stored the
 *              peer under; bpf_msg_redirect_hash with BPF_F_INGRESS queues the
 *              data on the peer's receive side. No segment is built, so no
 *              data packet reaches the veths' tc hooks, nor conntrack.
 *
 * Cilium 1.4-1.13's bpf/sockops/bpf_redir.c (bpf_redir_proxy): the same key
 * and flags; it also asked policy_sk_egress each time and redirected only
 * when policy allowed (verdict >= 0). The lab leaves policy to the handshake,
 * which still crosses the tc hooks. A send whose peer is not in the map
 * returns SK_PASS without a redirect: it takes the TCP/IP stack.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/sockops.h"

int cil_redir(struct sk_msg_md *msg)
{
	struct sock_key key = {};

	sk_extract4_key(msg->local_ip4, msg->remote_ip4, msg->local_port, msg->remote_port, &key);
	cilium_sock_ops.msg_redirect_hash(msg, &key, BPF_F_INGRESS);
	return SK_PASS;
}
