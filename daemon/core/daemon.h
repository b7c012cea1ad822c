/* SPDX-License-Identifier: MIT */
/*
 * The daemon's private state.  Nothing here is visible to clients: they see
 * only segment bytes and (segment, offset, length, handle) tuples.
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "config.h"
#include "fetch.h"
#include "loop.h"
#include "shmem.h"
#include "wire.h"

#define DAEMON_MAX_TIERS 3

enum evict_reason {
	EVICT_CAPACITY,  /* a put found no room */
	EVICT_WATERMARK, /* the background evictor */
	EVICT_MANUAL,    /* kvcachectl evict */
	EVICT_REASONS,
};

struct tier_stats {
	uint64_t hits, misses;
	uint64_t promotions, demotions; /* objects that arrived by moving up / down */
	uint64_t evictions[EVICT_REASONS];
	uint64_t evicted_bytes;
	uint64_t bytes_moved;           /* promoted or demoted into this tier */
};

/*
 * Each tier keeps its committed objects on one of these lists, chosen by
 * what protects them (object_class()), most recently used at the head.
 * Eviction takes the tail of LRU, then SOFT, then ANC: every victim is
 * found in O(1), however many objects are leased, viewed or pinned.
 */
enum obj_list {
	OL_NONE,   /* not listed: reserved, dropped, or being moved */
	OL_LRU,    /* unprotected leaves of prefix chains (and non-chain objects) */
	OL_SOFT,   /* soft-pinned leaves */
	OL_ANC,    /* unprotected objects that have children: evicted last */
	OL_LEASED, /* a lease was granted; oldest lease at the tail */
	OL_HELD,   /* viewed, being spilled or being read back */
	OL_PINNED, /* hard-pinned */
	OL_COUNT,
};

struct olist {
	struct object *head, *tail;
	uint64_t n;
};

struct tier {
	const char *name;     /* "device", "dram", "disk" */
	uint32_t kind;        /* enum shm_tier */
	uint32_t segment;     /* index in the Welcome's segment list */
	struct shm_segment seg;
	struct shm_alloc alloc;
	uint64_t objects;     /* committed objects living here */
	uint64_t high;        /* bytes: above this the evictor starts... */
	uint64_t low;         /* ...and frees down to this */
	struct olist lists[OL_COUNT];
	struct tier *below;   /* where demoted objects go; NULL: they are dropped */
	struct tier_stats st;
};

enum object_flags {
	OBJ_COMMITTED = 1u << 0,
	OBJ_DEAD = 1u << 1,      /* unlinked; freed when the last view goes */
	OBJ_SOFT_PIN = 1u << 2,
	OBJ_HARD_PIN = 1u << 3,
	OBJ_PROMOTE = 1u << 4,   /* queued for promotion */
};

/*
 * Where an object's bytes are:
 *
 *  RESERVED --commit--> MEMORY --evicted, copy below--> BELOW
 *                        ^  |                             |
 *                        |  +--evicted, no copy--> (dropped)  acquire,
 *                        |                             |  prefetch
 *                        +---- fetch done <-- FETCHING <--+
 *                                  (failed: back to BELOW)
 *
 * MEMORY objects have a block in their tier; MEMORY -> MEMORY moves
 * (promotion, demotion) need views == 0.  BELOW and FETCHING hold no
 * block: their tier is the disk tier's bookkeeping.
 */
enum object_where {
	OBJ_RESERVED,
	OBJ_MEMORY,
	OBJ_BELOW,
	OBJ_FETCHING,
};

