/* SPDX-License-Identifier: MIT */
/*
 * Values that cross the wire as plain integers (protobuf fields and channel
 * descriptors): put flags, tiers, key states, remove flags.  One home for
 * both sides.  The public header spells them KVC_*, and libkvcache
 * static-asserts that those equal these; the daemon uses these names only.
 * Never renumber: add.
 */
#pragma once

enum wire_put_flags {
	WIRE_PUT_REPLACE = 1u << 0,  /* replace a committed object of the same key */
	WIRE_PUT_SOFT_PIN = 1u << 1, /* evicted only after unpinned objects */
	WIRE_PUT_HARD_PIN = 1u << 2, /* never evicted */
	WIRE_PUT_KNOWN = WIRE_PUT_REPLACE | WIRE_PUT_SOFT_PIN | WIRE_PUT_HARD_PIN,
};

/* Tiers, as requested in puts and reported per key (and as segments'
 * tier fields in shared memory: shm-layout.h asserts the same numbers). */
enum wire_tier {
	WIRE_TIER_DEFAULT = 0,
	WIRE_TIER_DEVICE = 1,
	WIRE_TIER_DRAM = 2,
	WIRE_TIER_DISK = 3,
};

enum wire_key_state {
	WIRE_STATE_RESERVED = 1,
	WIRE_STATE_COMMITTED = 2,
};

enum wire_remove_flags {
	WIRE_REMOVE_FORCE = 1u << 0, /* a lease does not refuse it; a view does */
	WIRE_REMOVE_LOCAL = 1u << 1, /* this node's copies alone (not the cluster's) */
	WIRE_REMOVE_KNOWN = WIRE_REMOVE_FORCE | WIRE_REMOVE_LOCAL,
};

enum wire_evict_flags {
	WIRE_EVICT_ALL = 1u << 0,
};
