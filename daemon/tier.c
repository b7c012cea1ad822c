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
 * Who may be evicted, in this order (see object_protected()):
 *   1. unpinned objects, least recently used first, leaves of prefix chains
 *      before their ancestors;
 *   2. then soft-pinned ones, likewise;
 *   3. as a last resort, an ancestor whose descendants are all protected.
 * Never an object with a view, a live lease or a hard pin.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

#define LOG_TOPIC "tier"

/* Work per maintenance call, so the fast path never waits long. */
#define MAINTAIN_MAX_OBJECTS 64

/* ---- LRU, per tier ---- */

void tier_lru_link(struct tier *t, struct object *o)
{
	o->lru_prev = NULL;
	o->lru_next = t->lru_head;
	if (o->lru_next)
		o->lru_next->lru_prev = o;
	else
		t->lru_tail = o;
	t->lru_head = o;
}

void tier_lru_unlink(struct tier *t, struct object *o)
{
	if (o->lru_prev)
		o->lru_prev->lru_next = o->lru_next;
	else
		t->lru_head = o->lru_next;
	if (o->lru_next)
		o->lru_next->lru_prev = o->lru_prev;
	else
		t->lru_tail = o->lru_prev;
	o->lru_prev = o->lru_next = NULL;
}

/* ---- set-up ---- */

static int tier_init(struct daemon *d, struct tier *t, const char *name, uint32_t kind,
		     uint32_t segment, uint64_t size)
{
	const struct shm_seg_header *h;
	char memfd_name[32];
	int r;

	*t = (struct tier) { .name = name, .kind = kind, .segment = segment };
	snprintf(memfd_name, sizeof(memfd_name), "kvcache-%s", name);
	r = shm_segment_create(&t->seg, memfd_name, size, d->cfg->hugepages, kind, segment,
			       d->generation);
	if (r < 0) {
		log_error("Failed to create the %s segment of %llu bytes (hugepages=%s): %s", name,
			  (unsigned long long) size,
			  d->cfg->hugepages == SHM_HUGEPAGES_ON ? "on" :
			  d->cfg->hugepages == SHM_HUGEPAGES_OFF ? "off" : "auto",
			  strerror(-r));
		return r;
	}
	if (d->cfg->hugepages == SHM_HUGEPAGES_AUTO && !t->seg.hugepages)
		log_warn("2 MiB hugepages unavailable for the %s segment (%s); using 4 KiB pages. "
			 "Reserve them with: echo N > /proc/sys/vm/nr_hugepages",
			 name, strerror(-t->seg.hugepage_error));
	h = shm_segment_header(&t->seg);
	/* The allocator hands out exactly the configured capacity, even when
	 * the memfd was rounded up to whole hugepages. */
	r = shm_alloc_init(&t->alloc, h->data_offset, size);
	if (r < 0) {
		shm_segment_done(&t->seg);
		return r;
	}
	t->high = (uint64_t) ((double) t->alloc.size * d->cfg->high_watermark);
	t->low = (uint64_t) ((double) t->alloc.size *
			     (d->cfg->high_watermark - d->cfg->eviction_ratio));
	log_info("%s tier: %llu bytes, %s pages, evicts above %llu down to %llu", name,
		 (unsigned long long) t->alloc.size, t->seg.hugepages ? "2 MiB" : "4 KiB",
		 (unsigned long long) t->high, (unsigned long long) t->low);
	return 0;
}

int tier_setup(struct daemon *d)
{
	struct tier *dram = &d->tiers[0];
	int r;

	/* segment 0 is always dram; the device tier, when on, is segment 1 */
	r = tier_init(d, dram, "dram", SHM_TIER_DRAM, 0, d->cfg->dram_size);
	if (r < 0)
		return r;
	d->n_tiers = 1;
	d->fastest = dram;
	d->hugepages = dram->seg.hugepages;
	if (d->cfg->device_size) {
		struct tier *dev = &d->tiers[1];

		r = tier_init(d, dev, "device", SHM_TIER_DEVICE, 1, d->cfg->device_size);
		if (r < 0) {
			tier_teardown(d);
			return r;
		}
		dev->below = dram;
		d->n_tiers = 2;
		d->fastest = dev;
		d->hugepages = d->hugepages && dev->seg.hugepages;
	}
	return 0;
}

