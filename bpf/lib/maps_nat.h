/* maps_nat.h — cilium_snat_v4_external, the NAT map of NodePort SNAT and DSR
 * (nat_types.h); key = CT tuple with the ports not swapped.
 */
#ifndef LABKIT_MAPS_NAT_H
#define LABKIT_MAPS_NAT_H

#include "ct_types.h"
#include "nat_types.h"

BPF_F_TABLE("lru_hash", struct ipv4_ct_tuple, struct ipv4_nat_entry, cilium_snat_v4_external, NAT_MAP_SIZE, 0);

#endif /* LABKIT_MAPS_NAT_H */
