/* proxy.h — hand a pod's packet to a proxy socket in the node (the DNS proxy).
 *
 * Cilium v1.16 (bpf/lib/proxy.h ctx_redirect_to_proxy4 and assign_socket_udp,
 * with --enable-bpf-tproxy): when the policy entry that allowed a packet
 * carries a proxy port, the program looks up the proxy's socket with the
 * packet's own addresses but the proxy port as destination port
 * (bpf_sk_lookup_udp), assigns the packet to it (bpf_sk_assign), and marks it
 * MARK_MAGIC_TO_PROXY with the port in the upper 16 bits (__ctx_redirect_to_proxy);
 * the agent's ip rule
 * (priority 9, fwmark 0x200/0xf00 → table 2004: linux_defaults
 * RulePriorityToProxyIngress, RouteTableToProxy) routes every marked packet locally
 * (table 2004: local 0.0.0.0/0 dev lo), so the stack delivers it to the
 * assigned socket although its destination address is not the node's.
 * Without bpf tproxy v1.16 leaves the socket to iptables' TPROXY target
 * instead; labkit uses the bpf_sk_assign way only, from cil_from_container
 * (the pod's veth, tc ingress), and only for UDP (the DNS proxy's protocol;
 * Cilium also assigns TCP to its proxies' listeners).
 *
 * Differences from Cilium: the proxy socket lives in the node's network
 * namespace (the lab's nodes are namespaces; Cilium's proxy is in the host's),
 * and the packet keeps going up the stack from the veth's tc ingress instead
 * of being handed to cilium_host first.
 */
#ifndef LABKIT_PROXY_H
#define LABKIT_PROXY_H

#include "common.h"
#include "parse.h"
#include "trace_types.h"

/* Cilium's MARK_MAGIC_TO_PROXY (bpf/lib/common.h, v1.16) and the mask its ip
 * rule matches with (MARK_MAGIC_HOST_MASK). */
#define MARK_MAGIC_TO_PROXY   0x0200
#define MARK_MAGIC_HOST_MASK  0x0F00

/* Assign a UDP packet of the pod to the proxy socket listening on
 * proxy_port (host order). 0, DROP_PROXY_LOOKUP_FAILED (no such socket) or
 * DROP_PROXY_SET_FAILED (the kernel refused the assignment). */
static __always_inline int proxy_assign_udp4(struct __sk_buff *skb, const struct pkt4 *p, __u16 proxy_port)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_sock *sk;
	int err;

	if (p->proto != IPPROTO_UDP)
		return DROP_PROXY_UNKNOWN_PROTO;
	tuple.ipv4.saddr = p->saddr;
	tuple.ipv4.sport = p->sport;
	tuple.ipv4.daddr = p->daddr;
	tuple.ipv4.dport = lk_htons(proxy_port);
	sk = bpf_sk_lookup_udp(skb, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return DROP_PROXY_LOOKUP_FAILED;
	err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (err)
		return DROP_PROXY_SET_FAILED;
	/* as __ctx_redirect_to_proxy: the port as the policy entry holds it
	 * (network order) in the upper half */
	skb->mark = MARK_MAGIC_TO_PROXY | ((__u32)lk_htons(proxy_port) << 16);
	return 0;
}

#endif /* LABKIT_PROXY_H */
