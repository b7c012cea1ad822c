/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

#define LOG_TOPIC "tier"

int tier_setup(struct daemon *d)
{
	struct tier *t = &d->tiers[0];
	const struct shm_seg_header *h;
	int r;

	*t = (struct tier) { .name = "dram", .kind = SHM_TIER_DRAM, .segment = 0 };
	r = shm_segment_create(&t->seg, "kvcache-dram", d->cfg->dram_size, d->cfg->hugepages,
			       SHM_TIER_DRAM, 0, d->generation);
	if (r < 0) {
		log_error("Failed to create the dram segment of %llu bytes (hugepages=%s): %s",
			  (unsigned long long) d->cfg->dram_size,
			  d->cfg->hugepages == SHM_HUGEPAGES_ON ? "on" : "off", strerror(-r));
		return r;
	}
	if (d->cfg->hugepages == SHM_HUGEPAGES_AUTO && !t->seg.hugepages)
		log_warn("2 MiB hugepages unavailable for the dram segment (%s); using 4 KiB pages. "
			 "Reserve them with: echo N > /proc/sys/vm/nr_hugepages",
			 strerror(-t->seg.hugepage_error));
	h = shm_segment_header(&t->seg);
	/* The allocator hands out exactly the configured capacity, even when
	 * the memfd was rounded up to whole hugepages. */
	r = shm_alloc_init(&t->alloc, h->data_offset, d->cfg->dram_size);
	if (r < 0) {
		shm_segment_done(&t->seg);
		return r;
	}
	d->hugepages = t->seg.hugepages;
	d->n_tiers = 1;
	log_info("dram tier: %llu bytes, %s pages", (unsigned long long) t->alloc.size,
		 t->seg.hugepages ? "2 MiB" : "4 KiB");
	return 0;
}

void tier_teardown(struct daemon *d)
{
	for (unsigned i = 0; i < d->n_tiers; i++) {
		shm_alloc_done(&d->tiers[i].alloc);
		shm_segment_done(&d->tiers[i].seg);
	}
	d->n_tiers = 0;
}

struct tier *tier_for(struct daemon *d, int requested)
{
	for (unsigned i = 0; i < d->n_tiers; i++)
		if (requested == 0 || d->tiers[i].kind == (uint32_t) requested)
			return &d->tiers[i];
	return NULL;
}

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
	free(o);
}

void object_drop(struct daemon *d, struct object *o)
{
	index_unlink(&d->index, o);
	o->tier->objects--;
	o->flags &= ~OBJ_COMMITTED;
	o->flags |= OBJ_DEAD;
	if (o->views == 0)
		object_free(d, o);
}

static bool evictable(const struct object *o, struct tier *t, bool soft_ok)
{
	if (t && o->tier != t)
		return false;
	if (o->views || (o->flags & OBJ_HARD_PIN))
		return false;
	return soft_ok || !(o->flags & OBJ_SOFT_PIN);
}

void tier_evict(struct daemon *d, struct tier *t, uint64_t bytes, bool all,
		uint64_t *ret_bytes, uint64_t *ret_objects)
{
	uint64_t freed = 0, n = 0;

	/* Unpinned objects first, least recently used first; soft-pinned
	 * ones only when that was not enough. */
	for (int pass = 0; pass < 2; pass++) {
		struct object *o = d->index.lru_tail, *prev;

		for (; o && (all || freed < bytes); o = prev) {
			prev = o->lru_prev;
			if (!evictable(o, t, pass == 1))
				continue;
			freed += o->block->size;
			n++;
			object_drop(d, o);
		}
	}
	d->stats.evictions += n;
	d->stats.evicted_bytes += freed;
	if (ret_bytes)
		*ret_bytes = freed;
	if (ret_objects)
		*ret_objects = n;
}

int tier_alloc(struct daemon *d, struct tier *t, uint64_t len, struct shm_block **ret)
{
	int r;

	for (;;) {
		uint64_t n;

		r = shm_alloc_block(&t->alloc, len, ret);
		if (r != -ENOSPC)
			return r;
		/* Free at least the shortfall; fragmentation may need more
		 * rounds, each of which drops one more victim at least. */
		tier_evict(d, t, len > t->alloc.size - t->alloc.used ?
			   len - (t->alloc.size - t->alloc.used) : len, false, NULL, &n);
		if (n == 0)
			return -ENOSPC;
	}
}
