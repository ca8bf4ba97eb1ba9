/* policy_types.h — the per-endpoint policy map's rows (Cilium v1.16's
 * struct policy_key / struct policy_entry, bpf/lib/common.h there) and the
 * numbers a policy verdict carries.
 *
 * Python mirrors these in labkit/maps/policy.py (PolicyKey, PolicyEntry,
 * PolicyFlags) and labkit/constants.py (PolicyMatch). Keep in sync with those
 * files; tests/unit/test_constants.py compares the numbers. The drop reasons
 * DROP_POLICY and DROP_POLICY_DENY live with the others in trace_types.h.
 */
#ifndef LABKIT_POLICY_TYPES_H
#define LABKIT_POLICY_TYPES_H

#include "trace_types.h"

/* Default size of one endpoint's map (Cilium's policy-map-max-entries). */
#ifndef POLICY_MAP_SIZE
#define POLICY_MAP_SIZE 16384
#endif

/* Direction of a verdict, as Cilium's policy verdict notification carries it
 * (POLICY_INGRESS / POLICY_EGRESS of bpf/lib/policy_log.h). */
#define POLICY_INGRESS 1
#define POLICY_EGRESS  2

/* Which of the six lookups of __policy_can_access matched (v1.16's
 * POLICY_MATCH_* in bpf/lib/common.h; pkg/monitor/api PolicyMatchType prints
 * them: none, L3-Only, L3-L4, L4-Only, all, L3-Proto, Proto-Only). */
#define POLICY_MATCH_NONE       0
#define POLICY_MATCH_L3_ONLY    1
#define POLICY_MATCH_L3_L4      2
#define POLICY_MATCH_L4_ONLY    3
#define POLICY_MATCH_ALL        4
#define POLICY_MATCH_L3_PROTO   5
#define POLICY_MATCH_PROTO_ONLY 6

/* An LPM-trie key. prefixlen counts the bits after it: 32 of sec_label and 8
 * of the direction byte are always matched; a shorter prefix wildcards the
 * port (partly or wholly), then the protocol. Lookups always use the full
 * prefix (POLICY_FULL_PREFIX). */
struct policy_key {
	__u32 prefixlen;  /* struct bpf_lpm_trie_key's header */
	__u32 sec_label;  /* the peer's identity; 0 = any identity */
	__u8 egress:1,    /* 1: the endpoint sends, 0: it receives */
	     pad:7;
	__u8 protocol;    /* IPPROTO_*; 0 = any (only when dport is wildcarded too) */
	__be16 dport;     /* destination port, network byte order */
} __attribute__((packed));

#define POLICY_FULL_PREFIX (8 * (sizeof(struct policy_key) - sizeof(__u32)))

struct policy_entry {
	__be16 proxy_port;          /* L7 redirect port (labkit has no proxy: ignored) */
	__u8 deny:1,                /* a deny rule's entry */
	     wildcard_protocol:1,   /* the key's protocol is wildcarded */
	     wildcard_dport:1,      /* the key's port is wholly wildcarded */
	     pad:5;
	__u8 auth_type;             /* mutual authentication (labkit: ignored) */
	__u16 pad1;
	__u16 pad2;
	__u64 packets;              /* packets this entry decided, counted by the datapath */
	__u64 bytes;                /* their bytes (skb->len) */
};

#endif /* LABKIT_POLICY_TYPES_H */
