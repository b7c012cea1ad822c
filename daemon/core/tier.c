/* SPDX-License-Identifier: MIT */
/*
 * Memory tiers and what keeps them from overflowing.
 *
 * Each tier is one sealed segment with its own allocator and LRU list.
 * Objects live in exactly one tier.  Hot dram objects move up to the device
 * tier after --promotion-hits hits; under pressure device objects move down
 * to dram, and dram objects are dropped.  Moving copies the bytes and is only
 * done to objects nobody holds a view of, so a reader never sees its buffer
 * move or tear.
 *
 * Who may be evicted, in this order (the lists of enum obj_list):
 *   1. unpinned objects, least recently used first, leaves of prefix chains
 *      before their ancestors (OL_LRU);
 *   2. then soft-pinned ones, likewise (OL_SOFT);
 *   3. as a last resort, an ancestor whose descendants are all protected
 *      (OL_ANC).
 * Never an object with a view or a hard pin.  A lease protects an object
 * a hit made recently, and yields when it would cost a request: a leased,
 * unviewed object whose bytes are safe on disk may leave memory for the
 * disk tier (a lease promises the pool, not dram); when a put, a read-back
 * or a fetch finds nothing else to evict, the oldest lease is broken
 * (leases_broken) rather than the request failing; and leased bytes stay
 * under --max-leased-ratio of the tier (a new lease breaks the oldest
 * beyond it), so the rest is there for puts, which are readable right
 * after they return.  A read in progress is protected by its
 * view, never by a lease.  Every victim is the tail of a list, so the
 * search is O(1) whatever is protected.
 *
 * With a disk tier, memory never drops an object that has not reached disk
 * while the disk can take it: a put that would have to waits for the spill
 * (-EAGAIN from tier_alloc(), parked by the caller).  The background evictor
 * never drops a fresh object (committed less than a lease ago).
 */
#include "kvc-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <time.h>
#if KVC_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#endif

#include "tier.h"
#include "values.h"
#include "log.h"

#define LOG_TOPIC "tier"

/* Work per maintenance call, so the fast path never waits long. */
#define MAINTAIN_MAX_OBJECTS 64

/* Segments record their tier in shared memory with the wire's numbers. */
_Static_assert((int) SHM_TIER_DEVICE == (int) WIRE_TIER_DEVICE &&
	       (int) SHM_TIER_DRAM == (int) WIRE_TIER_DRAM &&
	       (int) SHM_TIER_DISK == (int) WIRE_TIER_DISK, "tiers");

/* ---- set-up ---- */

/* --numa-node: the segment's pages come from that node only (set before
 * any page is faulted in, prefaulting included). */
static int bind_numa(struct store *st, struct tier *t)
{
#if KVC_HAVE_NUMA
	struct bitmask *m;
	long r;

	if (!st->numa_bound)
		return 0;
	m = numa_allocate_nodemask();
	if (!m)
		return -ENOMEM;
	numa_bitmask_setbit(m, st->numa_node);
	r = mbind(t->seg.base, t->seg.size, MPOL_BIND, m->maskp, m->size + 1, 0);
	numa_free_nodemask(m);
	if (r < 0) {
		r = -errno;
		log_error("binding the %s tier to NUMA node %u: %s", t->name, st->numa_node,
			  strerror((int) -r));
		return (int) r;
	}
	return 0;
#else
	return st->numa_bound ? -ENOTSUP : 0;
#endif
}

/* The segment the previous run left (fd, taken), when it fits: a warm
 * start keeps its bytes. */
static bool tier_adopt(struct store *st, struct tier *t, int fd, uint64_t size)
{
	const char *why;

	if (fd < 0)
		return false;
	if (shm_segment_adopt(&t->seg, fd, size, t->kind, t->segment, st->generation, &why) < 0) {
		log_warn("not taking over the previous run's %s segment (%s): it starts empty",
			 t->name, why);
		return false;
	}
	t->adopted = true;
	return true;
}