struct object {
	struct object *hnext;             /* hash chain */
	struct object *lru_prev, *lru_next; /* in its tier's list o->list */
	struct object *dirty_prev, *dirty_next; /* d->dirty: no copy on disk yet */
	/* prefix chains: the previous block of the same prompt, if it was
	 * stored when this one was committed, and this block's own children */
	struct object *parent;
	struct object *first_child, *next_sibling, *prev_sibling;
	uint32_t n_children;
	uint64_t hash;
	uint64_t len;
	struct tier *tier;
	struct shm_block *block;
	uint64_t lease_until;             /* ms, monotonic; protects while in the future */
	uint64_t pin_until;               /* soft pin expiry, ms; 0 = until unpinned */
	uint64_t committed_ms;            /* fresh objects are not dropped in the background */
	uint32_t views;
	uint32_t flags;
	uint8_t list;                     /* enum obj_list */
	uint8_t where;                    /* enum object_where */
	bool dirty;                       /* on d->dirty */
	uint32_t hits;                    /* in this tier, for promotion */
	uint32_t key_len;
	char *parent_key;                 /* asked for at reserve; linked at commit */
	uint32_t parent_len;
	/* disk tier: a complete record <disk_id>.kvr of disk_len bytes holds
	 * a copy (clean copy of a memory object, or the only copy) */
	uint64_t disk_id;
	uint64_t disk_len;
	struct disk_io *spill;            /* a record being written */
	struct disk_io *load;             /* disk.c: the read bringing it back */
	struct fetch *fetch;              /* coming back into memory (fetch.c) */
	char key[];                       /* NUL-terminated */
};

/* Hash table + LRU list of committed objects. */
struct index {
	struct object **buckets;
	size_t n_buckets;
	struct object **old;   /* the table being grown out of, or NULL */
	size_t n_old, migrate_pos;
	size_t n_objects;
	uint64_t bytes;
};

int index_init(struct index *idx);
void index_done(struct index *idx);
uint64_t index_hash(const void *key, size_t len);
struct object *index_find(struct index *idx, const void *key, size_t len, uint64_t hash);
int index_insert(struct index *idx, struct object *o);
void index_unlink(struct index *idx, struct object *o);
/* Move up to budget old buckets into a growing table; false if none left. */
bool index_migrate(struct index *idx, size_t budget);
/* Every indexed object, O(n): admin and shutdown only.  fn may free o (the
 * walk does not touch it again) but must not unlink others. */
void index_walk(struct index *idx, void (*fn)(void *u, struct object *o), void *u);
/* The same over at most max_buckets buckets from cursor (0 to start); the
 * next cursor, or UINT64_MAX when done.  While the index grows it first
 * finishes moving buckets (bounded too), returning the same cursor. */
uint64_t index_walk_some(struct index *idx, uint64_t cursor, size_t max_buckets,
			 void (*fn)(void *u, struct object *o), void *u);


struct stats {
	uint64_t puts, gets, hits, misses, exists;
	uint64_t bytes_in, bytes_out;
	uint64_t errors, protocol_errors;
	uint64_t removes, evictions, evicted_bytes;
	uint64_t promotions, demotions, bytes_moved;
	uint64_t reserves, aborts, put_conflicts;
	uint64_t connections, reclaimed_reservations, reclaimed_views;
	uint64_t refused_clients, refused_channels, refused_buffers; /* daemon-wide limits */
	uint64_t evict_examined;   /* objects looked at to choose victims: O(1) each */
	uint64_t spill_waits;      /* puts that waited for a spill */
};

struct session;
struct channel;
struct parked;
struct disk;
struct disk_io;

struct daemon {
	struct config *cfg;
	struct loop *loop;
	char socket_path[sizeof(((struct config *) 0)->socket)];
	char lock_path[sizeof(((struct config *) 0)->socket) + 8];
	int listen_fd, signal_fd, lock_fd;
	struct loop_source *listen_src, *signal_src;
	struct loop_source *channels_src, *maintain_src, *space_timer;
	uint64_t generation;
	struct timespec started;
	bool hugepages;

