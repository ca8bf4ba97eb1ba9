/* common.h — what every labkit BPF file needs first: kernel UAPI headers,
 * byte order helpers and the small constants shared by all hooks.
 *
 * labkit programs are compiled by BCC once per node (see
 * labkit/datapath/source.py); the node's options arrive as -D macros, the
 * way Cilium compiles node_config.h into its objects.
 */
#ifndef LABKIT_COMMON_H
#define LABKIT_COMMON_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/if_packet.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/icmp.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* BPF runs little-endian on every host labkit supports (x86_64, arm64). */
#define lk_htons(x) ((__be16)__builtin_bswap16((__u16)(x)))
#define lk_ntohs(x) ((__u16)__builtin_bswap16((__u16)(x)))
#define lk_htonl(x) ((__be32)__builtin_bswap32((__u32)(x)))
#define lk_ntohl(x) ((__u32)__builtin_bswap32((__u32)(x)))

/* TCP flag byte (byte 13 of the TCP header). */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_PSH 0x08
#define TCP_FLAG_ACK 0x10
#define TCP_FLAG_URG 0x20
#define TCP_FLAG_ECE 0x40
#define TCP_FLAG_CWR 0x80

#define LK_NSEC_PER_SEC 1000000000ULL

/* skb->mark bits labkit's hooks pass to each other across the node's routing
 * (Cilium passes the same facts in skb->cb within a tail call). Chosen apart
 * from Cilium's MARK_MAGIC_* nibble and kube-proxy's 0x4000 masquerade bit. */
#define MARK_FROM_OVERLAY 0x40000000 /* decapsulated by cilium_vxlan (CB_FROM_TUNNEL) */

#endif /* LABKIT_COMMON_H */
