/* SPDX-License-Identifier: MIT */
/* The index: every committed object by key (index.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct object;

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
/* The same over at most max_buckets buckets from cursor (0 to start),
 * ending early at the end of a bucket once max_objects were visited; the
 * next cursor, or UINT64_MAX when done.  While the index grows it first
 * finishes moving buckets (bounded too), returning the same cursor. */
uint64_t index_walk_some(struct index *idx, uint64_t cursor, size_t max_buckets,
			 size_t max_objects, void (*fn)(void *u, struct object *o), void *u);
