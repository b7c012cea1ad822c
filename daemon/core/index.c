/* SPDX-License-Identifier: MIT */
/*
 * The object index: a chained hash table keyed by xxh3 of the key.  It lives
 * only in daemon memory, so a client can corrupt at most the bytes of
 * objects, never the index that says where they are.  (LRU order is per
 * tier, in tier.c.)
 *
 * Growing never stops the loop: when the table fills up, a table twice the
 * size is allocated (calloc: untouched zero pages, no pass over memory) and
 * the old buckets move over a few at a time, on every insert and in idle
 * maintenance, as Redis's dict does.  Meanwhile lookups look in both.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "index.h"
#include "object.h"

#define INITIAL_BUCKETS 1024
/* Old buckets moved per insert: the old table is empty long before the new
 * one fills (n inserts move 64n buckets; the old table has n). */
#define MIGRATE_PER_INSERT 64

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
	free(idx->old);
	memset(idx, 0, sizeof(*idx));
}

uint64_t index_hash(const void *key, size_t len)
{
	return XXH3_64bits(key, len);
}

static struct object *chain_find(struct object *o, const void *key, size_t len, uint64_t hash)
{
	for (; o; o = o->hnext)
		if (o->hash == hash && o->key_len == len && memcmp(o->key, key, len) == 0)
			return o;
	return NULL;
}

struct object *index_find(struct index *idx, const void *key, size_t len, uint64_t hash)
{
	struct object *o = chain_find(idx->buckets[hash & (idx->n_buckets - 1)], key, len, hash);

	/* buckets below migrate_pos are empty: no need to look there */
	if (!o && idx->old && (hash & (idx->n_old - 1)) >= idx->migrate_pos)
		o = chain_find(idx->old[hash & (idx->n_old - 1)], key, len, hash);
	return o;
}

bool index_migrate(struct index *idx, size_t budget)
{
	if (!idx->old)
		return false;
	while (budget-- && idx->migrate_pos < idx->n_old) {
		struct object *o = idx->old[idx->migrate_pos], *next;

		for (; o; o = next) {
			struct object **head = &idx->buckets[o->hash & (idx->n_buckets - 1)];

			next = o->hnext;
			o->hnext = *head;
			*head = o;
		}
		idx->old[idx->migrate_pos++] = NULL;
	}
	if (idx->migrate_pos == idx->n_old) {
		free(idx->old);
		idx->old = NULL;
		idx->n_old = idx->migrate_pos = 0;
	}
	return true;
}

static void start_grow(struct index *idx)
{
	size_t n = idx->n_buckets * 2;
	struct object **b = calloc(n, sizeof(*b));

	if (!b)
		return; /* longer chains, still correct */
	idx->old = idx->buckets;
	idx->n_old = idx->n_buckets;
	idx->migrate_pos = 0;
	idx->buckets = b;
	idx->n_buckets = n;
}

int index_insert(struct index *idx, struct object *o)
{
	struct object **head;

	if (idx->old)
		index_migrate(idx, MIGRATE_PER_INSERT);
	else if (idx->n_objects >= idx->n_buckets)
		start_grow(idx);
	head = &idx->buckets[o->hash & (idx->n_buckets - 1)];
	o->hnext = *head;
	*head = o;
	idx->n_objects++;
	idx->bytes += o->len;
	return 0;
}

static bool chain_unlink(struct object **p, struct object *o)
{
	for (; *p; p = &(*p)->hnext)
		if (*p == o) {
			*p = o->hnext;
			o->hnext = NULL;
			return true;
		}
	return false;
}

void index_unlink(struct index *idx, struct object *o)
{
	if (!chain_unlink(&idx->buckets[o->hash & (idx->n_buckets - 1)], o) &&
	    !(idx->old && chain_unlink(&idx->old[o->hash & (idx->n_old - 1)], o)))
		return;
	idx->n_objects--;
	idx->bytes -= o->len;
}

void index_walk(struct index *idx, void (*fn)(void *u, struct object *o), void *u)
{
	for (size_t b = 0; b < idx->n_buckets; b++)
		for (struct object *o = idx->buckets[b], *next; o; o = next) {
			next = o->hnext; /* fn may free o */
			fn(u, o);
		}
	for (size_t b = idx->migrate_pos; idx->old && b < idx->n_old; b++)
		for (struct object *o = idx->old[b], *next; o; o = next) {
			next = o->hnext;
			fn(u, o);
		}
}

uint64_t index_walk_some(struct index *idx, uint64_t cursor, size_t max_buckets,
			 size_t max_objects, void (*fn)(void *u, struct object *o), void *u)
{
	size_t seen = 0;

	if (idx->old) {
		index_migrate(idx, max_buckets);
		return cursor;
	}
	for (; cursor < idx->n_buckets && max_buckets-- && seen < max_objects; cursor++)
		for (struct object *o = idx->buckets[cursor], *next; o; o = next) {
			next = o->hnext; /* fn may free o */
			fn(u, o);
			seen++;
		}
	return cursor < idx->n_buckets ? cursor : UINT64_MAX;
}
