/* maps_lab.h — the lab's own maps: labkit_config, through which the lab
 * moves the clock, sets faults and the trace mode (config_types.h), and
 * labkit_events, the ring buffer of trace records (trace_types.h), and
 * labkit_events_lost, the count of records it had no room for.
 */
#ifndef LABKIT_MAPS_LAB_H
#define LABKIT_MAPS_LAB_H

#include "config_types.h"
#include "trace_types.h"

#ifndef EVENTS_RING_PAGES
#define EVENTS_RING_PAGES 256 /* 1 MiB of trace records per node (DatapathConfig.events_ring_pages) */
#endif

/* Lab clock offset, faults, trace mode. */
BPF_ARRAY(labkit_config, struct lab_config, 1);
/* One struct trace_event per packet per hook. */
BPF_RINGBUF_OUTPUT(labkit_events, EVENTS_RING_PAGES);
/* Records labkit_events had no room for (the reader fell behind): the
 * monitor turns increments into Hubble's lost-event records. */
BPF_ARRAY(labkit_events_lost, __u64, 1);

#endif /* LABKIT_MAPS_LAB_H */
