/* SPDX-License-Identifier: MIT */
/*
 * Objects and the tiers that hold their bytes.  Nothing here is visible to
 * clients: they see only segment bytes and (segment, offset, length,
 * handle) tuples.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "shmem.h"

#define DAEMON_MAX_TIERS 3

struct disk_io;
struct fetch;

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
	uint64_t bytes; /* the objects' lengths */
	/* the last object an expired lease put among older ones (tier.c:
	 * expire_leases()); NULL once it leaves the list */
	struct object *aged;
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
	bool adopted;         /* its segment is the previous run's (a warm start) */
	struct tier_stats st;
};

enum object_flags {
	OBJ_COMMITTED = 1u << 0,
	OBJ_DEAD = 1u << 1,      /* unlinked; freed when the last view goes */
	OBJ_SOFT_PIN = 1u << 2,
	OBJ_HARD_PIN = 1u << 3,
	OBJ_PROMOTE = 1u << 4,   /* queued for promotion */
	OBJ_SUMMED = 1u << 5,    /* sum is the XXH3-64 of its bytes, checked or taken once */
	OBJ_SUM_QUEUED = 1u << 6, /* waiting for its checksum to be taken ahead */
	OBJ_SUMMING = 1u << 7,   /* one of its views is that checksum being taken */
	OBJ_IN_FLIGHT = 1u << 8, /* RESERVED, in st->reserving: lookups may wait for it */
	OBJ_ANNOUNCED = 1u << 9, /* a placeholder in st->announced: a put to come */
	OBJ_REPLACED = 1u << 10, /* its put replaced the key: older copies elsewhere go */
	OBJ_SHARED = 1u << 11,   /* the shared tier has its bytes (or was asked for them) */
	OBJ_SHARING = 1u << 12,  /* the shared tier is taking a copy (o is held) */
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
	/* the tier below's own list (the disk's: memory objects without a
	 * copy there yet, the next to copy at its tail); core never reads it */
	struct object *below_prev, *below_next;
	/* prefix chains: the previous block of the same prompt, if it was
	 * stored when this one was committed, and this block's own children */
	struct object *parent;
	struct object *first_child, *next_sibling, *prev_sibling;
	uint32_t n_children;
	/* when it last went to the head of its list (a use): used_stamp(),
	 * compared as a difference, so good for spans of 24 days */
	uint32_t used_ms;
	uint64_t hash;
	uint64_t len;
	/* with OBJ_SUMMED: the transfer checksum of its bytes (net/checksum.h,
	 * the XXH3-64 a disk record holds too), learnt when they arrived
	 * checked, were first sent, or were written to or read back from disk;
	 * objects never change once committed, so a later send need not hash
	 * them again (object_keep_sum()) */
	uint64_t sum;
	/* the version of its bytes (store_version_next() at its put, or the
	 * one it came with from another node; 0: unknown, as after recovery
	 * from disk): the cluster keeps the newest copies of a key */
	uint64_t ver;
	struct tier *tier;
	struct shm_block *block;
	usec_t lease_until;               /* protects while in the future */
	usec_t pin_until;                 /* soft pin expiry; 0 = until unpinned */
	usec_t committed;                 /* fresh objects are not dropped in the background */
	uint32_t views;
	uint32_t flags;
	uint8_t list;                     /* enum obj_list */
	uint8_t where;                    /* enum object_where */
	bool below_listed;                /* on that list */
	uint32_t hits;                    /* in this tier, for promotion */
	uint32_t key_len;
	char *parent_key;                 /* asked for at reserve; linked at commit */
	uint32_t parent_len;
	uint32_t sum_slot;                /* presum.c: its place while OBJ_SUM_QUEUED */
	/* the tier below's (below.h), opaque to core: its complete copy
	 * (below_ref 0: none; a clean copy of a memory object, or the only
	 * copy) and that copy's size there; below_io, the transfer it has in
	 * flight on o (a copy being taken, which only an object without one
	 * has, or a copy read back) */
	uint64_t below_ref;
	uint64_t below_len;
	union {
		void *below_io;
		const void *reserver;     /* RESERVED: whose reservation (its holder) */
	};
	struct fetch *fetch;              /* coming back into memory (fetch.c) */
	/* its entry in the catalog (catalog.h) while committed in memory */
	struct shm_block *cat;
	char key[];                       /* NUL-terminated */
};

/* A use's time packed in 32 bits (object.used_ms): the clock in ms,
 * modulo 2^32. */
static inline uint32_t used_stamp(usec_t t)
{
	return (uint32_t) (t / USEC_PER_MSEC);
}

/* The views that stand in the way of removing o: a checksum taken ahead
 * (OBJ_SUMMING) holds one only to keep the bytes until it is done, as a
 * replaced object's readers do. */
static inline uint32_t object_readers(const struct object *o)
{
	return o->views - ((o->flags & OBJ_SUMMING) ? 1 : 0);
}

/* o's XXH3-64, learnt from bytes checked or hashed as they moved: kept for
 * the next send, which the receiver still checks. */
static inline void object_keep_sum(struct object *o, uint64_t sum)
{
	o->sum = sum;
	o->flags |= OBJ_SUMMED;
}
