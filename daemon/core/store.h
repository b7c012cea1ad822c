/* SPDX-License-Identifier: MIT */
/*
 * The object operations every transport uses (store.c): a local session's
 * socket and channels now, a peer connection next.  Reservations and views
 * are taken on behalf of a holder (holder.h); nothing here knows about
 * sockets, rings or peers, and nothing blocks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "below.h"
#include "config.h"
#include "fetch.h"
#include "holder.h"
#include "loop.h"
#include "object.h"
#include "remote.h"

#define STORE_MSG_MAX 256

struct stats {
	uint64_t puts, gets, hits, misses, exists;
	uint64_t bytes_in, bytes_out;
	uint64_t errors;
	uint64_t removes, evictions, evicted_bytes;
	uint64_t promotions, demotions, bytes_moved;
	uint64_t reserves, aborts, put_conflicts;
	uint64_t reclaimed_reservations, reclaimed_views;
	uint64_t evict_examined;   /* objects looked at to choose victims: O(1) each */
	uint64_t prefetches;       /* fetches a prefetch started or joined */
	uint64_t lookup_waits;     /* lookups that waited for a put in flight */
	uint64_t leases_broken;    /* leases that yielded to a request or to --max-leased-ratio */
	uint64_t shared_through_waited;  /* write-throughs that waited for room in the queue */
	uint64_t shared_through_dropped; /* ...that found too many waiting: copied on leaving memory */
};

/*
 * What happens to objects, told to whoever listens (the cluster's
 * directory publisher now): a versioned table, so a listener built
 * against an older one is still called right.  Every event runs on the
 * loop, inside the call that caused it: a listener queues its work and
 * never calls back into the store.
 */
#define STORE_EVENTS_VERSION 2

struct store_events {
	uint32_t version; /* STORE_EVENTS_VERSION the listener was built with */
	/* o is in the index, committed (or recovered, or landed) */
	void (*published)(void *data, struct object *o);
	/* o leaves the index (removed, evicted, dropped, replaced) */
	void (*forgotten)(void *data, struct object *o);
	/* a put of key began here or was announced (on), or ended without
	 * landing (off): lookups elsewhere may wait for it */
	void (*pending)(void *data, const char *key, size_t len, bool on);
	/* a client removed key (prefix: every key starting with it; empty:
	 * all): every other copy goes too */
	void (*removed)(void *data, const void *key, size_t len, bool prefix);
	/* (version 2) a copy below ended, written or not: memory may have
	 * room now for what waited for it (parked puts, reads back) */
	void (*space_freed)(void *data);
};

struct store_listener {
	struct store_listener *next;
	const struct store_events *events;
	void *data;
};

/* The objects and where they live (its fields are core's own:
 * core/private/store-private.h). */
struct store;

/* l hears of st's events from now on (it is the caller's, and stays
 * valid until removed); and no more. */
void store_add_listener(struct store *st, struct store_listener *l,
			const struct store_events *events, void *data);
void store_remove_listener(struct store *st, struct store_listener *l);
/* Tell every listener (core's own: tier.c, store.c). */
void store_emit_published(struct store *st, struct object *o);
void store_emit_forgotten(struct store *st, struct object *o);
void store_emit_pending(struct store *st, const char *key, size_t len, bool on);
void store_emit_removed(struct store *st, const void *key, size_t len, bool prefix);
void store_emit_space_freed(struct store *st);

/* A store for cfg on loop: its index, its memory tiers (their pages from
 * NUMA node numa_node only, when >= 0), its maintenance on the loop's idle
 * turns.  0 or -errno. */
int store_new(struct config *cfg, struct loop *loop, int numa_node, struct store **ret);
/*
 * Warm starts (warm.c, docs/warm-restart.rst): a previous run's memory
 * tiers taken over with what they hold.  It leaves its segments' memfds
 * and its catalog's (-1: none; each taken), and the hash that checks an
 * object's bytes against the XXH3-64 its entry carries.  Only objects
 * whose bytes check are kept; the rest are dropped and counted.
 */
struct store_hash_job {
	const void *p;
	uint64_t len;
	uint64_t sum; /* out: XXH3-64 of [p, p + len) */
};
/* Hash every job (the daemon spreads them over its CPUs). */
typedef void (*store_hash_fn)(struct store_hash_job *jobs, size_t n);
struct store_warm {
	int dram_fd, device_fd, catalog_fd;
	store_hash_fn hash;
};
struct store_warm_report {
	bool warm;            /* a previous run's segments were taken over */
	uint64_t kept, kept_bytes;
	uint64_t dropped;     /* entries not kept, for any reason: */
	uint64_t unverified;  /* no checksum to check their bytes by */
	uint64_t mismatched;  /* bytes that did not check, or places taken twice */
	usec_t took;          /* the whole take-over, checks included */
};
int store_new_warm(struct config *cfg, struct loop *loop, int numa_node,
		   const struct store_warm *warm, struct store **ret);
