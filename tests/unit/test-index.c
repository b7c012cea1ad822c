/* SPDX-License-Identifier: MIT */
/* The index: every key found while the table grows, growth in bounded
 * steps (defect: the index doubled in one step and stopped the daemon for
 * tens of milliseconds at 512K objects). */
#include "index.h"
#include "tier.h"
#include "helpers.h"

enum { N = 200000 };

static struct object *objs[N];

static struct object *make(int i)
{
	char key[32];
	int n = snprintf(key, sizeof(key), "key/%d", i);

	return object_new(key, (size_t) n);
}

static void count(void *u, struct object *o)
{
	(void) o;
	(*(size_t *) u)++;
}

int main(void)
{
	struct index idx;
	size_t grows = 0, walked = 0;

	CHECK_EQ(index_init(&idx), 0);
	for (int i = 0; i < N; i++) {
		size_t before = idx.n_buckets, old_pos = idx.migrate_pos;
		bool growing = idx.old != NULL;

		objs[i] = make(i);
		objs[i]->len = 1;
		CHECK_EQ(index_insert(&idx, objs[i]), 0);
		if (idx.n_buckets != before) {
			/* a grow starts, moving nothing yet */
			grows++;
			CHECK(idx.old != NULL);
			CHECK_EQ(idx.migrate_pos, 0);
		} else if (growing && idx.old) {
			/* each insert moves a bounded number of buckets */
			CHECK(idx.migrate_pos - old_pos <= 64);
		}
		/* every key so far is found, in whichever table it is */
		if (i % 97 == 0)
			for (int j = 0; j <= i; j += 1 + i / 50)
				CHECK(!objs[j] || index_find(&idx, objs[j]->key, objs[j]->key_len, objs[j]->hash) ==
				      objs[j]);
		/* unlink some while a grow is under way */
		if (idx.old && i % 5 == 0 && i > 0 && objs[i - 1]) {
			index_unlink(&idx, objs[i - 1]);
			CHECK(!index_find(&idx, objs[i - 1]->key, objs[i - 1]->key_len,
					  objs[i - 1]->hash));
			free(objs[i - 1]);
			objs[i - 1] = NULL;
		}
	}
	CHECK(grows >= 7);
	index_walk(&idx, count, &walked);
	CHECK_EQ(walked, idx.n_objects);
	while (index_migrate(&idx, 1000))
		;
	CHECK(idx.old == NULL);
	/* a bounded walk: every object exactly once over the calls, and no
	 * call much past its object budget (a bucket's chain is short) */
	{
		size_t total = 0, calls = 0;
		uint64_t cursor = 0;

		do {
			size_t seen = 0;

			cursor = index_walk_some(&idx, cursor, 1u << 20, 100, count, &seen);
			CHECK(seen <= 100 + 16);
			total += seen;
			calls++;
		} while (cursor != UINT64_MAX);
		CHECK_EQ(total, idx.n_objects);
		CHECK(calls >= idx.n_objects / 116);
	}
	for (int i = 0; i < N; i++)
		if (objs[i]) {
			CHECK(index_find(&idx, objs[i]->key, objs[i]->key_len, objs[i]->hash) == objs[i]);
			index_unlink(&idx, objs[i]);
			free(objs[i]);
		}
	CHECK_EQ(idx.n_objects, 0);
	index_done(&idx);
	return 0;
}
