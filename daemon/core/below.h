/* SPDX-License-Identifier: MIT */
/*
 * What lies below memory: the tier that keeps copies of objects when they
 * leave dram (daemon/disk now; a shared tier next).  It attaches itself
 * with store_below_attach() (store.h), which also says what it may ask of
 * core.  Every call runs on the loop thread and never blocks.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct object;

/* The version of struct below_ops a backend was built against: a slot
 * added later is never called on an older table. */
#define BELOW_OPS_VERSION 1

struct below_ops {
	uint32_t version;
	const char *name;
	/* o's bytes are only below: start bringing them into dram; the
	 * backend calls fetch_done() when they are in or will not come */
	int (*fetch)(void *be, struct object *o);
	/* take a clean copy of o (memory-resident): 0 queued, -errno not */
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
};

struct below {
	const struct below_ops *ops; /* NULL: nothing below memory */
	void *be;
};