void store_warm_report(const struct store *st, struct store_warm_report *ret);
/* What a next run takes over: fds[0] dram, [1] device (or -1), [2] the
 * catalog (or -1); the store's own, not to be closed. */
void store_warm_fds(const struct store *st, int fds[3]);
/* Before handing the memory over: every object in memory gets a checksum
 * (hash; those without one are hashed now) in its catalog entry, and the
 * catalog is written no more, whatever happens to the objects after.
 * Returns how many were hashed. */
uint64_t store_seal(struct store *st, store_hash_fn hash);
/* Objects the catalog had no room for (they would not survive a warm
 * start). */
uint64_t store_catalog_full(const struct store *st);
/* Every object freed (after the tier below and the sessions went: copies
 * below are not touched), then the store; NULL: nothing. */
void store_free(struct store *st);

/* A key's hash, as the index takes it (a node spreads keys over masters,
 * and caches answers, by the same). */
uint64_t store_key_hash(const void *key, size_t len);

/* The time requests are judged against (the loop's, per turn). */
usec_t store_now(const struct store *st);

/* What the store was made with, and what it is. */
const struct config *store_config(const struct store *st);
struct loop *store_loop(const struct store *st);
/* Its request counters (a transport counts the errors it answers). */
struct stats *store_stats(struct store *st);
struct store_info {
	uint64_t generation; /* this run's segments (the Welcome carries it) */
	uint64_t objects;    /* in the index */
	bool hugepages;      /* every memory tier on 2 MiB pages */
	bool numa_bound;     /* the memory tiers on numa_node only */
	unsigned numa_node;
};
void store_info(const struct store *st, struct store_info *ret);
/* The memory tiers' segments, as a client maps them (the Welcome) and an
 * RDMA device registers them: segment number i of store_segments(). */
struct store_segment {
	uint32_t index;
	uint32_t kind; /* enum shm_tier */
	const char *name;
	int fd;
	uint8_t *base;
	uint64_t size;
	bool hugepages;
};
unsigned store_segments(const struct store *st);
void store_segment(const struct store *st, unsigned i, struct store_segment *ret);
/* Other nodes: the cluster's node attaches its table, and detaches it
 * (be: only if it is still the one attached). */
void store_remote_attach(struct store *st, const struct remote_ops *ops, void *be);
void store_remote_detach(struct store *st, void *be);
/* Is a key this node does not hold looked for elsewhere (other nodes, the
 * shared tier)? */
bool store_looks_elsewhere(const struct store *st);
/* The counters of the tier below and of the cluster, each under its full
 * name; a flush of every memory-only object to the tier below
 * (-EOPNOTSUPP: there is none). */
void store_backend_stats(const struct store *st,
			 void (*emit)(void *u, const char *name, uint64_t v), void *u);
int store_flush_below(struct store *st);

/* Where an object's bytes are, as a client sees them. */
struct extent {
	uint64_t handle;
	uint32_t segment;
	uint64_t offset;
	uint64_t len;
	uint64_t ver;  /* the version of the bytes */
	bool summed;   /* sum: their XXH3-64, learnt as they were last checked */
	uint64_t sum;
};

struct put_args {
	const void *key;
	size_t key_len;
	uint64_t len;
	uint32_t flags;
	const void *parent;   /* may be NULL */
	size_t parent_len;
	usec_t pin_ttl;       /* a soft pin's; 0: until unpinned */
	int tier;
};

/* Each returns 0 or -errno; msg (STORE_MSG_MAX bytes) may explain an error.
 * What a holder takes (reservations, views) is its until given back or
 * holder_done().  store_acquire() returns -EINPROGRESS for an object being
 * brought back from below memory (or, unless local_only, from another node of
 * the cluster), with *ret_fetch the fetch to wait on: run the request again
 * once it is done. */
int store_reserve(struct holder *h, const struct put_args *a, struct extent *ret, char *msg);
/* A lookup of a key a put has reserved but not committed, or announced: 0
 * with *ret the fetch to wait on (woken by store_wake_puts() after the put
 * commits or goes), or -ENOENT (no such put, or --lookup-wait-ms 0, or the
 * reservation is asker's own: it would wait for itself). */
