/* encap.h — tunnel mode: find the node hosting a destination in
 * cilium_ipcache and hand the packet to cilium_vxlan with that node as the
 * tunnel endpoint (flow-based VXLAN, as Cilium does; VNI = source identity). */
#ifndef LABKIT_ENCAP_H
#define LABKIT_ENCAP_H

#include "maps_eps.h"
#include "clock.h"

static __always_inline struct remote_endpoint_info *ipcache_lookup4(__be32 addr)
{
	struct ipcache_key key = {};

	key.prefixlen = IPCACHE_PREFIX_LEN(32);
	key.family = ENDPOINT_KEY_IPV4;
	key.ip4 = addr;
	return cilium_ipcache.lookup(&key);
}

static __always_inline __u32 ipcache_identity4(__be32 addr)
{
	struct remote_endpoint_info *info = ipcache_lookup4(addr);

	return info ? info->sec_identity : IDENTITY_WORLD;
}

static __always_inline struct endpoint_info *lookup_endpoint4(__be32 addr)
{
	struct endpoint_key key = {};

	key.ip4 = addr;
	key.family = ENDPOINT_KEY_IPV4;
	return cilium_lxc.lookup(&key);
}

/* Set the tunnel key for daddr's node. 0 when set, 1 when daddr is not
 * behind a tunnel (local, native-routed or unknown), <0 on error. */
static __always_inline int tunnel_key_set4(struct __sk_buff *skb, __be32 daddr, __u32 identity,
					   struct trace_event *ev)
{
	struct remote_endpoint_info *info = ipcache_lookup4(daddr);
	struct bpf_tunnel_key key = {};

	if (!info || !info->tunnel_endpoint || (info->flags & IPCACHE_F_SKIP_TUNNEL))
		return 1;
	if (lab_fault(FAULT_NO_TUNNEL))
		return DROP_NO_TUNNEL_ENDPOINT;
	key.remote_ipv4 = lk_ntohl(info->tunnel_endpoint); /* host byte order */
	key.tunnel_id = identity;
	key.tunnel_ttl = 64;
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX) < 0)
		return DROP_WRITE_ERROR;
	ev->tunnel_endpoint = info->tunnel_endpoint;
	return 0;
}

#endif /* LABKIT_ENCAP_H */
