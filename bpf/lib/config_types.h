/* config_types.h — labkit_config, the one-entry array through which the lab
 * changes a running datapath: the lab clock offset, break-it faults, the
 * trace mode and the monitor aggregation level. Cilium's nearest relative is cilium_runtime_config.
 *
 * Python mirrors this in labkit/maps/config.py. Keep in sync with that file.
 */
#ifndef LABKIT_CONFIG_TYPES_H
#define LABKIT_CONFIG_TYPES_H

/* Break-it faults (lab_config.faults), switched on for diagnosis exercises. */
#define FAULT_NO_IN_ENTRY     0x01 /* to-container never creates IN entries */
#define FAULT_SKIP_REV_NAT    0x02 /* replies are not reverse-translated */
#define FAULT_WRONG_LIFETIME  0x04 /* established TCP keeps the SYN lifetime */
#define FAULT_NO_LOOPBACK_SNAT 0x08 /* hairpin flows keep the pod's own source */
#define FAULT_NO_RELATED      0x10 /* new entries get no RELATED twin */
#define FAULT_NO_DSR_SNAT     0x20 /* dsr replies leave the backend's node with the backend's address */
#define FAULT_NO_OUT_ENTRY    0x40 /* from-container never creates OUT entries */
#define FAULT_NO_FLAGS_SEEN   0x80 /* CT entries never record the TCP flags they see */
#define FAULT_NO_CLOSE        0x100 /* FIN and RST never mark a direction closing */
#define FAULT_NO_ACCOUNTING   0x200 /* packets and bytes are never counted (even with CONNTRACK_ACCOUNTING) */
#define FAULT_NO_TUNNEL       0x400 /* tunnel routing: no packet finds its tunnel endpoint */
#define FAULT_NO_FIB          0x800 /* to-netdev drops pods' packets leaving for another node (no route) */
#define FAULT_NO_SVC_ENTRY    0x1000 /* per-packet LB keeps no SVC entry: every packet picks a backend anew */
#define FAULT_PICK_TERMINATING 0x2000 /* new flows may pick a terminating backend */
#define FAULT_NO_SNAT         0x4000 /* snat mode: the request to a remote backend keeps the client's source */
#define FAULT_MAGLEV_WRONG_HASH 0x8000 /* the flow hash uses a wrong seed: Maglev picks another slot */
#define FAULT_SOCK_LB_OFF     0x10000 /* connect4/sendmsg4 translate nothing */
#define FAULT_NO_GETPEERNAME  0x20000 /* getpeername4/recvmsg4 do not show the VIP again */
#define FAULT_SOCK_NO_REJECT  0x40000 /* socket LB lets a connect() to a service without backends through */
#define FAULT_SOCK_NO_REDIRECT 0x80000 /* sock_ops records no socket in cilium_sock_ops: sk_msg redirects nothing */
#define FAULT_XDP_PASS        0x100000 /* the XDP program passes every frame to tc untouched (as if detached) */

struct lab_config {
	__u32 clock_offset; /* seconds added to CLOCK_MONOTONIC seconds */
	__u32 faults;       /* FAULT_* */
	__u32 trace_mode;   /* TRACE_* */
	__u32 monitor_aggregation; /* MONITOR_AGG_*: which records are marked REPORT_REPORTED */
};

#endif /* LABKIT_CONFIG_TYPES_H */
