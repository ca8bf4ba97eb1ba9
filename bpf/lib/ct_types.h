/* ct_types.h — connection-tracking key and value, laid out byte for byte as
 * Cilium v1.16's struct ipv4_ct_tuple and struct ct_entry (bpf/lib/common.h
 * there), so labkit's decoders read a real node's pinned maps too.
 *
 * Python mirrors these in labkit/maps/ct.py; tests/unit/test_layout.py
 * compares the two from the compiled BTF. Keep in sync with that file.
 */
#ifndef LABKIT_CT_TYPES_H
#define LABKIT_CT_TYPES_H

/* Key flags (ipv4_ct_tuple.flags). */
#define TUPLE_F_OUT     0  /* created at the client's egress */
#define TUPLE_F_IN      1  /* created at the server's ingress */
#define TUPLE_F_RELATED 2  /* ICMP errors about the flow (twin in the any map) */
#define TUPLE_F_SERVICE 4  /* service lookup at the client (SVC rows) */

/* Direction of a lookup (enum ct_dir). */
#define CT_EGRESS  0
#define CT_INGRESS 1
#define CT_SERVICE 2

/* Lookup results (enum ct_status). CT_REOPENED is gone since v1.16: a SYN on
 * a closing entry resets it and the lookup answers CT_NEW. */
#define CT_NEW         0
#define CT_ESTABLISHED 1
#define CT_REPLY       2
#define CT_RELATED     3
#define CT_NONE        0xff /* labkit: no lookup at this hook (trace only) */

/* The u16 flag word at offset 36 of struct ct_entry. Cilium declares these as
 * bitfields (rx_closing:1, tx_closing:1, ...); the bits are the same. */
#define CT_F_RX_CLOSING     0x0001
#define CT_F_TX_CLOSING     0x0002
#define CT_F_NAT64          0x0004 /* reserved in v1.16, printed as Nat64 */
#define CT_F_LB_LOOPBACK    0x0008
#define CT_F_SEEN_NON_SYN   0x0010
#define CT_F_NODE_PORT      0x0020
#define CT_F_PROXY_REDIRECT 0x0040
#define CT_F_DSR_INTERNAL   0x0080
#define CT_F_FROM_L7LB      0x0100
#define CT_F_RESERVED9      0x0200
#define CT_F_FROM_TUNNEL    0x0400

struct ipv4_ct_tuple {
	__be32 daddr;   /* stored keys hold the *reply* direction's destination */
	__be32 saddr;
	/* The four port bytes are read from the L4 header in one load, so dport
	 * holds the packet's source port and sport its destination port. */
	__be16 dport;
	__be16 sport;
	__u8 nexthdr;   /* IP protocol */
	__u8 flags;     /* TUPLE_F_* */
} __attribute__((packed));

struct ct_entry {
	__u64 reserved0;      /* unused since v1.16 (was rx_packets) */
	__u64 backend_id;     /* SVC entries: the backend chosen for the flow */
	__u64 packets;        /* every packet that found this entry, both ways */
	__u64 bytes;          /* their skb->len */
	__u32 lifetime;       /* absolute expiry, seconds of the lab clock */
	__u16 flags;          /* CT_F_* */
	__be16 rev_nat_index; /* service id for reverse NAT, network byte order */
	__u16 ifindex;
	__u8 tx_flags_seen;   /* TCP flags OR-ed over egress and service packets */
	__u8 rx_flags_seen;   /* ... and over ingress packets */
	__u32 src_sec_id;     /* security identity of the source */
	__u32 last_tx_report; /* lab-clock second of the last egress report */
	__u32 last_rx_report; /* ... ingress */
};

/* What a lookup learnt, for the caller and the trace (Cilium's ct_state,
 * plus the entry's state after this packet). Not stored in a map. */
struct ct_state {
	__u64 backend_id;
	__u32 lifetime;
	__u32 src_sec_id;
	__u16 rev_nat_index;
	__u16 flags;
	__u8 tx_flags_seen;
	__u8 rx_flags_seen;
	__u8 syn;     /* the packet that found the entry was a SYN (Cilium's ct_state.syn) */
	__u8 monitor; /* the lookup's 'monitor' output was non-zero: report this packet (aggregation) */
};

#endif /* LABKIT_CT_TYPES_H */
