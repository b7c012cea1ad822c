/* SPDX-License-Identifier: MIT */
/*
 * The store's fields: core's own.  Every other part of the daemon reaches
 * the store through store.h; this header is on no include path but
 * core's (and its unit tests').
 */
#pragma once

#include "catalog.h"
#include "index.h"
#include "store.h"

/*
 * The objects and where they live: memory tiers, the index, what lies below
 * memory.  Every transport (local sessions, peers) works on it through
 * store.h; it knows nothing of sockets or clients.
 */
struct store {
	struct config *cfg;
	struct loop *loop;
	uint64_t generation; /* segments of this run (the Welcome carries it) */
	bool hugepages;
	uint64_t prefaulted;       /* bytes of the memory tiers faulted in (atomic) */
	uint64_t cat_prefaulted;   /* bytes of the catalog faulted in (atomic) */
	bool numa_bound;           /* the memory tiers are bound to numa_node */
	unsigned numa_node;

	struct tier tiers[DAEMON_MAX_TIERS]; /* by segment index: dram first */
	unsigned n_tiers;   /* memory tiers */
	/* core's record of what lies below memory (valid while below.ops is
	 * set; no segment): the objects whose bytes are only there, by use,
	 * and its size and watermarks, so eviction below is decided where
	 * eviction above is.  The backend's own state (records, files, what
	 * it has still to copy) is its own (daemon/disk). */
	struct tier below_tier;
	struct tier *fastest;  /* lookups go fastest first */
	struct below below;    /* what holds copies below memory: the disk tier */
	struct below shared;   /* a directory every node reads (the shared tier) */
	/* objects held while a copy of them is taken (below, shared): room
	 * they hold comes free when the copies end */
	uint64_t copies_held;
	/* puts whose write-through found the shared tier's queue full, by
	 * key, oldest first: taken as copies end (shared_through_more()) */
	struct through_wait *through_head, *through_tail;
	size_t n_through;
	bool through_ready;    /* a copy ended since the last look */
	struct remote remote;  /* other nodes (the cluster), or nothing */
	struct store_listener *listeners; /* in the order they were added */
	struct object **promote_q; /* objects waiting to move up */
	size_t n_promote, cap_promote;
	struct loop_source *maintain_src;
	struct index index;
	/* puts in flight (RESERVED, with --lookup-wait-ms): a lookup of their
	 * key may wait for the commit; built on the first put */
	struct index reserving;
	/* puts announced to come (kvc_announce), oldest first, as placeholders
	 * without bytes: lookups wait for them too, until --lookup-wait-ms */
	struct index announced;
	/* copies landing from another node, as placeholders by key: one
	 * fetch per key (store_landing_*) */
	struct index landing;
	struct object *announced_head, *announced_tail;
	struct fetch *woken;   /* their waiters, to run again (store_wake_puts) */
	uint64_t version;      /* the last version given (store_version_next) */
	struct catalog cat;    /* where the memory tiers' objects are, for the next run */
	struct store_warm_report warm; /* what this run took over from the last */
	struct stats stats;
};