static int tier_init(struct store *st, struct tier *t, const char *name, uint32_t kind,
		     uint32_t segment, uint64_t size, int fd)
{
	const struct shm_seg_header *h;
	char memfd_name[32];
	int r = 0;

	*t = (struct tier) { .name = name, .kind = kind, .segment = segment };
	snprintf(memfd_name, sizeof(memfd_name), "kvcache-%s", name);
	if (!tier_adopt(st, t, fd, size))
		r = shm_segment_create(&t->seg, memfd_name, size, st->cfg->hugepages, kind,
				       segment, st->generation);
	if (r < 0) {
		log_error("Failed to create the %s segment of %llu bytes (hugepages=%s): %s", name,
			  (unsigned long long) size,
			  st->cfg->hugepages == SHM_HUGEPAGES_ON ? "on" :
			  st->cfg->hugepages == SHM_HUGEPAGES_OFF ? "off" : "auto",
			  strerror(-r));
		return r;
	}
	if (st->cfg->hugepages == SHM_HUGEPAGES_AUTO && !t->seg.hugepages && !t->adopted)
		log_warn("2 MiB hugepages unavailable for the %s segment (%s); using 4 KiB pages. "
			 "Reserve them with: echo N > /proc/sys/vm/nr_hugepages",
			 name, strerror(-t->seg.hugepage_error));
	r = bind_numa(st, t);
	if (r < 0) {
		shm_segment_done(&t->seg);
		return r;
	}
	h = shm_segment_header(&t->seg);
	/* The allocator hands out exactly the configured capacity, even when
	 * the memfd was rounded up to whole hugepages. */
	r = shm_alloc_init(&t->alloc, h->data_offset, size);
	if (r < 0) {
		shm_segment_done(&t->seg);
		return r;
	}
	t->high = (uint64_t) ((double) t->alloc.size * st->cfg->high_watermark);
	t->low = (uint64_t) ((double) t->alloc.size *
			     (st->cfg->high_watermark - st->cfg->eviction_ratio));
	log_info("%s tier: %llu bytes, %s pages, evicts above %llu down to %llu", name,
		 (unsigned long long) t->alloc.size, t->seg.hugepages ? "2 MiB" : "4 KiB",
		 (unsigned long long) t->high, (unsigned long long) t->low);
	return 0;
}

uint64_t store_prefaulted(const struct store *st)
{
	return __atomic_load_n(&st->prefaulted, __ATOMIC_RELAXED);
}

void store_note_prefaulted(struct store *st, uint64_t bytes)
{
	__atomic_store_n(&st->prefaulted, bytes, __ATOMIC_RELAXED);
}

/* The catalog is sized for the smallest objects (a sixteenth of the
 * tiers); an entry of some 128-256 bytes for each object of 32 KiB and up
 * takes at most a 128th of them.  Past that it is touched as it fills. */
#define CATALOG_AHEAD_SHARE 128

uint8_t *store_catalog_memory(const struct store *st, uint64_t *ret_size)
{
	uint64_t memory = 0;

	for (unsigned i = 0; i < st->n_tiers; i++)
		memory += st->tiers[i].seg.size;
	memory /= CATALOG_AHEAD_SHARE;
	*ret_size = st->cat.fd < 0 || !st->cat.base ? 0
		    : st->cat.size < memory ? st->cat.size : memory;
	return *ret_size ? st->cat.base : NULL;
}

uint64_t store_catalog_prefaulted(const struct store *st)
{
	return __atomic_load_n(&st->cat_prefaulted, __ATOMIC_RELAXED);
}

void store_note_catalog_prefaulted(struct store *st, uint64_t bytes)
{
	__atomic_store_n(&st->cat_prefaulted, bytes, __ATOMIC_RELAXED);
}

uint8_t *store_tier_memory(const struct tier *t, uint64_t *ret_size)
{
	*ret_size = t->seg.size;
	return t->seg.base;
}

const char *store_tier_name(const struct tier *t)
{
	return t->name;
}

uint8_t *store_extent_ptr(const struct store *st, const struct extent *x)
{
	return (uint8_t *) st->tiers[x->segment].seg.base + x->offset;
}

uint8_t *store_object_ptr(const struct object *o)
{
	return (uint8_t *) o->tier->seg.base + o->block->offset;
}

int store_land_place(struct store *st, struct object *o)
{
	struct tier *t = &st->tiers[0];
	int r;

	if (o->len > t->alloc.size || o->len > (UINT64_C(1) << 30))
		return -E2BIG;
	r = tier_alloc(st, t, o->len, &o->block);
	if (r < 0)
		return r == -EAGAIN ? -ENOSPC : r;
	o->tier = t;
	return 0;
}

