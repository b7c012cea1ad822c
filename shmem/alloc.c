/* SPDX-License-Identifier: MIT */
/*
 * TLSF over offsets.  Free blocks sit in FL_COUNT x SL_COUNT segregated
 * lists; two bitmaps find a non-empty list that is guaranteed to fit in O(1).
 * Blocks are rounded to SHM_ALLOC_ALIGN, so every list below the first level
 * boundary (1 KiB) holds exactly one size.  Waste per block is < 1/16 of the
 * block for large sizes, the price of the constant-time search.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shmem.h"

#define SMALL_BLOCK (UINT64_C(1) << SHM_ALLOC_FL_SHIFT)

static unsigned fls64(uint64_t v)
{
	return 63u - (unsigned) __builtin_clzll(v);
}

static void mapping(uint64_t size, unsigned *fl, unsigned *sl)
{
	if (size < SMALL_BLOCK) {
		*fl = 0;
		*sl = (unsigned) (size / (SMALL_BLOCK / SHM_ALLOC_SL_COUNT));
	} else {
		unsigned f = fls64(size);

		*sl = (unsigned) (size >> (f - SHM_ALLOC_SL_LOG2)) ^ SHM_ALLOC_SL_COUNT;
		*fl = f - (SHM_ALLOC_FL_SHIFT - 1);
	}
}

/* Round up to the next list boundary so any block in the list found fits. */
static void mapping_search(uint64_t size, unsigned *fl, unsigned *sl)
{
	if (size >= SMALL_BLOCK)
		size += (UINT64_C(1) << (fls64(size) - SHM_ALLOC_SL_LOG2)) - 1;
	mapping(size, fl, sl);
}

static void list_insert(struct shm_alloc *a, struct shm_block *b)
{
	unsigned fl, sl;

	mapping(b->size, &fl, &sl);
	b->prev_free = NULL;
	b->next_free = a->heads[fl][sl];
	if (b->next_free)
		b->next_free->prev_free = b;
	a->heads[fl][sl] = b;
	a->fl_bitmap |= UINT64_C(1) << fl;
	a->sl_bitmap[fl] |= 1u << sl;
	b->free = true;
}

static void list_remove(struct shm_alloc *a, struct shm_block *b)
{
	unsigned fl, sl;

	mapping(b->size, &fl, &sl);
	if (b->prev_free)
		b->prev_free->next_free = b->next_free;
	else
		a->heads[fl][sl] = b->next_free;
	if (b->next_free)
		b->next_free->prev_free = b->prev_free;
	if (!a->heads[fl][sl]) {
		a->sl_bitmap[fl] &= ~(1u << sl);
		if (!a->sl_bitmap[fl])
			a->fl_bitmap &= ~(UINT64_C(1) << fl);
	}
	b->prev_free = b->next_free = NULL;
	b->free = false;
}

static struct shm_block *desc_new(struct shm_alloc *a)
{
	struct shm_block *b = a->spare;

	if (b)
		a->spare = b->next_free;
	else
		b = malloc(sizeof(*b));
	if (b)
		memset(b, 0, sizeof(*b));
	return b;
}

static void desc_free(struct shm_alloc *a, struct shm_block *b)
{
	b->next_free = a->spare;
	a->spare = b;
}

int shm_alloc_init(struct shm_alloc *a, uint64_t base, uint64_t size)
{
	struct shm_block *b;

	memset(a, 0, sizeof(*a));
	size -= size % SHM_ALLOC_ALIGN;
	if (size == 0)
		return -EINVAL;
	a->base = base;
	a->size = size;
	b = desc_new(a);
	if (!b)
		return -ENOMEM;
	b->offset = base;
	b->size = size;
	a->first = b;
	list_insert(a, b);
	return 0;
}

void shm_alloc_done(struct shm_alloc *a)
{
	struct shm_block *b, *n;

	for (b = a->first; b; b = n) {
		n = b->next_phys;
		free(b);
	}
	for (b = a->spare; b; b = n) {
		n = b->next_free;
		free(b);
	}
	memset(a, 0, sizeof(*a));
}

static struct shm_block *find_suitable(struct shm_alloc *a, unsigned fl, unsigned sl)
{
	uint32_t sl_map;
	uint64_t fl_map;

	if (fl >= SHM_ALLOC_FL_COUNT)
		return NULL;
	sl_map = sl < 32 ? a->sl_bitmap[fl] & (~0u << sl) : 0;
	if (!sl_map) {
		fl_map = fl + 1 < 64 ? a->fl_bitmap & (~UINT64_C(0) << (fl + 1)) : 0;
		if (!fl_map)
			return NULL;
		fl = (unsigned) __builtin_ctzll(fl_map);
		sl_map = a->sl_bitmap[fl];
	}
	sl = (unsigned) __builtin_ctz(sl_map);
	return a->heads[fl][sl];
}

/* b (off the free lists) keeps its first size bytes; rest, a new
 * descriptor, the others, free. */
static void split_off(struct shm_alloc *a, struct shm_block *b, uint64_t size,
		      struct shm_block *rest)
{
	rest->offset = b->offset + size;
	rest->size = b->size - size;
	rest->prev_phys = b;
	rest->next_phys = b->next_phys;
	if (rest->next_phys)
		rest->next_phys->prev_phys = rest;
	b->next_phys = rest;
	b->size = size;
	list_insert(a, rest);
}

