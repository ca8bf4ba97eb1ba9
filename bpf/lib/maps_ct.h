/* maps_ct.h — the conntrack maps (Cilium's cilium_ct4_global and
 * cilium_ct_any4_global), keyed by struct ipv4_ct_tuple (ct_types.h).
 * Sizes come from the node's build macros (labkit/datapath/source.py).
 */
#ifndef LABKIT_MAPS_CT_H
#define LABKIT_MAPS_CT_H

#include "ct_types.h"

#ifndef CT_MAP_SIZE_TCP
#define CT_MAP_SIZE_TCP 524288
#endif
#ifndef CT_MAP_SIZE_ANY
#define CT_MAP_SIZE_ANY 262144
#endif

/* TCP connections. */
BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ct_entry, cilium_ct4_global, CT_MAP_SIZE_TCP, 0);
/* Everything else: UDP, ICMP, and the RELATED twins of every entry. */
BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ct_entry, cilium_ct_any4_global, CT_MAP_SIZE_ANY, 0);

#endif /* LABKIT_MAPS_CT_H */
