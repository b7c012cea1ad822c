/* SPDX-License-Identifier: MIT */
/*
 * Warm starts, in process: a store's memory tiers and catalog taken over
 * by a second store (store_new_warm()), as kvcached --take-over and
 * systemd's file-descriptor store do.
 *
 *   - what was committed and is still stored comes back, bytes and
 *     lengths; what was removed, evicted or replaced does not; a replaced
 *     key comes back with its newest bytes;
 *   - objects without a checksum (a crash before one was taken) and bytes
 *     changed since are dropped and counted, never served;
 *   - forged entries (overlapping places, places outside the segment,
 *     entries that do not check, an older copy of a key) take nothing;
 *   - a tier of another size starts empty;
 *   - what was dropped is free space again.
 */
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <xxhash.h>

#include "helpers.h"
#include "log.h"
#include "tier.h"
#include "values.h"

#define N 600

static struct config cfg;
static struct loop *lp;
static char msg[STORE_MSG_MAX];

static uint64_t hash(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

static void hash_all(struct store_hash_job *jobs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		jobs[i].sum = hash(jobs[i].p, jobs[i].len);
}

static uint32_t size_of(int i)
{
	return 100 + (uint32_t) (i * 977) % 9000;
}

static uint8_t byte_of(int i, uint32_t gen, uint64_t j)
{
	return (uint8_t) (i * 31 + gen * 7 + j * 13);
}

static int put(struct store *st, struct holder *h, int i, uint32_t gen, uint32_t flags)
{
	char key[32];
	struct put_args a = { .key = key, .len = size_of(i), .flags = flags };
	struct extent x;
	uint8_t *p;
	int r;

	a.key_len = (size_t) snprintf(key, sizeof(key), "key-%d", i);
	r = store_reserve(h, &a, &x, msg);
	if (r < 0)
		return r;
	p = store_extent_ptr(st, &x);
	for (uint64_t j = 0; j < a.len; j++)
		p[j] = byte_of(i, gen, j);
	return store_commit(h, x.handle, msg);
}

/* 1: there with gen's bytes, 0: not there, -1: there with other bytes */
static int check(struct store *st, int i, uint32_t gen)
{
	char key[32];
	int n = snprintf(key, sizeof(key), "key-%d", i);
	struct object *o = store_find(st, key, (size_t) n);
	const uint8_t *p;

	if (!o)
		return 0;
	if (!(o->flags & OBJ_COMMITTED) || o->where != OBJ_MEMORY || o->len != size_of(i))
		return -1;
	p = store_object_ptr(o);
	for (uint64_t j = 0; j < o->len; j++)
		if (p[j] != byte_of(i, gen, j))
			return -1;
	return 1;
}

/* What a previous run leaves: dups of its fds. */
static struct store_warm leave(struct store *st)
{
	int fds[3];

	store_warm_fds(st, fds);
	return (struct store_warm) {
		.dram_fd = fcntl(fds[0], F_DUPFD_CLOEXEC, 3), .device_fd = -1,
		.catalog_fd = fcntl(fds[2], F_DUPFD_CLOEXEC, 3), .hash = hash_all,
	};
}

static struct store *fresh(void)
{
	struct store *st;

	CHECK_EQ(store_new(&cfg, lp, -1, &st), 0);
	return st;
}

static struct store *take(struct store_warm w, struct store_warm_report *rep)
{
	struct store *st;

	CHECK_EQ(store_new_warm(&cfg, lp, -1, &w, &st), 0);
	store_warm_report(st, rep);
	return st;
}

static void finish(struct store *st, struct holder *h)
{
	uint64_t r, v;

	if (h) {
		holder_done(h, &r, &v);
		CHECK_EQ(r + v, 0);
	}
	store_free(st);
}

static void test_round_trip(void)
{
	struct store *a = fresh(), *b;
	struct store_warm_report rep;
	struct store_info info;
	struct holder h;
	int kept = 0;
	uint64_t ev_bytes, ev_objs;

	holder_init(&h, a, NULL);
	for (int i = 0; i < N; i++)
		CHECK_EQ(put(a, &h, i, 0, 0), 0);
	for (int i = 0; i < N; i += 10) { /* removed */
		char key[32];
		int n = snprintf(key, sizeof(key), "key-%d", i);

		CHECK_EQ(store_remove(a, key, (size_t) n, true, true, msg), 0);
	}
	for (int i = 5; i < N; i += 10) /* replaced: newer bytes */
		CHECK_EQ(put(a, &h, i, 1, WIRE_PUT_REPLACE), 0);
	/* some evicted (least recently used: the first ones) */
	CHECK_EQ(store_evict(a, SHM_TIER_DRAM, 200000, false, &ev_bytes, &ev_objs), 0);
	CHECK(ev_objs > 0);
	CHECK(store_seal(a, hash_all) > 0);
	b = take(leave(a), &rep);
	finish(a, &h);
	CHECK(rep.warm);
	for (int i = 0; i < N; i++) {
		int c = check(b, i, i % 10 == 5 ? 1 : 0);

		CHECK(c >= 0);
		if (i % 10 == 0)
			CHECK_EQ(c, 0);
		kept += c;
	}
	CHECK_EQ(rep.kept, (uint64_t) kept);
	CHECK_EQ(rep.kept, (uint64_t) N - N / 10 - ev_objs);
	CHECK_EQ(rep.dropped, 0);
	store_info(b, &info);
	CHECK_EQ(info.objects, rep.kept);
	/* and it goes on: new puts, and a third run keeps both */
	holder_init(&h, b, NULL);
	CHECK_EQ(put(b, &h, N + 1, 0, 0), 0);
	store_seal(b, hash_all);
	a = take(leave(b), &rep);
	finish(b, &h);
	CHECK_EQ(rep.kept, (uint64_t) kept + 1);
	CHECK_EQ(check(a, N + 1, 0), 1);
	finish(a, NULL);
}

/* A crash: the catalog as it was, checksums only where known. */
static void test_crash(void)
{
	struct store *a = fresh(), *b, *c;
	struct store_warm_report rep;
	struct holder h;

	holder_init(&h, a, NULL);
	for (int i = 0; i < 100; i++)
		CHECK_EQ(put(a, &h, i, 0, 0), 0);
	store_seal(a, hash_all);
	b = take(leave(a), &rep);
	finish(a, &h);
	CHECK_EQ(rep.kept, 100);
	/* b crashes with 50 more that nobody hashed */
	holder_init(&h, b, NULL);
	for (int i = 100; i < 150; i++)
		CHECK_EQ(put(b, &h, i, 0, 0), 0);
	b->cat.sealed = true; /* nothing written after the crash */
	c = take(leave(b), &rep);
	finish(b, &h);
	CHECK_EQ(rep.kept, 100);
	CHECK_EQ(rep.dropped, 50);
	CHECK_EQ(rep.unverified, 50);
	for (int i = 0; i < 150; i++)
		CHECK_EQ(check(c, i, 0), i < 100 ? 1 : 0);
	/* the dropped objects' space is free again: the tier fills up */
	holder_init(&h, c, NULL);
	for (int i = 100; i < 150; i++)
		CHECK_EQ(put(c, &h, i, 2, 0), 0);
	CHECK_EQ(c->tiers[0].alloc.n_used, 150);
	finish(c, &h);
}

static void forge(struct store *st, uint64_t at, const char *key, uint64_t offset, uint64_t len,
		  uint64_t ver, uint64_t sum, bool good_check)
{
	struct catalog_entry *e = (void *) (st->cat.base + at);

	memset(e, 0, 128);
	e->offset = offset;
	e->len = len;
	e->ver = ver;
	e->sum = sum;
	e->tier = SHM_TIER_DRAM;
	e->flags = CATALOG_SUMMED;
	e->key_len = (uint32_t) strlen(key);
	memcpy(e->key, key, e->key_len);
	e->check = XXH3_64bits((uint8_t *) e + 16, 48 + e->key_len) ^ (good_check ? 0 : 1);
	e->magic = CATALOG_ENTRY_MAGIC;
}

static void test_scribbles_and_forgeries(void)
{
	struct store *a = fresh(), *b;
	struct store_warm_report rep;
	struct object *o3, *o4;
	struct holder h;
	uint64_t at = a->cat.size - 64 * 1024; /* far past the real entries */
	uint8_t *p;

	holder_init(&h, a, NULL);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(put(a, &h, i, 0, 0), 0);
	store_seal(a, hash_all);
	o3 = store_find(a, "key-3", 5);
	o4 = store_find(a, "key-4", 5);
	/* key-1's bytes changed after its checksum was taken */
	store_object_ptr(store_find(a, "key-1", 5))[7] ^= 0x40;
	p = store_object_ptr(o3);
	/* a second claim on key-3's place, under another key, checking */
	forge(a, at, "thief", o3->block->offset, o3->len, 1, hash(p, o3->len), true);
	/* a place outside the segment */
	forge(a, at + 128, "outside", a->tiers[0].seg.size + 4096, 64, 1, 0, true);
	/* an entry that does not check */
	forge(a, at + 256, "nocheck", o4->block->offset + o4->len + 4096, 64, 1, 0, false);
	/* an older copy of key-4 at a free place (its bytes checking) */
	memcpy((uint8_t *) a->tiers[0].seg.base + a->tiers[0].seg.size - 65536, store_object_ptr(o4),
	       o4->len);
	forge(a, at + 384, "key-4", a->tiers[0].seg.size - 65536, o4->len, o4->ver - 1,
	      hash(store_object_ptr(o4), o4->len), true);
	/* a newer copy of key-5 at a place above the older one's */
	{
		struct object *o5 = store_find(a, "key-5", 5);
		uint8_t *q = (uint8_t *) a->tiers[0].seg.base + a->tiers[0].seg.size - 131072;

		for (uint64_t j = 0; j < o5->len; j++)
			q[j] = byte_of(5, 9, j);
		forge(a, at + 512, "key-5", a->tiers[0].seg.size - 131072, o5->len, o5->ver + 1,
		      hash(q, o5->len), true);
	}
	b = take(leave(a), &rep);
	finish(a, &h);
	CHECK_EQ(check(b, 5, 9), 1); /* the newer copy, though the older came first */
	CHECK_EQ(check(b, 1, 0), 0);
	CHECK(store_find(b, "thief", 5) == NULL);
	CHECK(store_find(b, "outside", 7) == NULL);
	CHECK(store_find(b, "nocheck", 7) == NULL);
	CHECK_EQ(check(b, 3, 0), 0);  /* claimed twice: neither is trusted */
	CHECK_EQ(check(b, 4, 0), 1);  /* the newer copy */
	for (int i = 0; i < 10; i++)
		if (i != 1 && i != 3 && i != 5)
			CHECK_EQ(check(b, i, 0), 1);
	CHECK_EQ(rep.kept, 8);
	CHECK_EQ(rep.mismatched, 4); /* key-1's bytes, key-3 and its thief, outside */
	CHECK_EQ(rep.dropped, 6);    /* and the older key-4 and key-5 */
	CHECK_EQ(b->tiers[0].alloc.n_used, 8);
	CHECK_EQ(shm_alloc_check(&b->tiers[0].alloc), 0);
	finish(b, NULL);
}

static void test_resized(void)
{
	struct store *a = fresh(), *b;
	struct store_warm_report rep;
	struct holder h;

	holder_init(&h, a, NULL);
	CHECK_EQ(put(a, &h, 1, 0, 0), 0);
	store_seal(a, hash_all);
	cfg.dram_size *= 2;
	b = take(leave(a), &rep);
	cfg.dram_size /= 2;
	finish(a, &h);
	CHECK(!rep.warm);
	CHECK_EQ(rep.kept, 0);
	CHECK_EQ(check(b, 1, 0), 0);
	CHECK_EQ(b->tiers[0].alloc.size, 2 * cfg.dram_size);
	finish(b, NULL);
}

int main(void)
{
	config_init(&cfg);
	cfg.dram_size = 16 << 20;
	cfg.hugepages = SHM_HUGEPAGES_OFF;
	cfg.lease_ttl_ms = 0;
	log_configure("error");
	CHECK_EQ(loop_new(0, &lp), 0);
	test_round_trip();
	test_crash();
	test_scribbles_and_forgeries();
	test_resized();
	loop_free(lp);
	return 0;
}
