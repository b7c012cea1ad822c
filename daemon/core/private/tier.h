/* SPDX-License-Identifier: MIT */
/*
 * Memory tiers and the objects in them (tier.c): placement on a tier's
 * lists, allocation with eviction, promotion and demotion, background
 * maintenance.  The store's operations (store.h) are built on these.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "store-private.h"

/* The memory tiers, empty, or the previous run's segments when their fds
 * are given (>= 0; taken) and they fit. */
int tiers_init(struct store *st, int dram_fd, int device_fd);
void tiers_done(struct store *st);

struct tier *tier_for(struct store *st, int requested);
struct object *object_new(const void *key, size_t key_len);
/* Free the object's space and the object itself. */
void object_free(struct store *st, struct object *o);
/* Make a reserved object visible: index, tier LRU, prefix link. */
void object_publish(struct store *st, struct object *o);
/* An object newly in the index is told to the cluster's directory (a
 * no-op on a single node, or while the master is not joined: the
 * re-publish of every join covers it). */
void object_announce(struct store *st, struct object *o);
/* Unlink a committed object; freed now, or when its last view goes. */
void object_drop(struct store *st, struct object *o);
/* A read hit: LRU, lease, per-tier hit counts, promotion. */
void object_hit(struct store *st, struct object *o, bool lease, bool counts_for_promotion);
/* What protects it from eviction right now (NULL: nothing). */
const char *object_protected(const struct store *st, const struct object *o, bool soft_ok);
/* Put o on the list of its tier that its state calls for (most recent end,
 * or the least recent with at_tail); call after any change to its views,
 * lease, pins, children, load or spill.  No-op for uncommitted objects. */
void object_place(struct store *st, struct object *o, bool at_tail);
void object_unplace(struct store *st, struct object *o);
/* Put o back by its last use, `used` (ms, as used_ms), after a hold that
 * was no use: near the least recent end when that is where it falls. */
void object_place_used(struct store *st, struct object *o, uint32_t used);
/* Allocate len bytes in t, evicting unused objects when it is full.
 * -ENOSPC: everything left is protected; -EAGAIN: what could give way has
 * not reached the disk tier yet (its spill was started: retry when a spill
 * ends: the space_freed event). */
int tier_alloc(struct store *st, struct tier *t, uint64_t len, struct shm_block **ret);
/* Evict from t (NULL = every tier): leaves of prefix chains first, least
 * recently used first, unpinned before soft-pinned, never protected ones. */
void tier_evict(struct store *st, struct tier *t, uint64_t bytes, bool all,
		enum evict_reason why, uint64_t *ret_bytes, uint64_t *ret_objects);
/* The same, at most max objects, and the reason's rules (see tier.c);
 * 0 or -EAGAIN. */
int tier_evict_some(struct store *st, struct tier *t, uint64_t bytes, bool all, unsigned max,
		    enum evict_reason why, uint64_t *freed, uint64_t *n);
/* The oldest lease in t ends (it yields to a request, or to
 * --max-leased-ratio); the object it protected, or NULL. */
struct object *object_break_lease(struct store *st, struct tier *t);
/* Landing (store_land_begin()/_done()): o published (with its checksum
 * when summed), 0, or -EEXIST when the key was stored meanwhile; the
 * landing index's placeholders added and removed. */
int store_land_publish(struct store *st, struct object *o, bool summed, uint64_t sum);
void store_landing_add(struct store *st, struct object *o);
void store_landing_remove(struct store *st, struct object *o);
/* Puts in flight (puts.c), for the store's reserve and commit: the
 * cluster told a put of key began or ended; is one still on its way here;
 * an announced put of key that failed; an announcement that is over (its
 * put is here, or its time is up: tell the cluster when tell). */
void put_tell_pending(struct store *st, const void *key, size_t len, bool on);
bool put_still_coming(struct store *st, const void *key, size_t len);
void put_announced_failed(struct store *st, const void *key, size_t len);
void put_announced_over(struct store *st, struct object *a, bool tell);
/* Why nothing more can be evicted from t, for error messages. */
void tier_explain(const struct store *st, const struct tier *t, char *buf, size_t len);
/* Background work: watermarks, promotions.  True if it did something. */
bool tier_maintain(struct store *st);
/* A disk-only object read back into dram block b. */
void tier_readmit(struct store *st, struct object *o, struct shm_block *b);
uint64_t tier_capacity(const struct tier *t);
uint64_t tier_used(const struct tier *t);
/* Tiers for status: memory tiers, then disk. */
unsigned tier_count(const struct store *st);
struct tier *tier_at(struct store *st, unsigned i);
/* The shared tier.  tier.c: ask it for a copy of o, held like a view until
 * it ends (0, or -errno: not asked).  shared.c: a put committed, copied now
 * with --shared-write-through; a miss everywhere else, looked for there (0
 * with *ret the fetch to wait on, or -ENOENT); which keys it holds
 * (store_where). */
int tier_shared_copy(struct store *st, struct object *o);
void shared_through(struct store *st, struct object *o);
/* Write-throughs that waited for room in the shared tier's queue: as many
 * as it takes now (true if any).  shared_through_done() drops the rest. */
bool shared_through_more(struct store *st);
void shared_through_done(struct store *st);
int shared_locate(struct store *st, const void *key, size_t len, struct fetch **ret);
int shared_where(struct store *st, const char *const *keys, const size_t *lens, size_t n,
		 uint8_t *present, bool settle, struct fetch **ret);
/* Warm starts (warm.c): after tiers_init(), the catalog (a new one, or
 * the previous run's and the objects it lists that check); the fds of a
 * warm start that will not happen, closed. */
int warm_start(struct store *st, const struct store_warm *w, usec_t t0);
void store_warm_close(const struct store_warm *w);
