/* SPDX-License-Identifier: MIT */
/*
 * The one clock every part reads for deadlines, timeouts and durations:
 * the daemon, its network code, the client library and the tools.
 * CLOCK_MONOTONIC through the vDSO (no system call).  Its unit is the
 * microsecond; the millisecond and nanosecond forms are the same clock,
 * for the timeouts users give in ms and the client's sub-microsecond
 * spins.
 */
#pragma once

#include <stdint.h>
#include <time.h>

typedef uint64_t usec_t;

#define USEC_PER_MSEC UINT64_C(1000)
#define USEC_PER_SEC UINT64_C(1000000)
#define NSEC_PER_USEC UINT64_C(1000)

static inline uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000 + (uint64_t) ts.tv_nsec;
}

static inline usec_t mono_us(void)
{
	return mono_ns() / NSEC_PER_USEC;
}

static inline uint64_t mono_ms(void)
{
	return mono_us() / USEC_PER_MSEC;
}
