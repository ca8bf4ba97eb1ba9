/* maps.h — every map of a node's datapath, one header per role as Cilium
 * splits them. Names are Cilium's where the map is Cilium's
 * (cilium_ct4_global, ...), labkit_* where it is the lab's own. labkit pins
 * each one at /sys/fs/bpf/labkit/<lab>/<node>/<name>, so every attach-point
 * file includes this header whatever its programs use; lib/ headers include
 * only the role they need.
 *
 *   maps_ct.h   conntrack: cilium_ct4_global, cilium_ct_any4_global
 *   maps_eps.h  endpoints: cilium_lxc, cilium_ipcache
 *   maps_lb.h   Services:  cilium_lb4_services_v2, _backends_v3, _reverse_nat,
 *                          _affinity, _reverse_sk, _maglev
 *   maps_nat.h  NAT:       cilium_snat_v4_external
 *   maps_lab.h  the lab:   labkit_config, labkit_events
 *   maps_policy.h policy:  labkit_policy (per-endpoint policy maps), only
 *                          with ENABLE_POLICY
 */
#ifndef LABKIT_MAPS_H
#define LABKIT_MAPS_H

#include "maps_ct.h"
#include "maps_eps.h"
#include "maps_lb.h"
#include "maps_nat.h"
#include "maps_lab.h"
#ifdef ENABLE_POLICY
#include "maps_policy.h"
#endif

#endif /* LABKIT_MAPS_H */
