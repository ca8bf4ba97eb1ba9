/* eps_types.h — endpoints and the IP cache, the maps the agent writes so the
 * hooks know which addresses are local pods and which node hosts the rest.
 *
 * cilium_lxc: local endpoints (Cilium's struct endpoint_key/endpoint_info).
 * cilium_ipcache: every known address → identity and tunnel endpoint; the
 * IPv4-underlay layout of Cilium's ipcache value (later versions widen
 * tunnel_endpoint to 16 bytes for IPv6 underlays).
 *
 * Python mirrors these in labkit/maps/eps.py. Keep in sync with that file.
 */
#ifndef LABKIT_EPS_TYPES_H
#define LABKIT_EPS_TYPES_H

#define ENDPOINT_KEY_IPV4 1

/* Reserved identities (Cilium's lib/identity.h). */
#define IDENTITY_HOST        1
#define IDENTITY_WORLD       2
#define IDENTITY_REMOTE_NODE 6

struct endpoint_key {
	__be32 ip4;
	__u32 pad1;
	__u32 pad2;
	__u32 pad3;
	__u8 family;     /* ENDPOINT_KEY_IPV4 */
	__u8 key;
	__u16 cluster_id;
} __attribute__((packed));

struct endpoint_info {
	__u32 ifindex;   /* the pod's host-side veth */
	__u16 unused;
	__u16 lxc_id;    /* endpoint id */
	__u32 flags;
	__u64 mac;       /* the pod's MAC: mac_t, 6 bytes in a __u64, so 8-aligned */
	__u64 node_mac;  /* the host-side veth's MAC */
	__u32 sec_id;    /* the pod's security identity */
	__u32 pad[3];
};

/* LPM key: prefixlen counts the bits after it, i.e. 32 bits of
 * cluster_id/pad1/family, then the address prefix. */
#define IPCACHE_PREFIX_LEN(p) (32 + (p))

struct ipcache_key {
	__u32 prefixlen;
	__u16 cluster_id;
	__u8 pad1;
	__u8 family;
	__be32 ip4;
	__u32 pad4;
	__u32 pad5;
	__u32 pad6;
} __attribute__((packed));

#define IPCACHE_F_SKIP_TUNNEL   0x01 /* reachable by native routing */
#define IPCACHE_F_HAS_TUNNEL_EP 0x02

struct remote_endpoint_info {
	__u32 sec_identity;
	__be32 tunnel_endpoint; /* underlay address of the hosting node, 0 = local */
	__u16 pad;
	__u8 key;               /* IPsec key index (unused) */
	__u8 flags;             /* IPCACHE_F_* (Cilium: flag_skip_tunnel:1, ...) */
};

#endif /* LABKIT_EPS_TYPES_H */