uint64_t store_land_offset(const struct object *o)
{
	return o->block->offset;
}

int store_land_publish(struct store *st, struct object *o, bool summed, uint64_t sum)
{
	if (store_find(st, o->key, o->key_len))
		return -EEXIST;
	if (summed)
		object_keep_sum(o, sum);
	object_publish(st, o);
	return 0;
}

int store_recovered(struct store *st, const char *key, size_t key_len, uint64_t len,
		    uint64_t value_sum, uint64_t below_ref, uint64_t below_len)
{
	struct tier *t = &st->below_tier;
	uint64_t hash = index_hash(key, key_len);
	struct object *o, *old = index_find(&st->index, key, key_len, hash);

	if (old && store_object_resident(old) && !old->below_ref && !old->below_io &&
	    old->len == len && (old->flags & OBJ_SUMMED) && old->sum == value_sum) {
		/* kept in memory by a warm start, the same bytes: the
		 * record is its copy below */
		old->below_ref = below_ref;
		old->below_len = below_len;
		return 1;
	}
	if (old) {
		if (!old->below_ref || old->below_ref > below_ref)
			return -EEXIST; /* stored since the start, or a newer record */
		object_drop(st, old); /* (never: records come newest first) */
	}
	o = object_new(key, key_len);
	if (!o)
		return -ENOMEM;
	o->len = len;
	o->tier = t;
	o->below_ref = below_ref;
	o->below_len = below_len;
	o->flags |= OBJ_COMMITTED;
	o->where = OBJ_BELOW;
	index_insert(&st->index, o);
	object_place(st, o, true); /* older than anything stored since the start */
	/* recovery runs on while the node joins: the re-publish's walk may
	 * have passed this object's bucket already */
	object_announce(st, o);
	t->objects++;
	return 0;
}

unsigned store_tier_count(const struct store *st)
{
	return tier_count(st);
}

const struct tier *store_tier(struct store *st, unsigned i)
{
	return tier_at(st, i);
}

void store_below_attach(struct store *st, const struct below_ops *ops, void *be,
			uint64_t size)
{
	struct tier *t = &st->below_tier;

	*t = (struct tier) { .name = ops->name ? ops->name : "below", .kind = SHM_TIER_DISK,
			     .segment = UINT32_MAX };
	t->alloc.size = size;
	t->high = (uint64_t) ((double) size * st->cfg->high_watermark);
	t->low = (uint64_t) ((double) size * (st->cfg->high_watermark - st->cfg->eviction_ratio));
	st->tiers[0].below = t;
	st->below = (struct below) { ops, be };
}

void store_below_detach(struct store *st)
{
	st->below = (struct below) { 0 };
}

void store_below_used(struct store *st, uint64_t used)
{
	st->below_tier.alloc.used = used;
}

uint64_t store_below_size(const struct store *st)
{
	return st->below_tier.alloc.size;
}

bool store_below_has_room(const struct store *st, uint64_t used)
{
	return used < st->below_tier.high;
}

bool store_below_trim(struct store *st, uint64_t used)
{
	struct tier *t = &st->below_tier;
	uint64_t freed = 0, n = 0;

	if (used <= t->high)
		return false;
	tier_evict_some(st, t, used - t->low, false, 64, EVICT_WATERMARK, &freed, &n);
	return n > 0;
}

bool store_spill_due(const struct store *st)
{
	const struct tier *lowest = &st->tiers[0];

	return lowest->alloc.used > lowest->low - lowest->low / 8;
}

void store_below_hold(struct store *st, struct object *o)
{
	o->views++;
	st->copies_held++;
	object_place(st, o, false);
}

bool store_below_unhold(struct store *st, struct object *o)
{
	o->views--;
	st->copies_held--;
	if (!(o->flags & OBJ_DEAD))
		return true;
	if (o->views == 0)
		object_free(st, o);
	return false;
}

void store_below_changed(struct store *st, struct object *o, bool at_tail)
{
	object_place(st, o, at_tail);
}

bool store_object_resident(const struct object *o)
{
	return (o->flags & OBJ_COMMITTED) && !(o->flags & OBJ_DEAD) && o->block;
}

void store_space_freed(struct store *st)
{
	store_emit_space_freed(st);
}