int store_put_in_flight(struct store *st, const void *key, size_t len, const struct holder *asker,
			struct fetch **ret);
/* Run again what waited for puts that committed or went since the last
 * call; how many fetches were woken.  The loop calls it between requests,
 * never from inside one. */
unsigned store_wake_puts(struct store *st);
/* Bytes of the memory tiers faulted in by --prefault so far (0: off). */
uint64_t store_prefaulted(const struct store *st);
/* The thread faulting them in (daemon/prefault.c) says how far it got. */
void store_note_prefaulted(struct store *st, uint64_t bytes);
/* The part of the catalog (the daemon's record of the objects in memory,
 * written by the loop at every commit) to fault in before the tiers, from
 * its start, where its entries are made first: NULL if there is none.
 * Its progress, and how far it got. */
uint8_t *store_catalog_memory(const struct store *st, uint64_t *ret_size);
uint64_t store_catalog_prefaulted(const struct store *st);
void store_note_catalog_prefaulted(struct store *st, uint64_t bytes);
/* Where an extent's bytes are in this daemon's memory (the segment and
 * offset a client is told). */
uint8_t *store_extent_ptr(const struct store *st, const struct extent *x);
/* Where a resident object's bytes are (it has a tier and a block). */
uint8_t *store_object_ptr(const struct object *o);
/* Landing bytes that come from elsewhere (a fetch from another node, a
 * received push) into an object of this node's own (o->len set, not in
 * the index): a place in the first memory tier, 0; -E2BIG (larger than
 * the tier or 1 GiB), -ENOSPC (no room now), or another error. */
int store_land_place(struct store *st, struct object *o);
/* The landing's bytes: where they go (store_land_place() done), and their
 * offset in segment 0 (an RDMA read's destination). */
uint64_t store_land_offset(const struct object *o);
/* Disk recovery: a record found below (its id, newest first, and its
 * size there) of key, indexed as committed and older than anything stored
 * since the start.  0; 1 when key is in memory already with the same
 * bytes (value_sum: a warm start kept it) and the record is now its copy
 * below; -EEXIST when key is stored already and that copy is newer or
 * other (the record is an older version); -ENOMEM. */
int store_recovered(struct store *st, const char *key, size_t key_len, uint64_t len,
		    uint64_t value_sum, uint64_t below_ref, uint64_t below_len);
/*
 * The tier below memory (daemon/disk): the copies it keeps of objects, and
 * what it asks of core.  Every call runs on the loop.
 */
/* It is there: its backend, and its capacity (--disk-size) with the
 * memory tiers' watermarks; the lowest memory tier spills to it.  And it
 * goes (before its backend's state does). */
void store_below_attach(struct store *st, const struct below_ops *ops, void *be,
			uint64_t size);
void store_below_detach(struct store *st);
/* The bytes its copies take, by its own count (status; watermarks). */
void store_below_used(struct store *st, uint64_t used);
uint64_t store_below_size(const struct store *st);
/* Is it under its high watermark with `used` bytes taken? */
bool store_below_has_room(const struct store *st, uint64_t used);
/* Above its high watermark: copies that are only below go, least recently
 * used first, at most a bounded number a call; true if any did. */
bool store_below_trim(struct store *st, uint64_t used);
/* Is the lowest memory tier past its low watermark (less a margin), so
 * that copies should be taken ahead of eviction? */
bool store_spill_due(const struct store *st);
/* A copy of o is being taken: o is held in place like a view while its
 * bytes are read; the hold ends with store_below_unhold(), after which o
 * may be gone (false: it went meanwhile and was freed now). */
void store_below_hold(struct store *st, struct object *o);
bool store_below_unhold(struct store *st, struct object *o);
/* o's copy below began, ended or failed: o is put on the lists its state
 * calls for (the least recent end with at_tail). */
void store_below_changed(struct store *st, struct object *o, bool at_tail);
/* A copy ended (written or not): whoever waits for space hears of it
 * (the space_freed event). */
void store_space_freed(struct store *st);
/* Reading o's copy back into memory: a place in the first memory tier
 * (0, or -EAGAIN while what could give way has no copy below yet: retry
 * after a copy ends, or -ENOSPC); then the bytes are in and checked
 * (store_readmit), or are not coming (store_readmit_cancel: the place
 * goes; o, when given, stays where it was). */
int store_readmit_place(struct store *st, struct object *o, struct shm_block **ret_place,
			uint8_t **ret_dst);