	struct tier tiers[DAEMON_MAX_TIERS]; /* by segment index: dram first */
	unsigned n_tiers;   /* memory tiers */
	struct tier disk_tier; /* valid when disk != NULL; no segment */
	struct disk *disk;
	struct tier *fastest;  /* lookups go fastest first */
	struct backend below;  /* what holds copies below memory: the disk tier */
	/* memory objects without a copy on disk, oldest at the tail: what
	 * spilling takes next (only with a disk tier) */
	struct olist dirty;
	uint64_t space_seq;        /* bumped when a spill ends: waiters retry */
	struct parked *space_head, *space_tail; /* puts waiting for a spill (channel.c) */
	uint64_t space_seen;
	struct object **promote_q; /* objects waiting to move up */
	size_t n_promote, cap_promote;
	struct index index;
	struct stats stats;

	struct session *sessions; /* doubly linked through session->next/prev */
	struct channel *channels; /* every session's, for the poller */
	uint32_t n_sessions;
	uint32_t n_channels;       /* all sessions' */
	uint64_t registered_bytes; /* all sessions' registered buffers */
	uint64_t next_session_id;
};

/* Memory tiers (tier.c). */
int tier_setup(struct daemon *d);
void tier_teardown(struct daemon *d);
struct tier *tier_for(struct daemon *d, int requested);
struct object *object_new(const void *key, size_t key_len);
/* Free the object's space and the object itself. */
void object_free(struct daemon *d, struct object *o);
/* Make a reserved object visible: index, tier LRU, prefix link. */
void object_publish(struct daemon *d, struct object *o);
/* Unlink a committed object; freed now, or when its last view goes. */
void object_drop(struct daemon *d, struct object *o);
/* A read hit: LRU, lease, per-tier hit counts, promotion. */
void object_hit(struct daemon *d, struct object *o, bool lease, bool counts_for_promotion);
/* What protects it from eviction right now (NULL: nothing). */
const char *object_protected(const struct daemon *d, const struct object *o, bool soft_ok);
/* Put o on the list of its tier that its state calls for (most recent end,
 * or the least recent with at_tail); call after any change to its views,
 * lease, pins, children, load or spill.  No-op for uncommitted objects. */
void object_place(struct daemon *d, struct object *o, bool at_tail);
void object_unplace(struct daemon *d, struct object *o);
/* On d->dirty exactly when it is in memory with no copy on disk. */
void object_dirty_update(struct daemon *d, struct object *o);
/* Allocate len bytes in t, evicting unused objects when it is full.
 * -ENOSPC: everything left is protected; -EAGAIN: what could give way has
 * not reached the disk tier yet (its spill was started: retry when a spill
 * ends, d->space_seq). */
int tier_alloc(struct daemon *d, struct tier *t, uint64_t len, struct shm_block **ret);
/* Evict from t (NULL = every tier): leaves of prefix chains first, least
 * recently used first, unpinned before soft-pinned, never protected ones. */
void tier_evict(struct daemon *d, struct tier *t, uint64_t bytes, bool all,
		enum evict_reason why, uint64_t *ret_bytes, uint64_t *ret_objects);
/* The same, at most max objects, and the reason's rules (see tier.c);
 * 0 or -EAGAIN. */
int tier_evict_some(struct daemon *d, struct tier *t, uint64_t bytes, bool all, unsigned max,
		    enum evict_reason why, uint64_t *freed, uint64_t *n);
/* Why nothing more can be evicted from t, for error messages. */
void tier_explain(const struct daemon *d, const struct tier *t, char *buf, size_t len);
/* Background work: watermarks, promotions.  True if it did something. */
bool tier_maintain(struct daemon *d);
/* A disk-only object read back into dram block b. */
void tier_readmit(struct daemon *d, struct object *o, struct shm_block *b);
uint64_t tier_capacity(const struct tier *t);
uint64_t tier_used(const struct tier *t);
/* Tiers for status: memory tiers, then disk. */
unsigned tier_count(const struct daemon *d);
struct tier *tier_at(struct daemon *d, unsigned i);

/* The time requests are judged against (the loop's, per turn). */
static inline uint64_t now_ms(const struct daemon *d)
{
	return loop_now_ms(d->loop);
}

