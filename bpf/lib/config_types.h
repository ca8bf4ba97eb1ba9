/* config_types.h — labkit_config, the one-entry array through which the lab
 * changes a running datapath: the lab clock offset, break-it faults and the
 * trace mode. Cilium's nearest relative is cilium_runtime_config.
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

struct lab_config {
	__u32 clock_offset; /* seconds added to CLOCK_MONOTONIC seconds */
	__u32 faults;       /* FAULT_* */
	__u32 trace_mode;   /* TRACE_* */
	__u32 pad;
};

#endif /* LABKIT_CONFIG_TYPES_H */
