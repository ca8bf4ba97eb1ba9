/* policy.h — may this endpoint send to / receive from that identity on this
 * protocol and port? Cilium v1.16's __policy_can_access (bpf/lib/policy.h
 * there): two LPM lookups in the endpoint's policy map, the peer's identity
 * and then identity 0 (any), and six precedence steps between them.
 *
 * The proxy port of the entry that allowed a packet is handed back (the
 * agent's DNS proxy, lib/proxy.h); left out of v1.16's function, on purpose:
 * auth_type (no mutual
 * authentication: never DROP_POLICY_AUTH_REQUIRED), ALLOW_ICMP_FRAG_NEEDED,
 * the CB_POLICY skip mark (set only by Cilium's host firewall and L7 LB) and
 * untracked fragments (fragments are dropped before, DROP_FRAG_NOSUPPORT).
 * policy_can_egress's DROP_ENCAP_PROHIBITED (a pod sending to the tunnel
 * port) is left out too.
 */
#ifndef LABKIT_POLICY_H
#define LABKIT_POLICY_H

#include "maps_policy.h"
#include "encap.h"
#include "proxy.h" /* where an allowed packet with a proxy port goes */
#include "trace.h"

/* The identity of a peer address: cilium_ipcache's, world when the address is
 * unknown or has identity 0 (v1.16 handle_ipv4_from_lxc's "destination
 * category for policy fallback"). */
static __always_inline __u32 policy_peer_id4(__be32 addr)
{
	struct remote_endpoint_info *info = ipcache_lookup4(addr);

	return info && info->sec_identity ? info->sec_identity : IDENTITY_WORLD;
}

/* v1.16 __account_and_check: count the packet on the entry that decided it
 * (both counters, whatever the verdict), then a deny entry drops. */
static __always_inline int policy_account_check(struct policy_entry *entry, __u32 len, __u16 *proxy_port)
{
	__sync_fetch_and_add(&entry->packets, 1);
	__sync_fetch_and_add(&entry->bytes, len);
	if (entry->deny)
		return DROP_POLICY_DENY;
	*proxy_port = lk_ntohs(entry->proxy_port);
	return 0;
}

/* The verdict of endpoint ep_id's map for a packet to/from remote_id. 0
 * (allowed), DROP_POLICY (no entry matches: default deny) or
 * DROP_POLICY_DENY, with *match_type the step that decided; 1 when the
 * endpoint has no policy map at all (allowed, nothing to report). */
static __always_inline int __policy_can_access4(__u32 ep_id, __u32 remote_id, __u8 dir, __u8 proto, __be16 dport,
						__u32 len, __u8 *match_type, __u16 *proxy_port)
{
	struct policy_entry *policy, *l4policy;
	struct policy_key key = {};
	void *map;

	*match_type = POLICY_MATCH_NONE;
	map = labkit_policy.lookup(&ep_id);
	if (!map)
		return 1;
	key.prefixlen = POLICY_FULL_PREFIX; /* look up with every bit; entries wildcard by their prefix */
	key.sec_label = remote_id;
	key.egress = dir == CT_EGRESS;
	key.protocol = proto;
	key.dport = dport;

	/* 1. id/proto/port */
	policy = bpf_map_lookup_elem(map, &key);
	if (policy && !policy->wildcard_dport) {
		*match_type = POLICY_MATCH_L3_L4;
		return policy_account_check(policy, len, proxy_port);
	}
	key.sec_label = 0;
	l4policy = bpf_map_lookup_elem(map, &key);
	/* 2. ANY/proto/port */
	if (l4policy && !l4policy->wildcard_dport) {
		*match_type = POLICY_MATCH_L4_ONLY;
		return policy_account_check(l4policy, len, proxy_port);
	}
	/* 3. id/proto/ANY */
	if (policy && !policy->wildcard_protocol) {
		*match_type = POLICY_MATCH_L3_PROTO;
		return policy_account_check(policy, len, proxy_port);
	}
	/* 4. ANY/proto/ANY */
	if (l4policy && !l4policy->wildcard_protocol) {
		*match_type = POLICY_MATCH_PROTO_ONLY;
		return policy_account_check(l4policy, len, proxy_port);
	}
	/* 5. id/ANY/ANY */
	if (policy) {
		*match_type = POLICY_MATCH_L3_ONLY;
		return policy_account_check(policy, len, proxy_port);
	}
	/* 6. ANY/ANY/ANY */
	if (l4policy) {
		*match_type = POLICY_MATCH_ALL;
		return policy_account_check(l4policy, len, proxy_port);
	}
	return DROP_POLICY;
}

/* The directions whose verdicts endpoint ep_id reports: Cilium's
 * POLICY_VERDICT_LOG_FILTER, which send_policy_verdict_notify tests against
 * the verdict's direction (bpf/lib/policy_log.h). An endpoint the agent wrote
 * no filter for reports both, as the macro's default 0xffff does. */
static __always_inline __u32 policy_verdict_filter(__u32 ep_id)
{
	__u32 *filter = labkit_policy_filter.lookup(&ep_id);

	return filter ? *filter : 0xffff;
}

/* policy_can_egress4 / policy_can_access_ingress, with the trace record as
 * Cilium's policy verdict notification: the verdict, after audit mode turned
 * a drop into an allow. 0 allowed, or the DROP_* reason. The record carries
 * the verdict when Cilium sends one: for drops and for any allowed packet but
 * one of an established connection, in a direction the endpoint's filter
 * names (policy_verdict_filter). *proxy_port is the
 * allowing entry's proxy port (host order), 0 when none or on a drop. */
static __always_inline int policy_verdict4(struct trace_event *ev, __u32 ep_id, __u32 remote_id, __u8 dir,
					   const struct pkt4 *p, __u32 len, int ct_result, __u16 *proxy_port)
{
	/* ENABLE_ICMP_RULE (the agent's --enable-icmp-rules, on by default): an
	 * ICMP packet is looked up with its type in the port's place. */
	__be16 dport = p->proto == IPPROTO_ICMP ? lk_htons(p->icmp_type) : p->dport;
	__u8 match_type, pdir, audited = 0;
	int ret;

	*proxy_port = 0;
	ret = __policy_can_access4(ep_id, remote_id, dir, p->proto, dport, len, &match_type, proxy_port);
	if (ret > 0)
		return 0; /* no policy map: the endpoint is not enforced */
#ifdef POLICY_AUDIT_MODE
	if (ret < 0) {
		ret = 0;
		audited = 1;
	}
#endif
	pdir = dir == CT_EGRESS ? POLICY_EGRESS : POLICY_INGRESS;
	if ((ret < 0 || ct_result != CT_ESTABLISHED) && (policy_verdict_filter(ep_id) & pdir)) {
		__u16 v = pdir | (match_type << POLICY_V_MATCH_SHIFT) | (audited ? POLICY_V_AUDITED : 0) |
			  (ret < 0 ? POLICY_V_DENIED : 0);

		ev->flags |= v << POLICY_V_SHIFT;
		ev->remote_id = remote_id;
		/* send_policy_verdict_notify: an allowed verdict's value is the
		 * proxy port, which Hubble reads as REDIRECTED */
		ev->proxy_port = ret < 0 ? 0 : *proxy_port;
	}
	return ret;
}

#endif /* LABKIT_POLICY_H */
