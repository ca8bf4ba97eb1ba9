/* clock.h — the lab clock: CLOCK_MONOTONIC seconds plus an offset the lab
 * moves forward (`labkit clock advance`). Cilium's bpf_mono_now() is the same
 * clock without the offset. Python computes the same value in labkit/clock.py.
 */
#ifndef LABKIT_CLOCK_H
#define LABKIT_CLOCK_H

#include "maps_lab.h"

static __always_inline struct lab_config *lab_config_get(void)
{
	__u32 zero = 0;

	return labkit_config.lookup(&zero);
}

static __always_inline __u32 lab_now(void)
{
	const struct lab_config *cfg = lab_config_get();
	__u32 now = bpf_ktime_get_ns() / LK_NSEC_PER_SEC;

	return cfg ? now + cfg->clock_offset : now;
}

static __always_inline bool lab_fault(__u32 fault)
{
	const struct lab_config *cfg = lab_config_get();

	return cfg && (cfg->faults & fault);
}

#endif /* LABKIT_CLOCK_H */
