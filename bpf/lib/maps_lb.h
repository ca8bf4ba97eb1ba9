/* maps_lb.h — the Service maps the agent writes and the datapath reads
 * (lb_types.h): frontends and their slots, backends, reverse NAT, session
 * affinity, socket LB's reverse map, and Maglev tables.
 */
#ifndef LABKIT_MAPS_LB_H
#define LABKIT_MAPS_LB_H

#include "lb_types.h"

#ifndef LB_MAP_SIZE
#define LB_MAP_SIZE 65536
#endif
/* Cilium's --bpf-sock-rev-map-max default, SockRevNATMapEntriesDefault =
 * CTMapEntriesGlobalAnyDefault (2 << 17): "sock rev NAT is mostly used for UDP
 * and getpeername only". A constant there too, not tied to the CT map's size. */
#ifndef LB4_REVERSE_NAT_SK_MAP_SIZE
#define LB4_REVERSE_NAT_SK_MAP_SIZE 262144
#endif

/* Services: slot 0 is the head (count, rev_nat_index, flags), slots 1.. the backends. */
BPF_F_TABLE("hash", struct lb4_key, struct lb4_service, cilium_lb4_services_v2, LB_MAP_SIZE, 0);
BPF_F_TABLE("hash", __u32, struct lb4_backend, cilium_lb4_backends_v3, LB_MAP_SIZE, 0);
/* rev_nat_index (network byte order) → the service's VIP:port, for replies. */
BPF_F_TABLE("hash", __be16, struct lb4_reverse_nat, cilium_lb4_reverse_nat, LB_MAP_SIZE, 0);
/* Session affinity: client → backend. */
BPF_F_TABLE("lru_hash", struct lb4_affinity_key, struct lb_affinity_val, cilium_lb4_affinity, LB_MAP_SIZE, 0);
/* Session affinity: which backends each affinity service has (value unused). */
BPF_F_TABLE("hash", struct lb_affinity_match, __u8, cilium_lb_affinity_match, LB_MAP_SIZE, 0);
/* Socket LB: {socket, backend} → the VIP its connect() or sendto() asked for. */
BPF_F_TABLE("lru_hash", struct ipv4_revnat_tuple, struct ipv4_revnat_entry, cilium_lb4_reverse_sk,
	    LB4_REVERSE_NAT_SK_MAP_SIZE, 0);
/* Maglev: service id (rev_nat_index, network byte order) → its lookup table. An outer hash
 * of inner arrays, as Cilium's; the agent creates one inner map per table. The
 * template only tells the kernel what the inner maps look like. */
BPF_ARRAY(labkit_maglev_inner, struct lb4_maglev_lut, 1);
BPF_HASH_OF_MAPS(cilium_lb4_maglev, __be16, "labkit_maglev_inner", LB_MAP_SIZE);

#endif /* LABKIT_MAPS_LB_H */
