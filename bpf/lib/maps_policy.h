/* maps_policy.h — network policy's map: one LPM trie per endpoint (Cilium's
 * cilium_policy_<endpoint id>, policy_types.h), reached through
 * labkit_policy, a hash of maps keyed by the endpoint id (cilium_lxc's
 * lxc_id). Only builds with ENABLE_POLICY include it.
 *
 * Cilium compiles each endpoint's own map into that endpoint's program; labkit
 * compiles one program for every pod of a node, so the program finds the pod's
 * map through the outer map (LAB_DIFFERENCES in labkit/config.py).
 */
#ifndef LABKIT_MAPS_POLICY_H
#define LABKIT_MAPS_POLICY_H

#include "policy_types.h"
#include "maps_eps.h"

/* The template: what every inner map looks like. The agent creates one map
 * like it per endpoint and stores its fd under the endpoint id. */
BPF_F_TABLE("lpm_trie", struct policy_key, struct policy_entry, labkit_policy_inner, POLICY_MAP_SIZE,
	    BPF_F_NO_PREALLOC);
/* Endpoint id (__u32) → that endpoint's policy map. At most one per local
 * endpoint: ENDPOINTS_MAP_SIZE, cilium_lxc's size. */
BPF_HASH_OF_MAPS(labkit_policy, __u32, "labkit_policy_inner", ENDPOINTS_MAP_SIZE);
/* Endpoint id (__u32) → the endpoint's POLICY_VERDICT_LOG_FILTER (__u32):
 * POLICY_INGRESS when it enforces ingress, POLICY_EGRESS when it enforces
 * egress (the agent's pkg/endpoint GetPolicyVerdictLogFilter). Cilium
 * writes it into each endpoint's own program; here the agent writes it
 * beside the endpoint's policy map. */
BPF_HASH(labkit_policy_filter, __u32, __u32, ENDPOINTS_MAP_SIZE);

#endif /* LABKIT_MAPS_POLICY_H */