int store_readmit_place(struct store *st, struct object *o, struct shm_block **ret_place,
			uint8_t **ret_dst)
{
	struct tier *dram = &st->tiers[0];
	/* making room in dram never evicts o itself: it is loading (held) */
	int r = tier_alloc(st, dram, o->len, ret_place);

	if (r < 0) {
		*ret_place = NULL;
		return r;
	}
	*ret_dst = (uint8_t *) dram->seg.base + (*ret_place)->offset;
	return 0;
}

void store_readmit(struct store *st, struct object *o, struct shm_block *place, uint64_t sum)
{
	object_keep_sum(o, sum); /* checked as it came back */
	tier_readmit(st, o, place);
}

void store_readmit_cancel(struct store *st, struct object *o, struct shm_block *place)
{
	if (o)
		object_place(st, o, false);
	if (place)
		shm_alloc_free(&st->tiers[0].alloc, place);
}

bool store_object_gone(const struct object *o)
{
	return o->flags & OBJ_DEAD;
}

uint64_t store_tier_capacity(const struct tier *t)
{
	return tier_capacity(t);
}

uint64_t store_tier_used(const struct tier *t)
{
	return tier_used(t);
}

int store_evict(struct store *st, int tier_kind, uint64_t bytes, bool all,
		uint64_t *ret_bytes, uint64_t *ret_objects)
{
	struct tier *t = NULL;

	if (tier_kind != 0 && !(t = tier_for(st, tier_kind)))
		return -EINVAL;
	tier_evict(st, t, bytes, all, EVICT_MANUAL, ret_bytes, ret_objects);
	return 0;
}

void store_load(const struct store *st, uint64_t *ret_capacity, uint64_t *ret_used,
		uint64_t *ret_objects)
{
	*ret_capacity = *ret_used = 0;
	for (unsigned i = 0; i < st->n_tiers; i++) {
		*ret_capacity += tier_capacity(&st->tiers[i]);
		*ret_used += tier_used(&st->tiers[i]);
	}
	*ret_objects = st->index.n_objects;
}

struct object *store_land_object(const void *key, size_t key_len)
{
	return object_new(key, key_len);
}

void store_land_free(struct store *st, struct object *o)
{
	object_free(st, o);
}

int store_land_begin(struct store *st, const void *key, size_t len, bool far,
		     struct object **ret_o, struct fetch **ret_f)
{
	struct object *o = store_landing_find(st, key, len);
	struct fetch *f;

	if (o) { /* single flight */
		*ret_o = o;
		*ret_f = o->fetch;
		return 1;
	}
	o = object_new(key, len);
	f = calloc(1, sizeof(*f));
	if (!o || !f) {
		free(o);
		free(f);
		return -ENOMEM;
	}
	f->o = o;
	f->far = far;
	o->fetch = f;
	store_landing_add(st, o);
	*ret_o = o;
	*ret_f = f;
	return 0;
}

/* A landing that failed with res goes on in the shared tier (true: its
 * backend has it now), unless it comes from there already. */
static bool shared_next(struct store *st, struct object *o, int res)
{
	const struct below *sh = &st->shared;

	/* no room here, or stored here meanwhile: the shared tier would not
	 * change that */
	if (!sh->ops || !sh->ops->locate || (o->flags & OBJ_SHARED) || res == -ENOMEM ||
	    res == -ENOSPC || res == -E2BIG || res == -EEXIST)
		return false;
	if (o->block) {
		shm_alloc_free(&o->tier->alloc, o->block);
		o->block = NULL;
	}
	o->len = 0;
	o->ver = 0;
	o->flags |= OBJ_SHARED;
	return sh->ops->locate(sh->be, o) == 0;
}

int store_land_done(struct store *st, struct object *o, int res, bool summed, uint64_t sum)
{
	bool fetched = o->fetch != NULL;

	/* not from another node: perhaps from the shared tier (its waiters
	 * wait on) */
	if (fetched && res < 0 && shared_next(st, o, res))
		return -EINPROGRESS;

	if (fetched)
		store_landing_remove(st, o);
	if (res == 0 && store_land_publish(st, o, summed, sum) == -EEXIST)
		res = -EEXIST;
	/* waiters find a copy stored meanwhile in the index */
	if (fetched)
		fetch_done(st, o, res == -EEXIST ? 0 : res);
	if (res != 0)
		object_free(st, o);
	return res;
}

