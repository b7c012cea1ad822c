/* SPDX-License-Identifier: MIT */
/*
 * The catalog of the memory tiers: one entry per committed object in
 * memory, in a sealed memfd nobody but the daemon maps.  Writing an entry
 * is a few stores into memory (no system call); a warm start reads them
 * back (store_new_warm()).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "catalog.h"
#include "store-private.h"

static uint64_t entry_size(uint32_t key_len)
{
	return (sizeof(struct catalog_entry) + key_len + SHM_ALLOC_ALIGN - 1) &
	       ~(uint64_t) (SHM_ALLOC_ALIGN - 1);
}

static uint64_t entry_check(const struct catalog_entry *e)
{
	return XXH3_64bits((const uint8_t *) e + 16, sizeof(*e) - 16 + e->key_len);
}

static int header_init(struct catalog *c, uint64_t generation)
{
	struct catalog_header *h = (struct catalog_header *) c->base;

	h->layout = CATALOG_LAYOUT;
	h->header_size = CATALOG_HEADER;
	h->size = c->size;
	h->generation = generation;
	__atomic_store_n(&h->magic, CATALOG_MAGIC, __ATOMIC_RELEASE);
	return shm_alloc_init(&c->alloc, CATALOG_HEADER, c->size - CATALOG_HEADER);
}

int catalog_new(struct catalog *c, uint64_t size, uint64_t generation)
{
	void *p;
	int r;

	*c = (struct catalog) { .fd = -1 };
	size = (size + 4095) & ~(uint64_t) 4095;
	if (size < 2 * CATALOG_HEADER)
		size = 2 * CATALOG_HEADER;
	r = shm_memfd_new("kvcache-catalog", size, false, &c->fd, &p);
	if (r < 0)
		return r;
	c->base = p;
	c->size = size;
	r = header_init(c, generation);
	if (r < 0)
		catalog_done(c);
	return r;
}

int catalog_adopt(struct catalog *c, int fd, uint64_t generation, const char **why)
{
	const struct catalog_header *h;
	uint64_t size;
	void *p;
	int r;

	*c = (struct catalog) { .fd = -1 };
	r = shm_memfd_adopt(fd, 2 * CATALOG_HEADER, &p, &size, why);
	if (r < 0)
		return r;
	c->fd = fd;
	c->base = p;
	c->size = size;
	h = p;
	if (h->magic != CATALOG_MAGIC || h->header_size != CATALOG_HEADER ||
	    h->size != c->size)
		*why = "no catalog header";
	else if (h->layout != CATALOG_LAYOUT)
		*why = "a catalog layout this kvcached does not read";
	if (*why) {
		catalog_done(c);
		return -EBADMSG;
	}
	((struct catalog_header *) p)->generation = generation;
	return shm_alloc_init(&c->alloc, CATALOG_HEADER, c->size - CATALOG_HEADER);
}

void catalog_done(struct catalog *c)
{
	if (c->base)
		munmap(c->base, c->size);
	if (c->fd >= 0)
		close(c->fd);
	shm_alloc_done(&c->alloc);
	*c = (struct catalog) { .fd = -1 };
}

static void entry_fill(struct catalog_entry *e, const struct object *o)
{
	e->offset = o->block->offset;
	e->len = o->len;
	e->ver = o->ver;
	e->sum = (o->flags & OBJ_SUMMED) ? o->sum : 0;
	e->tier = o->tier->kind;
	e->flags = (o->flags & OBJ_SUMMED) ? CATALOG_SUMMED : 0;
	e->key_len = o->key_len;
	e->reserved = 0;
	memcpy(e->key, o->key, o->key_len);
	e->check = entry_check(e);
}

static void entry_clear(struct catalog *c, struct shm_block *b)
{
	struct catalog_entry *e = (struct catalog_entry *) (c->base + b->offset);

	__atomic_store_n(&e->magic, 0, __ATOMIC_RELEASE);
	memset((uint8_t *) e + 8, 0, b->size - 8);
}

void catalog_forget(struct store *st, struct object *o)
{
	struct catalog *c = &st->cat;

	if (!o->cat)
		return;
	if (!c->sealed) {
		entry_clear(c, o->cat);
		shm_alloc_free(&c->alloc, o->cat);
	}
	o->cat = NULL;
}

void catalog_note(struct store *st, struct object *o)
{
	struct catalog *c = &st->cat;
	struct catalog_entry *e;
	struct shm_block *b;

	if (!c->base || c->sealed)
		return;
	if (!(o->flags & OBJ_COMMITTED) || o->where != OBJ_MEMORY || !o->block) {
		catalog_forget(st, o);
		return;
	}
	/* the new entry is complete before the old one goes: a crash in
	 * between leaves two, and the next run keeps one */
	if (shm_alloc_block(&c->alloc, entry_size(o->key_len), &b) < 0) {
		c->full++;
		catalog_forget(st, o);
		return;
	}
	e = (struct catalog_entry *) (c->base + b->offset);
	entry_fill(e, o);
	__atomic_store_n(&e->magic, CATALOG_ENTRY_MAGIC, __ATOMIC_RELEASE);
	catalog_forget(st, o);
	o->cat = b;
}

void catalog_rewrite(struct store *st, struct object *o)
{
	struct catalog_entry *e;

	if (!o->cat || !st->cat.base || st->cat.sealed)
		return;
	e = (struct catalog_entry *) (st->cat.base + o->cat->offset);
	entry_fill(e, o);
}

void catalog_scan(struct catalog *c, void (*fn)(void *u, const struct catalog_entry *e,
						uint64_t at), void *u)
{
	uint64_t at = CATALOG_HEADER;

	while (at + sizeof(struct catalog_entry) <= c->size) {
		const struct catalog_entry *e = (const void *) (c->base + at);
		uint64_t n;

		if (e->magic != CATALOG_ENTRY_MAGIC || e->key_len == 0 || e->key_len > 511 ||
		    (n = entry_size(e->key_len)) > c->size - at || entry_check(e) != e->check ||
		    memchr(e->key, '\0', e->key_len)) {
			at += SHM_ALLOC_ALIGN;
			continue;
		}
		fn(u, e, at);
		at += n;
	}
}

int catalog_keep(struct catalog *c, uint64_t at, struct shm_block **cursor,
		 struct shm_block **ret)
{
	const struct catalog_entry *e = (const void *) (c->base + at);

	return shm_alloc_take(&c->alloc, at, entry_size(e->key_len), cursor, ret);
}

void catalog_clear(struct catalog *c, uint64_t at)
{
	const struct catalog_entry *e = (const void *) (c->base + at);
	struct shm_block b = { .offset = at, .size = entry_size(e->key_len) };

	entry_clear(c, &b);
}
