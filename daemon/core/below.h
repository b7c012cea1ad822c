/* SPDX-License-Identifier: MIT */
/*
 * What lies below memory: the tiers that keep copies of objects when they
 * leave dram.  The private disk tier (daemon/disk/disk.c) attaches itself
 * with store_below_attach(), and objects whose bytes are only there stay
 * in the index; the shared tier (daemon/disk/shared.c), on a directory
 * several nodes mount, attaches with store_shared_attach(), keeps no index
 * entry for what it holds, and is asked after a miss (locate, where).
 * store.h says what each may ask of core.  Every call runs on the loop
 * thread and never blocks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct object;

/* The version of struct below_ops a backend was built against: a slot
 * added later is never called on an older table. */
#define BELOW_OPS_VERSION 2

struct fetch;

struct below_ops {
	uint32_t version;
	const char *name;
	/* o's bytes are only below: start bringing them into dram; the
	 * backend calls fetch_done() when they are in or will not come */
	int (*fetch)(void *be, struct object *o);
	/* take a clean copy of o (memory-resident): 0 queued, -errno not
	 * (the shared tier: -EBUSY, copies enough in flight; ask again once
	 * one ends) */
	int (*spill)(void *be, struct object *o);
	/* o is going away: drop its copy and any transfer */
	void (*forget)(void *be, struct object *o);
	/* could a copy of o be taken now (healthy, room)? */
	bool (*accepting)(void *be, const struct object *o);
	/* background work, bounded; true if it did something */
	bool (*maintain)(void *be);
	/* its counters, each under its full name ("disk.records") */
	void (*stats)(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u);
	/* start copying every memory-only object below (kvcachectl flush) */
	int (*flush)(void *be);
	/* (version 2) The shared tier's: core calls only these two, spill,
	 * accepting and stats of it (a copy in flight holds its object; the
	 * tier paces its own background work).  A miss everywhere else: o is
	 * the key's landing placeholder (store_land_begin(): no place yet).
	 * 0: the backend looks for it and lands it (store_land_place(), then
	 * store_land_done()); -ENOENT: not there, o stays the caller's */
	int (*locate)(void *be, struct object *o);
	/* which of these keys does it hold?  As remote_ops.where (remote.h) */
	int (*where)(void *be, const char *const *keys, const size_t *lens, size_t n,
		     uint8_t *present, bool settle, struct fetch **ret);
};

struct below {
	const struct below_ops *ops; /* NULL: nothing below memory */
	void *be;
};