void store_land_abandon(struct store *st, struct object *o)
{
	store_landing_remove(st, o);
	free(o->fetch); /* nobody waits: sessions went first */
	o->fetch = NULL;
	object_free(st, o);
}

void store_drop(struct store *st, struct object *o)
{
	object_drop(st, o);
}

uint32_t store_sum_hold(struct store *st, struct object *o)
{
	uint32_t used = o->used_ms;

	o->views++;
	o->flags |= OBJ_SUMMING;
	object_place(st, o, false); /* held: off the lists eviction takes from */
	o->used_ms = used;
	return used;
}

void store_sum_release(struct store *st, struct object *o, bool ok, uint64_t sum, uint32_t used)
{
	o->views--;
	o->flags &= ~OBJ_SUMMING;
	if (o->flags & OBJ_DEAD) {
		if (o->views == 0)
			object_free(st, o);
		return;
	}
	if (ok && !(o->flags & OBJ_SUMMED)) {
		object_keep_sum(o, sum);
		catalog_rewrite(st, o); /* a crash keeps it now */
	}
	if (o->views == 0 && o->used_ms == used)
		object_place_used(st, o, used);
	else if (o->views == 0)
		object_place(st, o, false);
}

int store_landing_init(struct store *st)
{
	return st->landing.buckets ? 0 : index_init(&st->landing);
}

void store_landing_done(struct store *st)
{
	if (st->landing.buckets)
		index_done(&st->landing);
	st->landing = (struct index) { 0 };
}

struct object *store_landing_find(struct store *st, const void *key, size_t len)
{
	return index_find(&st->landing, key, len, index_hash(key, len));
}

void store_landing_add(struct store *st, struct object *o)
{
	index_insert(&st->landing, o);
}

void store_landing_remove(struct store *st, struct object *o)
{
	index_unlink(&st->landing, o);
}

struct object *store_find(struct store *st, const void *key, size_t len)
{
	return index_find(&st->index, key, len, index_hash(key, len));
}

uint64_t store_walk(struct store *st, uint64_t cursor, size_t max_buckets, size_t max_objects,
		    void (*fn)(void *u, struct object *o), void *u)
{
	return index_walk_some(&st->index, cursor, max_buckets, max_objects, fn, u);
}

int tiers_init(struct store *st, int dram_fd, int device_fd)
{
	struct tier *dram = &st->tiers[0];
	int r;

	/* segment 0 is always dram; the device tier, when on, is segment 1 */
	r = tier_init(st, dram, "dram", SHM_TIER_DRAM, 0, st->cfg->dram_size, dram_fd);
	if (r < 0) {
		if (device_fd >= 0)
			close(device_fd);
		return r;
	}
	st->n_tiers = 1;
	st->fastest = dram;
	st->hugepages = dram->seg.hugepages;
	if (st->cfg->device_size) {
		struct tier *dev = &st->tiers[1];

		r = tier_init(st, dev, "device", SHM_TIER_DEVICE, 1, st->cfg->device_size,
			      device_fd);
		device_fd = -1;
		if (r < 0) {
			tiers_done(st);
			return r;
		}
		dev->below = dram;
		st->n_tiers = 2;
		st->fastest = dev;
		st->hugepages = st->hugepages && dev->seg.hugepages;
	} else if (device_fd >= 0) {
		log_warn("not taking over the previous run's device segment: no device tier now");
		close(device_fd);
	}
	return 0;
}

void tiers_done(struct store *st)
{
	for (unsigned i = 0; i < st->n_tiers; i++) {
		shm_alloc_done(&st->tiers[i].alloc);
		shm_segment_done(&st->tiers[i].seg);
	}
	st->n_tiers = 0;
	free(st->promote_q);
	st->promote_q = NULL;
	st->n_promote = st->cap_promote = 0;
}

struct tier *tier_for(struct store *st, int requested)
{
	if (requested == 0)
		requested = SHM_TIER_DRAM; /* puts land in dram */
	for (unsigned i = 0; i < tier_count(st); i++)
		if (tier_at(st, i)->kind == (uint32_t) requested)
			return tier_at(st, i);
	return NULL;
}

/* ---- moving between tiers ---- */

