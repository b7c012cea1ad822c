/* SPDX-License-Identifier: MIT */
/*
 * The object index: a chained hash table keyed by xxh3 of the key.  It lives
 * only in daemon memory, so a client can corrupt at most the bytes of
 * objects, never the index that says where they are.  (LRU order is per
 * tier, in tier.c.)
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

int index_insert(struct index *idx, struct object *o)
{
	struct object **head;

	if (idx->n_objects >= idx->n_buckets)
		grow(idx);
	head = &idx->buckets[o->hash & (idx->n_buckets - 1)];
	o->hnext = *head;
	*head = o;
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
			idx->n_objects--;
			idx->bytes -= o->len;
			return;
		}
}
