/* sockops.h — the sock_key of a socket, as bpf_sockops.c (struct
 * bpf_sock_ops) and bpf_redir.c (struct sk_msg_md) both build it.
 */
#ifndef LABKIT_SOCKOPS_H
#define LABKIT_SOCKOPS_H

#include "eps_types.h"
#include "maps_sockops.h"

/* Cilium's sk_extract4_key / sk_msg_extract4_key. Both contexts give
 * local_port in host order and remote_port in network order in the upper 16
 * bits of a 32-bit word; the key holds both as network-order 16-bit values.
 * The ports arrive as whole 32-bit reads (the callers read the context
 * fields into these arguments): Cilium's READ_ONCE "to make sure that a
 * 32-bit read followed by shift is generated", since a 16-bit read of
 * remote_port fails the verifier on many kernels. */
static __always_inline void sk_extract4_key(__be32 local_ip4, __be32 remote_ip4, __u32 local_port,
					    __u32 remote_port, struct sock_key *key)
{
	key->sip4 = local_ip4;
	key->dip4 = remote_ip4;
	key->family = ENDPOINT_KEY_IPV4;
	key->sport = lk_ntohl(local_port) >> 16;
	key->dport = remote_port >> 16;
}

#endif /* LABKIT_SOCKOPS_H */
