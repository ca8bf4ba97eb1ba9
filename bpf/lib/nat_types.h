/* nat_types.h — the NAT map's value, laid out byte for byte as Cilium v1.16's
 * struct ipv4_nat_entry (bpf/lib/nat.h there), so labkit's decoders read a
 * real node's cilium_snat_v4_external too. The key is the CT key,
 * struct ipv4_ct_tuple (ct_types.h), but filled *without* the CT's port swap:
 * dport is the packet's destination port, sport its source port.
 *
 *   OUT key (flags TUPLE_F_OUT): the flow as it leaves, before SNAT
 *       {saddr=pod, daddr=remote, sport=pod port, dport=remote port}
 *       → to_addr:to_port is the source it is rewritten to (XLATE_SRC).
 *   IN key (flags TUPLE_F_IN): the reply as it arrives, before reverse NAT
 *       {saddr=remote, daddr=node, sport=remote port, dport=NAT port}
 *       → to_addr:to_port is the destination it is rewritten to (XLATE_DST).
 *
 * Groundwork for NodePort, SNAT and DSR: the map is pinned on every node, but
 * no program reads or writes it yet.
 *
 * Python mirrors these in labkit/maps/nat.py; tests/unit/test_layout.py
 * compares the two from the compiled BTF. Keep in sync with that file.
 */
#ifndef LABKIT_NAT_TYPES_H
#define LABKIT_NAT_TYPES_H

#include "ct_types.h"

/* Max entries of cilium_snat_v4_external: Cilium's --bpf-nat-global-max default. */
#ifndef NAT_MAP_SIZE
#define NAT_MAP_SIZE 524288
#endif

/* Direction of a NAT entry (Cilium's enum nat_dir): the key's flags. */
#define NAT_DIR_EGRESS  0 /* = TUPLE_F_OUT: rewrite the source on the way out */
#define NAT_DIR_INGRESS 1 /* = TUPLE_F_IN: rewrite the destination of replies */

struct ipv4_nat_entry {
	__u64 created;  /* when the entry was made, seconds of the lab clock */
	__u64 needs_ct; /* 1: the flow also needs a CT entry (one bit used) */
	__u64 pad1;     /* unused (Cilium: future use) */
	__u64 pad2;     /* unused (Cilium: future use) */
	/* Cilium names the next two to_saddr/to_sport for OUT keys and
	 * to_daddr/to_dport for IN keys, in a union; the bytes are the same. */
	__be32 to_addr; /* the address written into the packet, network byte order */
	__be16 to_port; /* the port written into the packet, network byte order */
	__u16 pad3;     /* the compiler's tail padding of Cilium's struct, named: 40 bytes */
};

#endif /* LABKIT_NAT_TYPES_H */
