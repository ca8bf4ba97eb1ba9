/* maps_eps.h — the endpoint maps the agent writes (eps_types.h): this node's
 * pods in cilium_lxc, every address the cluster knows in cilium_ipcache.
 */
#ifndef LABKIT_MAPS_EPS_H
#define LABKIT_MAPS_EPS_H

#include "eps_types.h"

#define ENDPOINTS_MAP_SIZE 256
#define IPCACHE_MAP_SIZE 4096

/* Local pods of this node. */
BPF_F_TABLE("hash", struct endpoint_key, struct endpoint_info, cilium_lxc, ENDPOINTS_MAP_SIZE, 0);
/* Every address the cluster knows: identity and the node hosting it. */
BPF_F_TABLE("lpm_trie", struct ipcache_key, struct remote_endpoint_info, cilium_ipcache, IPCACHE_MAP_SIZE,
	    BPF_F_NO_PREALLOC);

#endif /* LABKIT_MAPS_EPS_H */
