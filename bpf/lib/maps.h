/* maps.h — every map of a node's datapath. Names are Cilium's where the map
 * is Cilium's (cilium_ct4_global, ...), labkit_* where it is the lab's own.
 * labkit pins each one at /sys/fs/bpf/labkit/<lab>/<node>/<name>.
 *
 * Sizes come from the node's build macros (labkit/datapath/source.py).
 */
#ifndef LABKIT_MAPS_H
#define LABKIT_MAPS_H

#include "ct_types.h"
#include "eps_types.h"
#include "config_types.h"
#include "trace_types.h"
#include "lb_types.h"
#include "nat_types.h"

#ifndef CT_MAP_SIZE_TCP
#define CT_MAP_SIZE_TCP 524288
#endif
#ifndef CT_MAP_SIZE_ANY
#define CT_MAP_SIZE_ANY 262144
#endif
#define ENDPOINTS_MAP_SIZE 256
#define IPCACHE_MAP_SIZE 4096
#define EVENTS_RING_PAGES 256 /* 1 MiB of trace records per node */
#ifndef LB_MAP_SIZE
#define LB_MAP_SIZE 65536
#endif
/* Cilium's --bpf-sock-rev-map-max default, SockRevNATMapEntriesDefault =
 * CTMapEntriesGlobalAnyDefault (2 << 17): "sock rev NAT is mostly used for UDP
 * and getpeername only". A constant there too, not tied to the CT map's size. */
#ifndef LB4_REVERSE_NAT_SK_MAP_SIZE
#define LB4_REVERSE_NAT_SK_MAP_SIZE 262144
#endif

/* TCP connections. */
BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ct_entry, cilium_ct4_global, CT_MAP_SIZE_TCP, 0);
/* Everything else: UDP, ICMP, and the RELATED twins of every entry. */
BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ct_entry, cilium_ct_any4_global, CT_MAP_SIZE_ANY, 0);
/* Local pods of this node. */
BPF_F_TABLE("hash", struct endpoint_key, struct endpoint_info, cilium_lxc, ENDPOINTS_MAP_SIZE, 0);
/* Every address the cluster knows: identity and the node hosting it. */
BPF_F_TABLE("lpm_trie", struct ipcache_key, struct remote_endpoint_info, cilium_ipcache, IPCACHE_MAP_SIZE,
	    BPF_F_NO_PREALLOC);
/* Services: slot 0 is the head (count, rev_nat_index, flags), slots 1.. the backends. */
BPF_F_TABLE("hash", struct lb4_key, struct lb4_service, cilium_lb4_services_v2, LB_MAP_SIZE, 0);
BPF_F_TABLE("hash", __u32, struct lb4_backend, cilium_lb4_backends_v3, LB_MAP_SIZE, 0);
/* rev_nat_index (network byte order) → the service's VIP:port, for replies. */
BPF_F_TABLE("hash", __be16, struct lb4_reverse_nat, cilium_lb4_reverse_nat, LB_MAP_SIZE, 0);
/* Session affinity: client → backend. */
BPF_F_TABLE("lru_hash", struct lb4_affinity_key, struct lb_affinity_val, cilium_lb4_affinity, LB_MAP_SIZE, 0);
/* Socket LB: {socket, backend} → the VIP its connect() or sendto() asked for. */
BPF_F_TABLE("lru_hash", struct ipv4_revnat_tuple, struct ipv4_revnat_entry, cilium_lb4_reverse_sk,
	    LB4_REVERSE_NAT_SK_MAP_SIZE, 0);
/* Maglev: service id (rev_nat_index, network byte order) → its lookup table. An outer hash
 * of inner arrays, as Cilium's; the agent creates one inner map per table. The
 * template only tells the kernel what the inner maps look like. */
BPF_ARRAY(labkit_maglev_inner, struct lb4_maglev_lut, 1);
BPF_HASH_OF_MAPS(cilium_lb4_maglev, __be16, "labkit_maglev_inner", LB_MAP_SIZE);
/* SNAT/DNAT state for NodePort SNAT and DSR (nat_types.h); key = CT tuple, ports not swapped. */
BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ipv4_nat_entry, cilium_snat_v4_external, NAT_MAP_SIZE, 0);
/* Lab clock offset, faults, trace mode. */
BPF_ARRAY(labkit_config, struct lab_config, 1);
/* One struct trace_event per packet per hook. */
BPF_RINGBUF_OUTPUT(labkit_events, EVENTS_RING_PAGES);

#endif /* LABKIT_MAPS_H */