void store_readmit(struct store *st, struct object *o, struct shm_block *place, uint64_t sum);
void store_readmit_cancel(struct store *st, struct object *o, struct shm_block *place);
/* Is o committed, still stored and in memory (a copy of it can be
 * taken)? */
bool store_object_resident(const struct object *o);
/* Is o gone from the index (its last view or hold frees it)? */
bool store_object_gone(const struct object *o);
/*
 * The shared tier (daemon/disk/shared.c, docs/shared-tier.rst): a
 * directory several nodes mount.  Nothing it holds is in the index: an
 * object leaving memory is copied there first (and each put as it commits,
 * with --shared-write-through), and a key found nowhere else (memory, the
 * disk tier, other nodes) is looked for there before it misses.  Every
 * call runs on the loop.
 */
int store_shared_attach(struct store *st, const struct below_ops *ops, void *be);
void store_shared_detach(struct store *st);
/* The copy of o the shared tier was asked for (ops->spill; o was held
 * like a view meanwhile) ended: ok, the tier has its bytes.  o goes back
 * where it was, and whatever waited for memory tries again; false: o
 * went meanwhile and was freed now. */
bool store_shared_copied(struct store *st, struct object *o, bool ok);
/* A landing placeholder its backend gives up on without ending it (a read
 * that does not come back in time): its waiters run with res and it leaves
 * the landing index, but o and its place stay the backend's, which a
 * thread may still be writing, until store_land_free(). */
void store_land_detach(struct store *st, struct object *o, int res);

/* Tiers for status: memory tiers, then disk; each read-only. */
unsigned store_tier_count(const struct store *st);
const struct tier *store_tier(struct store *st, unsigned i);
uint64_t store_tier_capacity(const struct tier *t);
/* A memory tier's segment (NULL for the disk tier), and its name. */
uint8_t *store_tier_memory(const struct tier *t, uint64_t *ret_size);
const char *store_tier_name(const struct tier *t);
uint64_t store_tier_used(const struct tier *t);
/* kvcachectl evict: unused objects of a tier (its kind; 0: every tier),
 * least recently used first; -EINVAL for a tier not configured here. */
int store_evict(struct store *st, int tier_kind, uint64_t bytes, bool all,
		uint64_t *ret_bytes, uint64_t *ret_objects);
/* The memory tiers' capacity and use, summed, and the objects stored:
 * what a node tells the masters of its load. */
void store_load(const struct store *st, uint64_t *ret_capacity, uint64_t *ret_used,
		uint64_t *ret_objects);
/*
 * Landing a copy that comes from elsewhere, in one pair of calls: begin,
 * then done when the bytes are in or will not come.
 *   store_land_begin(): the placeholder of key for a fetch (far: from
 *   another node), one per key: 0 and a new one, or 1 and the one already
 *   landing (its fetch to wait on too); -ENOMEM.  Its place comes with
 *   store_land_place() once its size is known.
 *   store_land_done(): res 0, the bytes are in (checked against sum when
 *   summed): published, 0, unless the key was stored here meanwhile,
 *   -EEXIST; res < 0, they are not coming.  Its waiters run (a stored
 *   copy is theirs either way) and anything not published goes.  Also for
 *   a copy made with store_land_object() (a received push: no waiters).
 *   store_land_abandon(): a placeholder that nobody waits for any more
 *   (shutdown) goes.
 */
int store_land_begin(struct store *st, const void *key, size_t len, bool far,
		     struct object **ret_o, struct fetch **ret_f);
int store_land_done(struct store *st, struct object *o, int res, bool summed, uint64_t sum);
void store_land_abandon(struct store *st, struct object *o);
/* A copy to land: a new object of key (not in the index), or NULL; and
 * one that will not land after all (its place, if any, goes with it). */
struct object *store_land_object(const void *key, size_t key_len);
void store_land_free(struct store *st, struct object *o);
/* A committed object goes (a master's Drop: an older copy than the key's
 * newest); freed now, or when its last view goes. */
void store_drop(struct store *st, struct object *o);
/* A checksum taken ahead of a send (cluster/presum.c): o is held (a view,
 * OBJ_SUMMING, off the lists eviction takes from) while another thread
 * hashes its bytes; its last use is returned, to be given back.  Then
 * released: the checksum kept when ok, o put back where its last use
 * `used` says (freed if it went meanwhile and this was its last view). */
