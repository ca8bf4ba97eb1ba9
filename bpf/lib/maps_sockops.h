/* maps_sockops.h — cilium_sock_ops, the sockhash bpf_sockops.c fills and
 * bpf_redir.c redirects through, included by lib/sockops.h only: lib/maps.h
 * leaves it out so that builds without sockmap stay byte for byte what they
 * were (labkit pins every map of a build; this one only with ENABLE_SOCKMAP).
 *
 * The value is a socket: sock_hash_update stores the socket the sock_ops
 * program runs for. Cilium's size_value is sizeof(int), and the kernel hands
 * userspace a socket's cookie only for 8-byte values, so userspace lists the
 * keys. The kernel removes a socket's entry when the socket closes.
 */
#ifndef LABKIT_MAPS_SOCKOPS_H
#define LABKIT_MAPS_SOCKOPS_H

#include "sockops_types.h"

BPF_SOCKHASH(cilium_sock_ops, struct sock_key, SOCKOPS_MAP_SIZE);

#endif /* LABKIT_MAPS_SOCKOPS_H */