void tier_teardown(struct daemon *d)
{
	for (unsigned i = 0; i < d->n_tiers; i++) {
		shm_alloc_done(&d->tiers[i].alloc);
		shm_segment_done(&d->tiers[i].seg);
	}
	d->n_tiers = 0;
	free(d->promote_q);
	d->promote_q = NULL;
	d->n_promote = d->cap_promote = 0;
}

struct tier *tier_for(struct daemon *d, int requested)
{
	if (requested == 0)
		requested = SHM_TIER_DRAM; /* puts land in dram */
	for (unsigned i = 0; i < tier_count(d); i++)
		if (tier_at(d, i)->kind == (uint32_t) requested)
			return tier_at(d, i);
	return NULL;
}

/* ---- objects ---- */

struct object *object_new(const void *key, size_t key_len)
{
	struct object *o = calloc(1, sizeof(*o) + key_len + 1);

	if (!o)
		return NULL;
	memcpy(o->key, key, key_len);
	o->key[key_len] = '\0';
	o->key_len = (uint32_t) key_len;
	o->hash = index_hash(key, key_len);
	return o;
}

void object_free(struct daemon *d, struct object *o)
{
	if (!o)
		return;
	if (o->block)
		shm_alloc_free(&o->tier->alloc, o->block);
	free(o->parent_key);
	free(o);
}

static void unlink_child(struct object *o)
{
	struct object *p = o->parent;

	if (!p)
		return;
	if (o->prev_sibling)
		o->prev_sibling->next_sibling = o->next_sibling;
	else
		p->first_child = o->next_sibling;
	if (o->next_sibling)
		o->next_sibling->prev_sibling = o->prev_sibling;
	o->prev_sibling = o->next_sibling = NULL;
	o->parent = NULL;
	p->n_children--;
}

void object_publish(struct daemon *d, struct object *o)
{
	struct object *p = NULL;

	o->flags |= OBJ_COMMITTED;
	index_insert(&d->index, o);
	tier_lru_link(o->tier, o);
	o->tier->objects++;
	if (o->parent_key) {
		p = index_find(&d->index, o->parent_key, o->parent_len,
			       index_hash(o->parent_key, o->parent_len));
		free(o->parent_key);
		o->parent_key = NULL;
	}
	if (p && p != o) {
		o->parent = p;
		o->next_sibling = p->first_child;
		if (o->next_sibling)
			o->next_sibling->prev_sibling = o;
		p->first_child = o;
		p->n_children++;
	}
}

static void unqueue_promotion(struct daemon *d, struct object *o)
{
	if (!(o->flags & OBJ_PROMOTE))
		return;
	for (size_t i = 0; i < d->n_promote; i++)
		if (d->promote_q[i] == o) {
			d->promote_q[i] = d->promote_q[--d->n_promote];
			break;
		}
	o->flags &= ~OBJ_PROMOTE;
}

void object_drop(struct daemon *d, struct object *o)
{
	disk_forget(d, o);
	index_unlink(&d->index, o);
	tier_lru_unlink(o->tier, o);
	o->tier->objects--;
	unqueue_promotion(d, o);
	/* children lose their prefix; the parent loses a child */
	while (o->first_child)
		unlink_child(o->first_child);
	unlink_child(o);
	o->flags &= ~OBJ_COMMITTED;
	o->flags |= OBJ_DEAD;
	if (o->views == 0)
		object_free(d, o);
}