uint32_t store_sum_hold(struct store *st, struct object *o);
void store_sum_release(struct store *st, struct object *o, bool ok, uint64_t sum, uint32_t used);
/* Copies landing from elsewhere (another node, the shared tier), by key
 * (one fetch per key): the index made, once for every backend that lands
 * copies (0 or -ENOMEM), and let go with the store (empty by then); the
 * placeholder of key or NULL. */
int store_landing_init(struct store *st);
void store_landing_done(struct store *st);
struct object *store_landing_find(struct store *st, const void *key, size_t len);
/* The object stored under key (in any state), or NULL: one lookup. */
struct object *store_find(struct store *st, const void *key, size_t len);
/* A bounded slice of a walk over every object: fn(u, o) for the objects
 * of up to max_buckets buckets and about max_objects objects from cursor
 * (0 to start; fn may remove o); the cursor to go on from, UINT64_MAX at
 * the end.  A walk of the whole index on the loop is what this avoids. */
uint64_t store_walk(struct store *st, uint64_t cursor, size_t max_buckets, size_t max_objects,
		    void (*fn)(void *u, struct object *o), void *u);
/* A put of key will come (kvc_announce): lookups of it wait as for a put in
 * progress, until it commits or --lookup-wait-ms passes.  0 (announced, or
 * stored already, or --lookup-wait-ms 0), or -ENOSPC (too many announced)
 * or -ENOMEM. */
int store_announce(struct store *st, const void *key, size_t len);
/* Announcements whose time is up: their waiters run again (they miss). */
unsigned store_expire_announced(struct store *st);
/* Free every announcement (shutdown). */
void store_announced_done(struct store *st);
/* A reservation is committed or gone (holder.c, store_commit()). */
void store_put_landed(struct store *st, struct object *o);
/* A reservation is gone without a commit (holder.c): as landed, and the
 * cluster's lookups stop waiting for it. */
void store_put_abandoned(struct store *st, struct object *o);
int store_commit(struct holder *h, uint64_t handle, char *msg);
/* A version for bytes put now: a hybrid clock, microseconds of the real
 * time unless a version seen (store_version_seen()) or given is later, then
 * one more; never the same twice. */
uint64_t store_version_next(struct store *st);
void store_version_seen(struct store *st, uint64_t v);
/* The key of the reservation handle names (-ESTALE: none), into buf
 * (WIRE_MAX_KEY + 1 bytes). */
int store_reserved_key(struct holder *h, uint64_t handle, char *buf, size_t *ret_len);
int store_abort(struct holder *h, uint64_t handle, char *msg);
int store_acquire(struct holder *h, const void *key, size_t key_len, bool local_only,
		  struct extent *ret, struct fetch **ret_fetch, char *msg);
int store_release(struct holder *h, uint64_t handle, char *msg);
/* The same, keeping sum as the object's checksum: its bytes were hashed
 * (or checked) as they were sent, and the next send need not hash them. */
int store_release_summed(struct holder *h, uint64_t handle, uint64_t sum, char *msg);
/* force: a lease does not refuse it (a view still does).  In a cluster the
 * removal goes to every node's copies too (found here or not), unless
 * local. */
int store_remove(struct store *st, const void *key, size_t key_len, bool force, bool local,
		 char *msg);
/* Remove committed objects whose key starts with prefix, in a bounded
 * slice of the index from cursor; returns the next cursor, UINT64_MAX when
 * the walk is done.  Viewed objects, and leased ones without force, are
 * counted in *ret_skipped. */
uint64_t store_remove_prefix(struct store *st, const void *prefix, size_t len, bool force,
			   bool local, uint64_t cursor, uint64_t *ret_removed,
			   uint64_t *ret_skipped);
int store_pin(struct store *st, const void *key, size_t key_len, bool hard, usec_t ttl,
	      char *msg);
int store_unpin(struct store *st, const void *key, size_t key_len, char *msg);
/* Present or not; a hit counts as a use for LRU and grants a lease, unless
 * peek (it only looks). */
bool store_exists(struct store *st, const void *key, size_t key_len, bool prefetch, bool peek);
/* Start bringing key into dram (from the disk tier or another node) and
 * return at once: 1 if a fetch was started or joined, 0 if it is in memory
 * already or held nowhere known. */
int store_prefetch(struct store *st, const void *key, size_t key_len);
/* Keys this node does not hold: held by another node?  (The remote
 * backend's where(); 0 with nothing set outside a cluster.) */
int store_where(struct store *st, const char *const *keys, const size_t *lens, size_t n,
		uint8_t *present, bool settle, struct fetch **ret);