/* o now lives in tier `to` (in block b, NULL below memory): counts, lists
 * and bytes moved follow.  Its old block is the caller's. */
static void rehome(struct store *st, struct object *o, struct tier *to, struct shm_block *b,
		   enum object_where where)
{
	object_unplace(st, o);
	o->tier->objects--;
	o->tier = to;
	o->block = b;
	o->where = (uint8_t) where;
	o->hits = 0;
	to->objects++;
	object_place(st, o, false);
	catalog_note(st, o);
	to->st.bytes_moved += o->len;
	st->stats.bytes_moved += o->len;
}

/* Copy o into tier `to` and switch it over.  Only for objects without
 * views: nobody can be reading the old bytes. */
static int move(struct store *st, struct object *o, struct tier *to, bool may_evict)
{
	struct tier *from = o->tier;
	bool placed = o->list != OL_NONE;
	struct shm_block *b;
	int r;

	if (o->views)
		return -EBUSY;
	/* making room in `to` must not pick o itself */
	object_unplace(st, o);
	r = may_evict ? tier_alloc(st, to, o->len, &b) : shm_alloc_block(&to->alloc, o->len, &b);
	if (r < 0) {
		if (placed)
			object_place(st, o, false);
		return r;
	}
	memcpy((uint8_t *) to->seg.base + b->offset, (uint8_t *) from->seg.base + o->block->offset,
	       o->len);
	shm_alloc_free(&from->alloc, o->block);
	rehome(st, o, to, b, OBJ_MEMORY);
	return 0;
}

/* Ask the backend for a copy of o, held like a view until it ends. */
int tier_shared_copy(struct store *st, struct object *o)
{
	int r;

	o->flags |= OBJ_SHARING;
	store_below_hold(st, o);
	r = st->shared.ops->spill(st->shared.be, o);
	if (r < 0) {
		o->flags &= ~OBJ_SHARING;
		o->views--;
		st->copies_held--;
		object_place(st, o, true);
	}
	return r;
}

/* o leaves memory: the shared tier takes a copy first, when it has none
 * and can take one now.  0: go on; -EAGAIN: wait for the copy. */
static int shared_keep(struct store *st, struct object *o)
{
	const struct below *sh = &st->shared;
	int r;

	if (!sh->ops || (o->flags & OBJ_SHARED))
		return 0;
	if (o->flags & OBJ_SHARING)
		return -EAGAIN;
	if (!sh->ops->accepting(sh->be, o))
		return 0; /* off, full or read-only: o goes without a copy */
	/* -EBUSY: copies enough already; wait for one of them to end */
	r = tier_shared_copy(st, o);
	return r == 0 || r == -EBUSY ? -EAGAIN : 0;
}

/* o's bytes are on disk already: only its memory goes. */
static uint64_t demote_below(struct store *st, struct tier *t, struct object *o)
{
	struct tier *disk = &st->below_tier;
	uint64_t size = o->block->size;

	shm_alloc_free(&t->alloc, o->block);
	rehome(st, o, disk, NULL, OBJ_BELOW);
	disk->st.demotions++;
	st->stats.demotions++;
	return size;
}

static bool clean(const struct object *o)
{
	return o->below_ref != 0; /* (a copy is taken only of an object without one) */
}

static bool fresh(const struct store *st, const struct object *o)
{
	return o->committed + st->cfg->lease_ttl_ms * USEC_PER_MSEC > store_now(st);
}

/* Free one victim's space in t: demote it if there is a tier below, drop it
 * otherwise.  Returns the bytes freed in t; 0 when o must stay (a fresh
 * object and the background evictor); -EAGAIN when o must reach disk
 * first (its spill is started). */
