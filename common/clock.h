/* SPDX-License-Identifier: MIT */
/*
 * The one clock and the one unit.  Every part (the daemon, its network
 * code, the master, the client library, the tools) reads CLOCK_MONOTONIC
 * through this header (the vDSO: no system call), and every time point,
 * deadline, timeout and duration a program keeps is a usec_t, in
 * microseconds: the loop's timers, requests' deadlines, blocking calls'
 * bounds, leases, back-offs.  Other units live only at the edges:
 *   - what users give (--remote-timeout-ms, "lease_ttl_ms", kvc_wait()'s
 *     timeout_ms) and what the wire carries is converted where it is read;
 *   - a system call's own unit (poll()'s ms, a timespec) where it is made;
 *   - a field packed for size says its unit in its name (an object's
 *     used_ms: 32 bits of ms);
 *   - mono_ns() only measures (latency histograms, benches).
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

