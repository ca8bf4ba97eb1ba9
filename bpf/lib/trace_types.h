/* trace_types.h — the record every hook writes to labkit_events for every
 * IPv4 packet, and the numbers in it: hooks, verdicts, drop reasons.
 *
 * Python mirrors these in labkit/trace.py and labkit/constants.py; a unit
 * test parses this file and compares. Keep in sync with those files.
 */
#ifndef LABKIT_TRACE_TYPES_H
#define LABKIT_TRACE_TYPES_H

/* Hooks: where a program is attached. */
#define HOOK_FROM_CONTAINER 1 /* tc ingress of lxc-<pod>: packets leaving the pod */
#define HOOK_TO_CONTAINER   2 /* tc egress of lxc-<pod>: packets entering the pod */
#define HOOK_FROM_NETDEV    3 /* tc ingress of the node's eth0 */
#define HOOK_TO_NETDEV      4 /* tc egress of the node's eth0 */
#define HOOK_FROM_OVERLAY   5 /* tc ingress of cilium_vxlan: decapsulated packets */
#define HOOK_TO_OVERLAY     6 /* tc egress of cilium_vxlan: packets to encapsulate */
#define HOOK_XDP            7 /* XDP on the node's eth0 (--nodeport-accel xdp): before an skb exists */

/* Verdicts. */
#define VERDICT_FORWARDED  1 /* handed back to the kernel stack */
#define VERDICT_REDIRECTED 2 /* sent straight to another device (tunnel) */
#define VERDICT_DROPPED    3

/* Drop reasons: Cilium's numbers (bpf/lib/common.h there), negative. */
#define DROP_INVALID_SIP       -132
#define DROP_POLICY            -133
#define DROP_INVALID           -134
#define DROP_CT_INVALID_HDR    -135
#define DROP_CT_UNKNOWN_PROTO  -137
#define DROP_UNKNOWN_L3        -139
#define DROP_WRITE_ERROR       -141
#define DROP_UNKNOWN_L4        -142
#define DROP_NO_TUNNEL_KEY     -147
#define DROP_CSUM_L3           -153
#define DROP_CSUM_L4           -154
#define DROP_CT_CREATE_FAILED  -155
#define DROP_FRAG_NOSUPPORT    -157
#define DROP_NO_SERVICE        -158
#define DROP_NO_TUNNEL_ENDPOINT -160
#define DROP_NAT_NO_MAPPING    -167
#define DROP_NO_FIB            -169
#define DROP_PROXY_LOOKUP_FAILED -178
#define DROP_PROXY_SET_FAILED  -179
#define DROP_PROXY_UNKNOWN_PROTO -180
#define DROP_POLICY_DENY       -181
#define DROP_TTL_EXCEEDED      -196

/* trace_event.flags: what a hook did besides translating addresses. */
#define TRACE_F_DSR_OPT_ADDED    0x01 /* the LB node attached the DSR IPv4 option */
#define TRACE_F_DSR_OPT_STRIPPED 0x02 /* the backend node read and removed it */
#define TRACE_F_SNAT             0x04 /* source rewritten through the NAT map */
#define TRACE_F_REV_SNAT         0x08 /* destination restored through the NAT map */
#define TRACE_F_NO_BACKEND_REPLY 0x10 /* answered with ICMP port unreachable: a Service without backends */

/* A policy verdict: one byte in the high byte of trace_event.flags (the low
 * byte is TRACE_F_*), laid out as the flags of Cilium's policy_verdict_notify
 * (bpf/lib/policy_log.h): direction in bits 0-1 (POLICY_INGRESS 1,
 * POLICY_EGRESS 2 of policy_types.h), the match type (POLICY_MATCH_*) in bits
 * 3-5, audited in bit 6; bit 7 is labkit's, for the verdict Cilium carries in
 * a field of its own. 0: no verdict reported. */
#define POLICY_V_SHIFT       8
#define POLICY_V_DIR_MASK    0x03
#define POLICY_V_MATCH_SHIFT 3
#define POLICY_V_MATCH_MASK  0x38
#define POLICY_V_AUDITED     0x40 /* denied, but let through (POLICY_AUDIT_MODE) */
#define POLICY_V_DENIED      0x80 /* the packet was dropped by policy */