static int64_t evict_one(struct store *st, struct tier *t, struct object *o, enum evict_reason why)
{
	uint64_t size;

	if (t == &st->below_tier) {
		/* only asked for by name, or the disk's own watermark: the
		 * record goes, and the object */
		size = o->below_len;
		goto drop;
	}
	size = o->block->size;
	if ((!t->below || t->below == &st->below_tier) && why != EVICT_MANUAL) {
		/* it leaves memory: the shared tier takes a copy first */
		int r = shared_keep(st, o);

		if (r < 0)
			return r;
	}
	if (t->below == &st->below_tier) {
		if (clean(o))
			return (int64_t) demote_below(st, t, o);
		if (why != EVICT_MANUAL && st->below.ops->accepting(st->below.be, o)) {
			/* never drop what has not reached disk while the disk
			 * can take it: wait for the spill */
			st->below.ops->spill(st->below.be, o);
			return -EAGAIN;
		}
	} else if (t->below && why != EVICT_MANUAL) {
		int r = move(st, o, t->below, true);

		if (r == 0) {
			t->below->st.demotions++;
			st->stats.demotions++;
			return (int64_t) size;
		}
		if (r == -EAGAIN)
			return r;
	}
	if (why == EVICT_WATERMARK && fresh(st, o))
		return 0;
drop:
	t->st.evictions[why]++;
	t->st.evicted_bytes += size;
	st->stats.evictions++;
	st->stats.evicted_bytes += size;
	object_drop(st, o);
	return (int64_t) size;
}

/* Leases that ran out protect nothing: back to the list their state says
 * (object_place_used(): their last use was when the lease began), a
 * bounded number per call (the oldest lease is at the tail). */
static void expire_leases(struct store *st, struct tier *t, unsigned budget)
{
	struct object *o;

	while (budget-- && (o = t->lists[OL_LEASED].tail) && o->lease_until <= store_now(st)) {
		st->stats.evict_examined++;
		object_place_used(st, o,
				  used_stamp(o->lease_until - st->cfg->lease_ttl_ms * USEC_PER_MSEC));
	}
}

/* The next victim in t, or NULL: the tail of the first non-empty list.
 * evict_examined counts what a put's eviction looks at (the background
 * evictor's idle checks are not a put's cost). */
static struct object *victim(struct store *st, struct tier *t, enum evict_reason why)
{
	static const enum obj_list order[] = { OL_LRU, OL_SOFT, OL_ANC };

	expire_leases(st, t, 64);
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		st->stats.evict_examined += why == EVICT_CAPACITY;
		if (t->lists[order[i]].tail)
			return t->lists[order[i]].tail;
	}
	return NULL;
}

/* Above a disk tier, when everything else is protected: a leased, unviewed
 * object with a clean copy on disk may leave memory (a lease promises the
 * pool, not dram).  Looks at a few of the oldest leases only. */
static struct object *leased_clean(struct store *st, struct tier *t)
{
	unsigned budget = 16;

	if (t->below != &st->below_tier)
		return NULL;
	for (struct object *o = t->lists[OL_LEASED].tail; o && budget--; o = o->lru_prev) {
		st->stats.evict_examined++;
		if (clean(o))
			return o;
	}
	return NULL;
}

/* The oldest lease in t, broken: its object goes back among the others,
 * as used when the lease began (NULL: no lease). */
/* Evict from t until `bytes` are freed (or everything evictable with all),
 * at most max objects.  0, or -EAGAIN (see evict_one()). */
int tier_evict_some(struct store *st, struct tier *t, uint64_t bytes, bool all, unsigned max,
		      enum evict_reason why, uint64_t *freed, uint64_t *n)
{
	while ((all || *freed < bytes) && max--) {
		struct object *o = victim(st, t, why);
		int64_t r;

		if (!o && why == EVICT_CAPACITY) {
			/* nothing else: a lease yields rather than the request,
			 * one whose bytes are on disk first */
			o = leased_clean(st, t);
			if (!o)
				o = object_break_lease(st, t);
		}
		if (!o)
			return 0;
		r = evict_one(st, t, o, why);
		if (r <= 0)
			return (int) r;
		*freed += (uint64_t) r;
		(*n)++;
	}
	return 0;
}

void tier_evict(struct store *st, struct tier *t, uint64_t bytes, bool all, enum evict_reason why,
		uint64_t *ret_bytes, uint64_t *ret_objects)
{
	uint64_t freed = 0, n = 0;

	if (t)
		tier_evict_some(st, t, bytes, all, UINT32_MAX, why, &freed, &n);
	else
		/* every memory tier; the disk tier only when named */
		for (unsigned i = 0; i < st->n_tiers && (all || freed < bytes); i++)
			tier_evict_some(st, &st->tiers[i], bytes - (freed < bytes ? freed : bytes), all,
				   UINT32_MAX, why, &freed, &n);
	if (ret_bytes)
		*ret_bytes = freed;
	if (ret_objects)
		*ret_objects = n;
}

