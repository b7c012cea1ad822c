/* SPDX-License-Identifier: MIT */
/*
 * The object index: a chained hash table keyed by xxh3 of the key, and an
 * LRU list.  It lives only in daemon memory, so a client can corrupt at most
 * the bytes of objects, never the index that says where they are.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "daemon.h"

#define INITIAL_BUCKETS 1024

int index_init(struct index *idx)
{
	memset(idx, 0, sizeof(*idx));
	idx->buckets = calloc(INITIAL_BUCKETS, sizeof(*idx->buckets));
	if (!idx->buckets)
		return -ENOMEM;
	idx->n_buckets = INITIAL_BUCKETS;
	return 0;
}

void index_done(struct index *idx)
{
	free(idx->buckets);
	memset(idx, 0, sizeof(*idx));
}

uint64_t index_hash(const void *key, size_t len)
{
	return XXH3_64bits(key, len);
}

struct object *index_find(struct index *idx, const void *key, size_t len, uint64_t hash)
{
	struct object *o = idx->buckets[hash & (idx->n_buckets - 1)];

	for (; o; o = o->hnext)
		if (o->hash == hash && o->key_len == len && memcmp(o->key, key, len) == 0)
			return o;
	return NULL;
}

static void grow(struct index *idx)
{
	size_t n = idx->n_buckets * 2;
	struct object **b = calloc(n, sizeof(*b));

	if (!b)
		return; /* longer chains, still correct */
	for (size_t i = 0; i < idx->n_buckets; i++) {
		struct object *o = idx->buckets[i], *next;

		for (; o; o = next) {
			next = o->hnext;
			o->hnext = b[o->hash & (n - 1)];
			b[o->hash & (n - 1)] = o;
		}
	}
	free(idx->buckets);
	idx->buckets = b;
	idx->n_buckets = n;
}

static void lru_link_head(struct index *idx, struct object *o)
{
	o->lru_prev = NULL;
	o->lru_next = idx->lru_head;
	if (o->lru_next)
		o->lru_next->lru_prev = o;
	else
		idx->lru_tail = o;
	idx->lru_head = o;
}

static void lru_unlink(struct index *idx, struct object *o)
{
	if (o->lru_prev)
		o->lru_prev->lru_next = o->lru_next;
	else
		idx->lru_head = o->lru_next;
	if (o->lru_next)
		o->lru_next->lru_prev = o->lru_prev;
	else
		idx->lru_tail = o->lru_prev;
	o->lru_prev = o->lru_next = NULL;
}

int index_insert(struct index *idx, struct object *o)
{
	struct object **head;

	if (idx->n_objects >= idx->n_buckets)
		grow(idx);
	head = &idx->buckets[o->hash & (idx->n_buckets - 1)];
	o->hnext = *head;
	*head = o;
	lru_link_head(idx, o);
	idx->n_objects++;
	idx->bytes += o->len;
	return 0;
}

void index_unlink(struct index *idx, struct object *o)
{
	struct object **p = &idx->buckets[o->hash & (idx->n_buckets - 1)];

	for (; *p; p = &(*p)->hnext)
		if (*p == o) {
			*p = o->hnext;
			o->hnext = NULL;
			lru_unlink(idx, o);
			idx->n_objects--;
			idx->bytes -= o->len;
			return;
		}
}

void index_touch(struct index *idx, struct object *o)
{
	if (idx->lru_head == o)
		return;
	lru_unlink(idx, o);
	lru_link_head(idx, o);
}