void object_hit(struct daemon *d, struct object *o, bool lease, bool counts)
{
	if (o->tier->lru_head != o) {
		tier_lru_unlink(o->tier, o);
		tier_lru_link(o->tier, o);
	}
	if (o->tier == &d->disk_tier) {
		if (lease && d->cfg->lease_ttl_ms)
			o->lease_until = d->now_ms + d->cfg->lease_ttl_ms;
		if (counts) {
			for (struct tier *t = d->fastest; t && t != o->tier; t = t->below)
				t->st.misses++;
			o->tier->st.hits++;
		}
		return;
	}
	if (lease && d->cfg->lease_ttl_ms)
		o->lease_until = d->now_ms + d->cfg->lease_ttl_ms;
	if (!counts)
		return;
	/* looked for fastest first: a miss in every tier above this one */
	for (struct tier *t = d->fastest; t && t != o->tier; t = t->below)
		t->st.misses++;
	o->tier->st.hits++;
	o->hits++;
	if (o->tier != d->fastest && o->hits >= d->cfg->promotion_hits &&
	    !(o->flags & OBJ_PROMOTE) && o->len <= d->fastest->alloc.size / 4) {
		if (d->n_promote == d->cap_promote) {
			size_t cap = d->cap_promote ? d->cap_promote * 2 : 64;
			struct object **q = realloc(d->promote_q, cap * sizeof(*q));

			if (!q)
				return; /* promotion is an optimisation */
			d->promote_q = q;
			d->cap_promote = cap;
		}
		d->promote_q[d->n_promote++] = o;
		o->flags |= OBJ_PROMOTE;
	}
}

const char *object_protected(const struct daemon *d, const struct object *o, bool soft_ok)
{
	if (o->views)
		return "viewed";
	if (o->load)
		return "loading";
	if (o->flags & OBJ_HARD_PIN)
		return "hard-pinned";
	if (o->lease_until > d->now_ms)
		return "leased";
	if (!soft_ok && (o->flags & OBJ_SOFT_PIN) && (o->pin_until == 0 || o->pin_until > d->now_ms))
		return "soft-pinned";
	return NULL;
}

/* ---- moving between tiers ---- */

/* Copy o into tier `to` and switch it over.  Only for objects without
 * views: nobody can be reading the old bytes. */
static int move(struct daemon *d, struct object *o, struct tier *to, bool may_evict)
{
	struct tier *from = o->tier;
	struct shm_block *b;
	int r;

	if (o->views)
		return -EBUSY;
	/* evicting in `to` never touches o, which lives in `from` */
	r = may_evict ? tier_alloc(d, to, o->len, &b) : shm_alloc_block(&to->alloc, o->len, &b);
	if (r < 0)
		return r;
	memcpy((uint8_t *) to->seg.base + b->offset, (uint8_t *) from->seg.base + o->block->offset,
	       o->len);
	tier_lru_unlink(from, o);
	from->objects--;
	shm_alloc_free(&from->alloc, o->block);
	o->block = b;
	o->tier = to;
	o->hits = 0;
	to->objects++;
	tier_lru_link(to, o);
	to->st.bytes_moved += o->len;
	d->stats.bytes_moved += o->len;
	return 0;
}

/* Free one victim's space in t: demote it if there is a tier below, drop it
 * otherwise.  Returns the bytes freed in t. */