/* Observation points: Cilium v1.16's enum trace_point numbers (bpf/lib/trace_helpers.h
 * there; Hubble's TraceObservationPoint in api/v1/flow/flow.proto, where 0 reads
 * TO_ENDPOINT). Which one a labkit record stands for: trace_obs_point() in trace.h. */
#define OBS_TO_LXC       0  /* "to-endpoint" */
#define OBS_TO_PROXY     1  /* "to-proxy": handed to an L7 proxy (the DNS proxy) */
#define OBS_TO_STACK     3
#define OBS_TO_OVERLAY   4
#define OBS_FROM_LXC     5  /* "from-endpoint" */
#define OBS_FROM_OVERLAY 9
#define OBS_FROM_NETWORK 10
#define OBS_TO_NETWORK   11

/* Monitor aggregation levels (lab_config.monitor_aggregation): the agent's
 * --monitor-aggregation settings (pkg/option/monitor.go, MonitorAggregationLevel*),
 * which the agent writes into MONITOR_AGGREGATION. */
#define MONITOR_AGG_NONE    0
#define MONITOR_AGG_LOWEST  1
#define MONITOR_AGG_LOW     2
#define MONITOR_AGG_MEDIUM  3
#define MONITOR_AGG_MAX     4
/* The two thresholds bpf/lib/trace.h's emit_trace_notify() compares it with. */
#define TRACE_AGGREGATE_RX        1 /* hide the from-* observation points */
#define TRACE_AGGREGATE_ACTIVE_CT 3 /* report only when the CT lookup asked to (its 'monitor') */

/* trace_event.report: whether Cilium at the lab's level would have emitted
 * this notification. Every record still reaches labkit_events. */
#define REPORT_REPORTED 0x01 /* Cilium would have sent it to the monitor */
#define REPORT_MONITOR  0x02 /* the hook's CT lookup returned a non-zero 'monitor' */

/* Trace modes (lab_config.trace_mode). */
#define TRACE_ALL   0
#define TRACE_DROPS 1
#define TRACE_NONE  2

/* A packet's addresses and ports in packet order (not CT key order). */
struct trace_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;     /* ICMP echo: the identifier */
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 icmp_code;   /* Hubble's ICMPv4 code */
};

struct trace_event {
	__u64 ts_ns;            /* bpf_ktime_get_ns() */
	__u32 ifindex;          /* device the hook runs on */
	__u32 len;              /* skb->len */
	__u8 node_id;           /* NODE_ID of the program's node */
	__u8 hook;              /* HOOK_* */
	__u8 verdict;           /* VERDICT_* */
	__u8 ct_result;         /* CT_NEW..CT_RELATED, or CT_NONE */
	__s16 drop_reason;      /* DROP_* or 0 */
	__u16 ct_flags;         /* CT_F_* of the entry after this packet */
	__u32 ct_lifetime;      /* its lifetime after this packet */
	__u8 ct_dir;            /* CT_EGRESS / CT_INGRESS / CT_SERVICE, or CT_NONE */
	__u8 ct_tx_seen;        /* its tx_flags_seen after this packet */
	__u8 ct_rx_seen;        /* its rx_flags_seen after this packet */
	__u8 svc_ct_result;     /* the service CT lookup's result, or CT_NONE */
	__be32 tunnel_endpoint; /* remote node of an encapsulated packet, or 0 */
	__u32 identity;         /* source security identity known to the hook */
	struct trace_tuple before; /* as the packet reached the hook */
	struct trace_tuple after;  /* as it left (differs only when translated) */
	struct trace_tuple inner;  /* VXLAN packets at eth0: the encapsulated packet */
	__u16 rev_nat_index;    /* host byte order, 0 if none */
	__u16 flags;            /* TRACE_F_*; the high byte: a policy verdict (POLICY_V_*) */
	__u8 obs_point;         /* OBS_*: the notification Cilium sends for this hook's outcome */
	__u8 report;            /* REPORT_* */
	__u16 proxy_port;       /* the proxy port a reported policy verdict redirects to (host order), or 0 */
	__u32 remote_id;        /* the peer's identity a policy verdict is about, or 0 */
	__u32 pad3;
};

#endif /* LABKIT_TRACE_TYPES_H */
