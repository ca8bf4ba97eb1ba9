/* sockops_types.h — the key of cilium_sock_ops, the sockhash of same-node
 * pod sockets (socket-level redirect, `labkit up --sockmap on`).
 *
 * Cilium's struct sock_key (bpf/sockops/bpf_sockops.h, Cilium 1.4 to 1.13;
 * removed in 1.14): 44 packed bytes, IPv4 addresses in the first word of
 * 16-byte IPv6-sized slots, the family byte and three bytes of zero padding,
 * ports as network-order 16-bit values held in 32-bit fields. Python mirrors it in labkit/maps/sockmap.py. Keep in sync
 * with that file.
 */
#ifndef LABKIT_SOCKOPS_TYPES_H
#define LABKIT_SOCKOPS_TYPES_H

/* Cilium's SOCKOPS_MAP_SIZE (bpf/sockops/sockops_config.h). */
#define SOCKOPS_MAP_SIZE 65535

struct sock_key {
	__be32 sip4;    /* source address: the sending socket's own address */
	__u32 pad1;     /* sip4..pad3: room for an IPv6 address (sip6) */
	__u32 pad2;
	__u32 pad3;
	__be32 dip4;    /* destination address: the sending socket's peer */
	__u32 pad4;     /* dip4..pad6: room for an IPv6 address (dip6) */
	__u32 pad5;
	__u32 pad6;
	__u8 family;    /* ENDPOINT_KEY_IPV4 */
	__u8 pad7;      /* 0: no protocol byte, only TCP sockets reach these hooks
			 * (bpf/sockops/bpf_sockops.h:26-28@c9723a8d, v1.13.0) */
	__u16 pad8;
	__u32 sport;    /* source port, network order in the low 16 bits */
	__u32 dport;    /* destination port, network order in the low 16 bits */
} __attribute__((packed));

#endif /* LABKIT_SOCKOPS_TYPES_H */