int tier_alloc(struct store *st, struct tier *t, uint64_t len, struct shm_block **ret)
{
	for (;;) {
		uint64_t freed = 0, n = 0, free_bytes = t->alloc.size - t->alloc.used;
		int r = shm_alloc_block(&t->alloc, len, ret);

		if (r != -ENOSPC)
			return r;
		/* Free at least the shortfall; fragmentation may need more
		 * rounds, each of which frees one more victim at least. */
		r = tier_evict_some(st, t, len > free_bytes ? len - free_bytes : len, false, UINT32_MAX,
			       EVICT_CAPACITY, &freed, &n);
		if (r < 0)
			return r;
		if (n == 0)
			/* nothing to evict now; copies that end free some */
			return st->copies_held ? -EAGAIN : -ENOSPC;
	}
}

void tier_explain(const struct store *st, const struct tier *t, char *buf, size_t len)
{
	const struct olist *l = t->lists;

	snprintf(buf, len, "%llu viewed or in transit, %llu hard-pinned, %llu leased, %llu evictable "
		 "(%llu bytes allocated, largest free block %llu)",
		 (unsigned long long) l[OL_HELD].n, (unsigned long long) l[OL_PINNED].n,
		 (unsigned long long) l[OL_LEASED].n,
		 (unsigned long long) (l[OL_LRU].n + l[OL_SOFT].n + l[OL_ANC].n),
		 (unsigned long long) t->alloc.used,
		 (unsigned long long) shm_alloc_largest_free(&t->alloc));
	(void) st;
}

void tier_readmit(struct store *st, struct object *o, struct shm_block *b)
{
	struct tier *dram = &st->tiers[0];

	rehome(st, o, dram, b, OBJ_MEMORY);
	dram->st.promotions++;
	st->stats.promotions++;
}

/* The disk tier keeps its capacity and bytes in use in the same fields
 * (its allocator is never used to allocate), so status code is uniform. */
uint64_t tier_capacity(const struct tier *t)
{
	return t->alloc.size;
}

uint64_t tier_used(const struct tier *t)
{
	return t->alloc.used;
}

unsigned tier_count(const struct store *st)
{
	return st->n_tiers + (st->below.ops != NULL);
}

struct tier *tier_at(struct store *st, unsigned i)
{
	return i < st->n_tiers ? &st->tiers[i] : &st->below_tier;
}

/* ---- background work ---- */

bool tier_maintain(struct store *st)
{
	bool did = false;

	/* watermarks: once above high, free down to low, a slice at a time */
	for (unsigned i = 0; i < st->n_tiers; i++) {
		struct tier *t = &st->tiers[i];
		uint64_t freed = 0, n = 0;

		expire_leases(st, t, MAINTAIN_MAX_OBJECTS);
		if (t->alloc.used <= t->high)
			continue;
		tier_evict_some(st, t, t->alloc.used - t->low, false, MAINTAIN_MAX_OBJECTS,
			   EVICT_WATERMARK, &freed, &n);
		did = did || n > 0;
	}
	/* one promotion per call: copies can be large.  Objects someone is
	 * reading stay queued (a get holds a view while it copies). */
	for (size_t i = st->n_promote; i-- > 0;) {
		struct object *o = st->promote_q[i];
		struct tier *up = st->fastest;

		if (o->views)
			continue;
		st->promote_q[i] = st->promote_q[--st->n_promote];
		o->flags &= ~OBJ_PROMOTE;
		if (o->tier == up)
			continue;
		/* Make room up there first.  Demoting into dram may evict in
		 * dram, where o lives: off its list meanwhile, it cannot be
		 * picked. */
		object_unplace(st, o);
		if (up->alloc.used + o->len > up->high) {
			uint64_t freed = 0, n = 0;

			tier_evict_some(st, up, up->alloc.used + o->len - up->low, false, UINT32_MAX,
				   EVICT_WATERMARK, &freed, &n);
		}
		if (move(st, o, up, false) == 0) {
			up->st.promotions++;
			st->stats.promotions++;
		} else
			object_place(st, o, false);
		did = true;
		break;
	}
	if (st->below.ops && st->below.ops->maintain(st->below.be))
		did = true;
	/* a growing index finishes in the background too */
	if (index_migrate(&st->index, 256))
		did = true;
	return did;
}
