/* maps_sockops.h — cilium_sock_ops, the sockhash bpf_sockops.c fills and
 * bpf_redir.c redirects through. Only builds with ENABLE_SOCKMAP include it.
 *
 * The value is the socket itself: userspace reads back a socket's cookie
 * (BPF_MAP_TYPE_SOCKHASH with a 4-byte value; Cilium's size_value is
 * sizeof(int)). The kernel removes a socket's entry when the socket closes.
 */
#ifndef LABKIT_MAPS_SOCKOPS_H
#define LABKIT_MAPS_SOCKOPS_H

#include "sockops_types.h"

BPF_SOCKHASH(cilium_sock_ops, struct sock_key, SOCKOPS_MAP_SIZE);

#endif /* LABKIT_MAPS_SOCKOPS_H */