static uint64_t evict_one(struct daemon *d, struct tier *t, struct object *o, enum evict_reason why)
{
	uint64_t size;

	if (t == &d->disk_tier) {
		/* only asked for by name: the record goes, and the object */
		size = o->disk_len;
		t->st.evictions[why]++;
		t->st.evicted_bytes += size;
		d->stats.evictions++;
		d->stats.evicted_bytes += size;
		object_drop(d, o);
		return size;
	}
	size = o->block->size;

	if (t->below == &d->disk_tier && o->disk_id && !o->views) {
		/* a clean copy is on disk: only the memory goes */
		struct tier *disk = t->below;

		tier_lru_unlink(t, o);
		t->objects--;
		shm_alloc_free(&t->alloc, o->block);
		o->block = NULL;
		o->tier = disk;
		o->hits = 0;
		disk->objects++;
		tier_lru_link(disk, o);
		disk->st.demotions++;
		disk->st.bytes_moved += o->len;
		d->stats.demotions++;
		d->stats.bytes_moved += o->len;
		return size;
	}
	if (t->below && t->below != &d->disk_tier && why != EVICT_MANUAL &&
	    move(d, o, t->below, true) == 0) {
		t->below->st.demotions++;
		d->stats.demotions++;
		return size;
	}
	t->st.evictions[why]++;
	t->st.evicted_bytes += size;
	d->stats.evictions++;
	d->stats.evicted_bytes += size;
	object_drop(d, o);
	return size;
}

/* The next victim in t, or NULL.  pass 0: unpinned leaves; 1: soft-pinned
 * leaves too; 2: anything unprotected, ancestors included. */
static struct object *victim(struct daemon *d, struct tier *t, int pass)
{
	for (struct object *o = t->lru_tail; o; o = o->lru_prev) {
		if (object_protected(d, o, pass >= 1))
			continue;
		if (pass < 2 && o->n_children)
			continue;
		return o;
	}
	return NULL;
}

/* Above a disk tier: the least recently used object that already has a
 * record (freeing it loses nothing), leaves first. */
static struct object *clean_victim(struct daemon *d, struct tier *t)
{
	if (t->below != &d->disk_tier)
		return NULL;
	for (struct object *o = t->lru_tail; o; o = o->lru_prev)
		if (o->disk_id && !o->n_children && !object_protected(d, o, false))
			return o;
	return NULL;
}

static void evict_tier(struct daemon *d, struct tier *t, uint64_t bytes, bool all,
		       enum evict_reason why, uint64_t *freed, uint64_t *n)
{
	int pass = 0;

	if (why != EVICT_MANUAL) {
		struct object *o;

		while ((all || *freed < bytes) && (o = clean_victim(d, t))) {
			*freed += evict_one(d, t, o, why);
			(*n)++;
		}
	}

	while (pass < 3 && (all || *freed < bytes)) {
		struct object *o = victim(d, t, pass);

		if (!o) {
			pass++;
			continue;
		}
		*freed += evict_one(d, t, o, why);
		(*n)++;
		/* a leaf gone may have made its parent a leaf: back to the
		 * cheapest pass */
		pass = 0;
	}
}

void tier_evict(struct daemon *d, struct tier *t, uint64_t bytes, bool all, enum evict_reason why,
		uint64_t *ret_bytes, uint64_t *ret_objects)
{
	uint64_t freed = 0, n = 0;

	if (t)
		evict_tier(d, t, bytes, all, why, &freed, &n);
	else
		/* every memory tier; the disk tier only when named */
		for (unsigned i = 0; i < d->n_tiers && (all || freed < bytes); i++)
			evict_tier(d, &d->tiers[i], bytes - (freed < bytes ? freed : bytes), all, why,
				   &freed, &n);
	if (ret_bytes)
		*ret_bytes = freed;
	if (ret_objects)
		*ret_objects = n;
}

int tier_alloc(struct daemon *d, struct tier *t, uint64_t len, struct shm_block **ret)
{
	for (;;) {
		uint64_t n, free_bytes = t->alloc.size - t->alloc.used;
		int r = shm_alloc_block(&t->alloc, len, ret);

		if (r != -ENOSPC)
			return r;
		/* Free at least the shortfall; fragmentation may need more
		 * rounds, each of which frees one more victim at least. */
		tier_evict(d, t, len > free_bytes ? len - free_bytes : len, false, EVICT_CAPACITY,
			   NULL, &n);
		if (n == 0)
			return -ENOSPC;
	}
}