int shm_alloc_block(struct shm_alloc *a, uint64_t size, struct shm_block **ret)
{
	struct shm_block *b, *rest;
	unsigned fl, sl;

	if (size == 0)
		return -EINVAL;
	if (size > a->size)
		return -E2BIG;
	size = (size + SHM_ALLOC_ALIGN - 1) & ~(uint64_t) (SHM_ALLOC_ALIGN - 1);

	mapping_search(size, &fl, &sl);
	b = find_suitable(a, fl, sl);
	if (!b) {
		/* The rounded-up search can miss the one block that fits
		 * exactly (e.g. the whole empty range); look in its own list. */
		unsigned tries = 0;

		mapping(size, &fl, &sl);
		for (b = a->heads[fl][sl]; b && b->size < size && tries < 32; b = b->next_free)
			tries++;
		if (!b || b->size < size)
			return -ENOSPC;
	}
	list_remove(a, b);

	if (b->size - size >= SHM_ALLOC_ALIGN) {
		rest = desc_new(a);
		if (!rest) {
			list_insert(a, b);
			return -ENOMEM;
		}
		split_off(a, b, size, rest);
	}
	a->used += b->size;
	a->n_used++;
	*ret = b;
	return 0;
}

int shm_alloc_take(struct shm_alloc *a, uint64_t offset, uint64_t size,
		   struct shm_block **cursor, struct shm_block **ret)
{
	struct shm_block *b, *front = NULL, *rest = NULL;

	if (size == 0 || offset % SHM_ALLOC_ALIGN)
		return -EINVAL;
	size = (size + SHM_ALLOC_ALIGN - 1) & ~(uint64_t) (SHM_ALLOC_ALIGN - 1);
	if (offset < a->base || offset > a->base + a->size || size > a->base + a->size - offset)
		return -ERANGE;
	b = *cursor && (*cursor)->offset <= offset ? *cursor : a->first;
	while (b && b->offset + b->size <= offset)
		b = b->next_phys;
	if (!b || !b->free || offset + size > b->offset + b->size)
		return -EBUSY;
	/* both descriptors first: a failure leaves everything as it was */
	if ((offset > b->offset && !(front = desc_new(a))) ||
	    (offset + size < b->offset + b->size && !(rest = desc_new(a)))) {
		if (front)
			desc_free(a, front);
		return -ENOMEM;
	}
	list_remove(a, b);
	if (front) {
		front->offset = b->offset;
		front->size = offset - b->offset;
		front->prev_phys = b->prev_phys;
		front->next_phys = b;
		if (front->prev_phys)
			front->prev_phys->next_phys = front;
		else
			a->first = front;
		b->prev_phys = front;
		b->offset = offset;
		b->size -= front->size;
		list_insert(a, front);
	}
	if (rest)
		split_off(a, b, size, rest);
	a->used += b->size;
	a->n_used++;
	*cursor = b->next_phys;
	*ret = b;
	return 0;
}

void shm_alloc_free(struct shm_alloc *a, struct shm_block *b)
{
	struct shm_block *n;

	if (!b)
		return;
	a->used -= b->size;
	a->n_used--;

	n = b->prev_phys;
	if (n && n->free) {
		list_remove(a, n);
		n->size += b->size;
		n->next_phys = b->next_phys;
		if (n->next_phys)
			n->next_phys->prev_phys = n;
		desc_free(a, b);
		b = n;
	}
	n = b->next_phys;
	if (n && n->free) {
		list_remove(a, n);
		b->size += n->size;
		b->next_phys = n->next_phys;
		if (b->next_phys)
			b->next_phys->prev_phys = b;
		desc_free(a, n);
	}
	list_insert(a, b);
}

uint64_t shm_alloc_largest_free(const struct shm_alloc *a)
{
	uint64_t best = 0;
	unsigned fl, sl;

	if (!a->fl_bitmap)
		return 0;
	fl = fls64(a->fl_bitmap);
	sl = 31u - (unsigned) __builtin_clz(a->sl_bitmap[fl]);
	for (const struct shm_block *b = a->heads[fl][sl]; b; b = b->next_free)
		if (b->size > best)
			best = b->size;
	return best;
}

int shm_alloc_check(const struct shm_alloc *a)
{
	uint64_t off = a->base, used = 0, n_used = 0, n_free = 0, n_listed = 0;

	for (const struct shm_block *b = a->first, *prev = NULL; b; prev = b, b = b->next_phys) {
		if (b->offset != off || b->size == 0 || b->size % SHM_ALLOC_ALIGN)
			return -EUCLEAN;
		if (b->prev_phys != prev)
			return -EUCLEAN;
		if (b->free && prev && prev->free)
			return -EUCLEAN; /* two free neighbours were not merged */
		if (b->free)
			n_free++;
		else {
			used += b->size;
			n_used++;
		}
		off += b->size;
	}
	if (off != a->base + a->size || used != a->used || n_used != a->n_used)
		return -EUCLEAN;

	for (unsigned fl = 0; fl < SHM_ALLOC_FL_COUNT; fl++)
		for (unsigned sl = 0; sl < SHM_ALLOC_SL_COUNT; sl++) {
			bool bit = (a->fl_bitmap >> fl & 1) && (a->sl_bitmap[fl] >> sl & 1);

			if (bit != (a->heads[fl][sl] != NULL))
				return -EUCLEAN;
			for (const struct shm_block *b = a->heads[fl][sl]; b; b = b->next_free) {
				unsigned f, s;

				mapping(b->size, &f, &s);
				if (!b->free || f != fl || s != sl)
					return -EUCLEAN;
				n_listed++;
			}
		}
	return n_listed == n_free ? 0 : -EUCLEAN;
}