void tier_explain(const struct daemon *d, const struct tier *t, char *buf, size_t len)
{
	uint64_t n[5] = { 0 }, bytes = 0; /* viewed, hard, leased, soft, other */

	for (const struct object *o = t->lru_head; o; o = o->lru_next) {
		const char *why = object_protected(d, o, false);

		bytes += o->block->size;
		if (!why)
			n[4]++;
		else if (!strcmp(why, "viewed"))
			n[0]++;
		else if (!strcmp(why, "hard-pinned"))
			n[1]++;
		else if (!strcmp(why, "leased"))
			n[2]++;
		else
			n[3]++;
	}
	snprintf(buf, len, "%llu viewed, %llu hard-pinned, %llu leased, %llu soft-pinned, %llu other "
		 "(%llu bytes in objects, %llu allocated, largest free block %llu)",
		 (unsigned long long) n[0], (unsigned long long) n[1], (unsigned long long) n[2],
		 (unsigned long long) n[3], (unsigned long long) n[4], (unsigned long long) bytes,
		 (unsigned long long) t->alloc.used,
		 (unsigned long long) shm_alloc_largest_free(&t->alloc));
}

void tier_readmit(struct daemon *d, struct object *o, struct shm_block *b)
{
	struct tier *dram = &d->tiers[0], *disk = o->tier;

	tier_lru_unlink(disk, o);
	disk->objects--;
	o->tier = dram;
	o->block = b;
	o->hits = 0;
	dram->objects++;
	tier_lru_link(dram, o);
	dram->st.promotions++;
	dram->st.bytes_moved += o->len;
	d->stats.promotions++;
	d->stats.bytes_moved += o->len;
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

unsigned tier_count(const struct daemon *d)
{
	return d->n_tiers + (d->disk != NULL);
}

struct tier *tier_at(struct daemon *d, unsigned i)
{
	return i < d->n_tiers ? &d->tiers[i] : &d->disk_tier;
}

/* ---- background work ---- */

bool tier_maintain(struct daemon *d)
{
	bool did = false;

	/* watermarks: once above high, free down to low, a slice at a time */
	for (unsigned i = 0; i < d->n_tiers; i++) {
		struct tier *t = &d->tiers[i];
		unsigned budget = MAINTAIN_MAX_OBJECTS;

		if (t->alloc.used <= t->high)
			continue;
		while (t->alloc.used > t->low && budget--) {
			struct object *o = clean_victim(d, t);

			if (!o)
				o = victim(d, t, 0);
			if (!o)
				o = victim(d, t, 1);
			if (!o)
				o = victim(d, t, 2);
			if (!o)
				break;
			evict_one(d, t, o, EVICT_WATERMARK);
			did = true;
		}
	}
	/* one promotion per call: copies can be large.  Objects someone is
	 * reading stay queued (a get holds a view while it copies). */
	for (size_t i = d->n_promote; i-- > 0;) {
		struct object *o = d->promote_q[i];
		struct tier *up = d->fastest;

		if (o->views)
			continue;
		d->promote_q[i] = d->promote_q[--d->n_promote];
		o->flags &= ~OBJ_PROMOTE;
		if (o->tier == up)
			continue;
		/* Make room up there first.  Demoting into dram may evict in
		 * dram, where o lives: hold it like a view meanwhile. */
		if (up->alloc.used + o->len > up->high) {
			uint64_t n;

			o->views++;
			tier_evict(d, up, up->alloc.used + o->len - up->low, false, EVICT_WATERMARK,
				   NULL, &n);
			o->views--;
		}
		if (move(d, o, up, false) == 0) {
			up->st.promotions++;
			d->stats.promotions++;
		}
		did = true;
		break;
	}
	if (disk_maintain(d))
		did = true;
	/* a growing index finishes in the background too */
	if (index_migrate(&d->index, 256))
		did = true;
	return did;
}
