/* SPDX-License-Identifier: MIT */
/* Capacity management: tiers under 3x pressure, watermarks, leases (and
 * where an expired one leaves its object), pins, prefix-aware eviction against plain LRU on the same trace, promotion and
 * demotion between device and dram with bytes intact. */
#include <signal.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"

/* Present, without touching it (exists would grant a lease). */
static bool present(struct kvc_client *c, const char *key, int *ret_tier)
{
	struct kvc_key_info *v;
	size_t n;
	bool found = false;

	CHECK_EQ(kvc_list(c, key, 4096, &v, &n, NULL), 0);
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].key, key) == 0 && v[i].state == KVC_STATE_COMMITTED) {
			found = true;
			if (ret_tier)
				*ret_tier = v[i].tier;
		}
	kvc_list_free(v);
	return found;
}

static void tier_usage(struct kvc_client *c, const char *name, uint64_t *used, uint64_t *cap,
		       uint64_t *high)
{
	struct kvc_status *s;

	CHECK_EQ(kvc_status_get(c, &s), 0);
	*used = *cap = *high = 0;
	for (size_t i = 0; i < s->n_tiers; i++)
		if (strcmp(s->tiers[i].name, name) == 0) {
			*used = s->tiers[i].used;
			*cap = s->tiers[i].capacity;
			*high = s->tiers[i].high_watermark;
		}
	kvc_status_free(s);
}

static bool wait_below_high(struct kvc_client *c, const char *tier)
{
	for (int i = 0; i < 300; i++) {
		uint64_t used, cap, high;

		tier_usage(c, tier, &used, &cap, &high);
		if (used <= high)
			return true;
		usleep(10000);
	}
	return false;
}

/* ---- 3x the pool in random sizes ---- */

static void test_pressure(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	enum { MAX_OBJ = 4096 };
	static size_t len[MAX_OBJ];
	uint8_t *buf = malloc(2 << 20);
	uint64_t total = 0, rs = 42, hits = 0, misses = 0;
	const uint64_t pool = (48 + 16) << 20;
	int n = 0;

	test_daemon_start(&td, "--dram-size", "48MB", "--device-size", "16MB", "--hugepages", "off",
			  "--eviction-high-watermark-ratio", "0.9", "--eviction-ratio", "0.1",
			  /* leases are test_protection()'s: here every read object
			  * would be protected for the whole run */
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	while (total < 3 * pool && n < MAX_OBJ) {
		char key[64];
		uint64_t used, cap, high;

		len[n] = 1024 + test_rand(&rs) % (2 << 20);
		snprintf(key, sizeof(key), "p/%d", n);
		test_fill(buf, len[n], (uint64_t) n);
		{
			int r = kvc_put(c, key, buf, len[n], NULL);

			if (r < 0)
				fprintf(stderr, "put %s (%zu bytes): %s (%s)\n", key, len[n],
					kvc_strerror(r), kvc_last_error_msg());
			CHECK_EQ(r, 0);
		}
		total += len[n];
		/* every few puts, read back a recent one: promotions happen */
		if (n % 3 == 0 && n > 4) {
			snprintf(key, sizeof(key), "p/%d", n - 2);
			if (kvc_get(c, key, buf, 2 << 20) > 0)
				kvc_get(c, key, buf, 2 << 20);
		}
		tier_usage(c, "dram", &used, &cap, &high);
		CHECK(used <= cap);
		tier_usage(c, "device", &used, &cap, &high);
		CHECK(used <= cap);
		n++;
	}
	CHECK(wait_below_high(c, "dram"));
	CHECK(wait_below_high(c, "device"));
	/* exact bytes or a miss, never wrong bytes */
	for (int i = 0; i < n; i++) {
		char key[64];
		ssize_t r;

		snprintf(key, sizeof(key), "p/%d", i);
		r = kvc_get(c, key, buf, 2 << 20);
		if (r == -ENOENT) {
			misses++;
			continue;
		}
		CHECK_EQ(r, (ssize_t) len[i]);
		CHECK(test_verify(buf, len[i], (uint64_t) i));
		hits++;
	}
	printf("pressure: %d objects, %.0f MiB into a %llu MiB pool: %llu still there, %llu evicted; "
	       "evictions %llu (capacity %llu, watermark %llu), promotions %llu, demotions %llu\n",
	       n, (double) total / (1 << 20), (unsigned long long) (pool >> 20),
	       (unsigned long long) hits, (unsigned long long) misses,
	       (unsigned long long) test_counter(c, "evictions"),
	       (unsigned long long) test_counter(c, "dram.evictions_capacity"),
	       (unsigned long long) test_counter(c, "dram.evictions_watermark"),
	       (unsigned long long) test_counter(c, "promotions"),
	       (unsigned long long) test_counter(c, "demotions"));
	CHECK(hits > 0 && misses > 0);
	CHECK(test_counter(c, "evictions") > 0);
	CHECK(test_counter(c, "promotions") > 0);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	free(buf);
}

/* ---- leases, views and pins under pressure ---- */

static uint64_t counter(struct kvc_client *c, const char *name)
{
	struct kvc_counter *v;
	uint64_t x = UINT64_MAX;
	size_t n;

	CHECK_EQ(kvc_stats_get(c, &v, &n), 0);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			x = v[i].value;
	kvc_stats_free(v);
	CHECK(x != UINT64_MAX);
	return x;
}

static void fill_pool(struct kvc_client *c, const char *prefix, int count, size_t size)
{
	uint8_t *buf = calloc(1, size);

	for (int i = 0; i < count; i++) {
		char key[64];

		snprintf(key, sizeof(key), "%s/%d", prefix, i);
		CHECK_EQ(kvc_put(c, key, buf, size, NULL), 0);
	}
	free(buf);
}

static void test_protection(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_put_opts hard = { .flags = KVC_PUT_HARD_PIN };
	struct kvc_put_opts soft = { .flags = KVC_PUT_SOFT_PIN };
	static uint8_t val[1 << 20];
	struct kvc_view v;
	uint64_t freed, objs;

	test_daemon_start(&td, "--dram-size", "32MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "1500", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	test_fill(val, sizeof(val), 9);
	CHECK_EQ(kvc_put(c, "leased", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_put(c, "viewed", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_put(c, "hard", val, sizeof(val), &hard), 0);
	CHECK_EQ(kvc_put(c, "soft", val, sizeof(val), &soft), 0);
	CHECK_EQ(kvc_put(c, "plain", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_put(c, "pinned-later", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_pin(c, "pinned-later", KVC_PIN_HARD, 0), 0);
	CHECK_EQ(kvc_pin(c, "nothing", 0, 0), -ENOENT);
	CHECK_EQ(kvc_exists(c, "leased"), 1);          /* a hit: leased for 1.5 s */
	CHECK_EQ(kvc_acquire(c, "viewed", &v), 0);

	/* a lease also refuses removal */
	CHECK_EQ(kvc_remove(c, "leased"), -EBUSY);
	CHECK(strstr(kvc_last_error_msg(), "leased"));

	/* 3x the pool of unpinned filler */
	fill_pool(c, "filler", 96, 1 << 20);
	CHECK(present(c, "leased", NULL));
	CHECK(present(c, "viewed", NULL));
	CHECK(present(c, "hard", NULL));
	CHECK(present(c, "pinned-later", NULL));
	CHECK(present(c, "soft", NULL)); /* unpinned filler went first */
	CHECK(!present(c, "plain", NULL));
	CHECK(test_verify(v.data, v.len, 9));

	/* a little manual eviction takes unpinned objects, not the soft one */
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 1, 0, &freed, &objs), 0);
	CHECK_EQ(objs, 1);
	CHECK(present(c, "soft", NULL));
	/* everything evictable: now the soft pin goes too, the rest stays */
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &freed, &objs), 0);
	CHECK(!present(c, "soft", NULL));
	CHECK(present(c, "leased", NULL));
	CHECK(present(c, "viewed", NULL));
	CHECK(present(c, "hard", NULL));
	CHECK(present(c, "pinned-later", NULL));

	/* a put that cannot be made room for fails with -ENOSPC only when
	 * everything left is protected: a lease yields first, a view never */
	CHECK_EQ(counter(c, "leases_broken"), 0);
	CHECK_EQ(kvc_unpin(c, "pinned-later"), 0);
	{
		struct kvc_buf b;
		int r = kvc_reserve(c, "too-much", 30 << 20, NULL, &b);

		CHECK_EQ(r, -ENOSPC);
		CHECK(!present(c, "pinned-later", NULL)); /* it was evicted trying */
		CHECK(!present(c, "leased", NULL)); /* the lease yielded */
		CHECK_EQ(counter(c, "leases_broken"), 1);
		CHECK(present(c, "viewed", NULL));
	}

	/* leases expire and then protect nothing */
	usleep(1600 * 1000);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &freed, &objs), 0);
	CHECK(!present(c, "viewed", NULL)); /* its lease from acquire expired too */
	CHECK(present(c, "hard", NULL));
	CHECK_EQ(kvc_unpin(c, "hard"), 0);
	CHECK_EQ(kvc_remove(c, "hard"), 0);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* An object read (leased) a while ago goes before one stored after it:
 * its lease ran out, and its last use is older. */
static void test_lease_order(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	int old = 0, new = 0;
	char key[64];

	test_daemon_start(&td, "--dram-size", "32MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "300", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	fill_pool(c, "read", 8, 1 << 20);
	for (int i = 0; i < 8; i++) {
		snprintf(key, sizeof(key), "read/%d", i);
		CHECK_EQ(kvc_exists(c, key), 1); /* leased for 0.3 s */
	}
	/* stored while those leases last, then more once they ran out, past
	 * the pool: some must go */
	fill_pool(c, "stored", 12, 1 << 20);
	usleep(500 * 1000);
	fill_pool(c, "more", 12, 1 << 20);
	/* the watermark eviction is background work: give it its turn */
	for (int i = 0; i < 300; i++) {
		if (test_counter(c, "dram.used") <= test_counter(c, "dram.high_watermark"))
			break;
		usleep(10 * 1000);
	}
	for (int i = 0; i < 24; i++) {
		snprintf(key, sizeof(key), "%s/%d", i < 12 ? "stored" : "more", i % 12);
		new += present(c, key, NULL);
	}
	for (int i = 0; i < 8; i++) {
		snprintf(key, sizeof(key), "read/%d", i);
		old += present(c, key, NULL);
	}
	if (new != 24 || old == 8)
		fprintf(stderr, "kept %d of 24 stored later, %d of 8 read before (dram used %llu, "
			"high watermark %llu; evictions: watermark %llu, capacity %llu)\n", new, old,
			(unsigned long long) test_counter(c, "dram.used"),
			(unsigned long long) test_counter(c, "dram.high_watermark"),
			(unsigned long long) test_counter(c, "dram.evictions_watermark"),
			(unsigned long long) test_counter(c, "dram.evictions_capacity"));
	CHECK(old < 8);
	CHECK_EQ(new, 24);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* ---- prefix chains ---- */

#define PROMPTS 160
#define BLOCKS 16
#define BLOCK (32 << 10)

static void chain_key(char *buf, size_t len, const char *ns, int p, int b)
{
	snprintf(buf, len, "%s@p%03d@b%02d", ns, p, b);
}

/* How a trace names parents: not at all, one put per block, or one
 * KVC_PUT_CHAIN batch per prompt (kvc_batch_put, kvc_batch_put_from). */
enum parents { NO_PARENTS, PUT_PARENTS, CHAIN_BATCH, CHAIN_BATCH_FROM };

/* The missing blocks of a prompt in one chained batch. */
static void put_chain(struct kvc_client *c, enum parents how, char (*keys)[64], int p, int hit,
		      struct kvc_buffer *buf)
{
	static uint8_t vals[BLOCKS][BLOCK];
	struct kvc_iovec iov[BLOCKS], *iovp[BLOCKS];
	struct kvc_iov riov[BLOCKS];
	const struct kvc_iov *riovp[BLOCKS];
	const char *kp[BLOCKS];
	size_t n_iov[BLOCKS];
	int res[BLOCKS], n = BLOCKS - hit;
	struct kvc_put_opts o = { .parent_key = hit ? keys[hit - 1] : NULL,
				  .flags = KVC_PUT_REPLACE | KVC_PUT_CHAIN };

	for (int i = 0; i < n; i++) {
		int b = hit + i;
		uint8_t *v = how == CHAIN_BATCH ? vals[i] : (uint8_t *) buf->data + (size_t) i * BLOCK;

		test_fill(v, BLOCK, (uint64_t) (p * 100 + b));
		kp[i] = keys[b];
		iov[i] = (struct kvc_iovec) { v, BLOCK };
		iovp[i] = &iov[i];
		riov[i] = (struct kvc_iov) { buf, (uint64_t) i * BLOCK, BLOCK };
		riovp[i] = &riov[i];
		n_iov[i] = 1;
	}
	if (how == CHAIN_BATCH)
		CHECK_EQ(kvc_batch_put(c, (size_t) n, kp, (const struct kvc_iovec *const *) iovp, n_iov,
				       &o, res), n);
	else
		CHECK_EQ(kvc_batch_put_from(c, (size_t) n, kp, riovp, n_iov, &o, res), n);
}

/* Replay a request trace; returns the prefix blocks found usable. */
static uint64_t run_trace(struct kvc_client *c, const char *ns, enum parents how,
			  uint64_t *ret_requested)
{
	static uint8_t val[BLOCK];
	char keys[BLOCKS][64];
	const char *kp[BLOCKS];
	uint64_t rs = 7, usable = 0, requested = 0;
	struct kvc_buffer buf = { 0 };

	if (how == CHAIN_BATCH_FROM)
		CHECK_EQ(kvc_buffer_alloc(c, (size_t) BLOCKS * BLOCK, &buf), 0);

	for (int step = 0; step < 2000; step++) {
		/* prompts come back at random, a dozen times each on average */
		int p = (int) (test_rand(&rs) % PROMPTS);
		int hit;

		for (int b = 0; b < BLOCKS; b++) {
			chain_key(keys[b], sizeof(keys[b]), ns, p, b);
			kp[b] = keys[b];
		}
		hit = kvc_prefix_lookup(c, kp, BLOCKS);
		CHECK(hit >= 0);
		usable += (uint64_t) hit;
		requested += BLOCKS;
		if (how >= CHAIN_BATCH) {
			if (hit < BLOCKS)
				put_chain(c, how, keys, p, hit, &buf);
			continue;
		}
		for (int b = hit; b < BLOCKS; b++) {
			struct kvc_put_opts o = { .parent_key = how && b ? keys[b - 1] : NULL,
						  .flags = KVC_PUT_REPLACE };

			test_fill(val, sizeof(val), (uint64_t) (p * 100 + b));
			CHECK_EQ(kvc_put(c, keys[b], val, sizeof(val), &o), 0);
		}
	}
	if (buf.data)
		CHECK_EQ(kvc_buffer_free(c, &buf), 0);
	*ret_requested = requested;
	return usable;
}

/* Blocks kept whose predecessor is gone: bytes no prefix lookup can use. */
static uint64_t orphan_blocks(struct kvc_client *c, const char *ns, uint64_t *ret_kept)
{
	uint64_t orphans = 0, kept = 0;

	for (int p = 0; p < PROMPTS; p++)
		for (int b = 1; b < BLOCKS; b++) {
			char key[64], parent[64];

			chain_key(key, sizeof(key), ns, p, b);
			chain_key(parent, sizeof(parent), ns, p, b - 1);
			if (present(c, key, NULL)) {
				kept++;
				orphans += !present(c, parent, NULL);
			}
		}
	*ret_kept = kept;
	return orphans;
}

static void test_prefix_chains(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	uint64_t req_prefix, req_lru, use_prefix, use_lru, kept_prefix, kept_lru, dead_lru;

	/* 160 chains of 16 x 32 KiB = 80 MiB against 24 MiB: over 3x */
	test_daemon_start(&td, "--dram-size", "24MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	use_prefix = run_trace(c, "prefix", PUT_PARENTS, &req_prefix);
	/* every surviving block's parent survives */
	CHECK_EQ(orphan_blocks(c, "prefix", &kept_prefix), 0);
	CHECK(kept_prefix > 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), 0);
	/* a prompt's missing blocks in one KVC_PUT_CHAIN batch: the same chains */
	for (enum parents how = CHAIN_BATCH; how <= CHAIN_BATCH_FROM; how++) {
		const char *ns = how == CHAIN_BATCH ? "chain" : "chainfrom";
		uint64_t req, kept;

		run_trace(c, ns, how, &req);
		CHECK_EQ(orphan_blocks(c, ns, &kept), 0);
		CHECK(kept > 0);
		CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), 0);
	}
	/* the same trace with no parent keys: plain LRU */
	use_lru = run_trace(c, "lru", NO_PARENTS, &req_lru);
	dead_lru = orphan_blocks(c, "lru", &kept_lru);
	CHECK_EQ(req_prefix, req_lru);
	printf("prefix chains (same trace, 2000 requests of 16 blocks, 3.3x the pool): usable prefix "
	       "blocks: prefix-aware %llu (%.1f%%), plain LRU %llu (%.1f%%); at the end LRU keeps "
	       "%llu of %llu blocks behind a missing predecessor, prefix-aware 0 of %llu\n",
	       (unsigned long long) use_prefix, 100.0 * (double) use_prefix / (double) req_prefix,
	       (unsigned long long) use_lru, 100.0 * (double) use_lru / (double) req_lru,
	       (unsigned long long) dead_lru, (unsigned long long) kept_lru,
	       (unsigned long long) kept_prefix);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* ---- device tier: promotion and demotion keep the bytes ---- */

static void test_device_tier(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	static uint8_t buf[1 << 20];
	int tier = 0;
	pid_t pid;
	int ready[2];
	char b;

	test_daemon_start(&td, "--dram-size", "64MB", "--device-size", "8MB", "--hugepages", "off",
			  "--promotion-hits", "2", "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	for (int i = 0; i < 24; i++) {
		char key[32];

		snprintf(key, sizeof(key), "d/%d", i);
		test_fill(buf, sizeof(buf), (uint64_t) i + 500);
		CHECK_EQ(kvc_put(c, key, buf, sizeof(buf), NULL), 0);
		CHECK(present(c, key, &tier) && tier == KVC_TIER_DRAM);
	}
	/* two hits each: promoted; 24 MiB does not fit in 8 MiB, so older
	 * ones are demoted back as newer ones arrive */
	for (int i = 0; i < 24; i++) {
		char key[32];

		snprintf(key, sizeof(key), "d/%d", i);
		for (int k = 0; k < 2; k++) {
			CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), sizeof(buf));
			CHECK(test_verify(buf, sizeof(buf), (uint64_t) i + 500));
		}
		/* let the loop's maintenance run */
		for (int w = 0; w < 100 && test_counter(c, "promotions") < (uint64_t) i + 1; w++)
			usleep(2000);
	}
	CHECK(test_counter(c, "device.promotions") >= 8);
	CHECK(test_counter(c, "dram.demotions") > 0);
	CHECK(wait_below_high(c, "device"));
	{
		int on_device = 0;

		for (int i = 0; i < 24; i++) {
			char key[32];

			snprintf(key, sizeof(key), "d/%d", i);
			CHECK(present(c, key, &tier));
			on_device += tier == KVC_TIER_DEVICE;
			CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), sizeof(buf));
			CHECK(test_verify(buf, sizeof(buf), (uint64_t) i + 500));
		}
		printf("device tier: %d of 24 objects on device, promotions %llu, demotions %llu, "
		       "bytes moved %llu\n", on_device,
		       (unsigned long long) test_counter(c, "promotions"),
		       (unsigned long long) test_counter(c, "demotions"),
		       (unsigned long long) test_counter(c, "bytes_moved"));
		CHECK(on_device > 0);
	}

	/* a viewed object is never moved: its view stays valid */
	{
		struct kvc_view v;
		const void *before;

		CHECK_EQ(kvc_acquire(c, "d/3", &v), 0);
		before = v.data;
		for (int k = 0; k < 4; k++)
			CHECK_EQ(kvc_get(c, "d/3", buf, sizeof(buf)), sizeof(buf));
		usleep(50000);
		CHECK(v.data == before);
		CHECK(test_verify(v.data, v.len, 503));
		CHECK_EQ(kvc_release(c, &v), 0);
	}

	/* a SIGKILLed client's views on device objects are released */
	CHECK(pipe(ready) == 0);
	pid = fork();
	if (pid == 0) {
		struct kvc_client *k;
		struct kvc_view views[24];

		CHECK_EQ(kvc_connect(td.socket, &k), 0);
		for (int i = 0; i < 24; i++) {
			char key[32];

			snprintf(key, sizeof(key), "d/%d", i);
			CHECK_EQ(kvc_acquire(k, key, &views[i]), 0);
		}
		CHECK(write(ready[1], "x", 1) == 1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	CHECK_EQ(read(ready[0], &b, 1), 1);
	close(ready[0]);
	CHECK_EQ(kvc_remove(c, "d/0"), -EBUSY);
	kill(pid, SIGKILL);
	CHECK_EQ(test_wait(pid), 128 + SIGKILL);
	for (int w = 0; w < 300 && kvc_remove(c, "d/0") == -EBUSY; w++)
		usleep(10000);
	CHECK(!present(c, "d/0", NULL));
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), 0);
	{
		uint64_t used, cap, high;

		tier_usage(c, "device", &used, &cap, &high);
		CHECK_EQ(used, 0);
		tier_usage(c, "dram", &used, &cap, &high);
		CHECK_EQ(used, 0);
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* Leases do not starve the pool: leased bytes stay under
 * --max-leased-ratio, so puts after a scan that leased everything are all
 * readable (the objects whose leases yielded go, not the fresh puts). */
static void test_lease_yield(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	static uint8_t val[1 << 20];
	char key[64];
	int kept = 0;

	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	/* a look with KVC_PEEK leases nothing: a removal is not refused */
	CHECK_EQ(kvc_put(c, "peeked", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_set_get_flags(c, KVC_PEEK), 0);
	CHECK_EQ(kvc_exists(c, "peeked"), 1);
	{
		const char *k = "peeked";
		uint8_t there = 0;

		CHECK_EQ(kvc_batch_exists(c, &k, 1, &there), 1);
		CHECK_EQ(there, 1);
		CHECK_EQ(kvc_prefix_lookup(c, &k, 1), 1);
	}
	CHECK_EQ(kvc_set_get_flags(c, 0), KVC_PEEK);
	CHECK_EQ(kvc_remove(c, "peeked"), 0);
	CHECK_EQ(kvc_put(c, "looked", val, sizeof(val), NULL), 0);
	CHECK_EQ(kvc_exists(c, "looked"), 1);
	CHECK_EQ(kvc_remove(c, "looked"), -EBUSY); /* without it, leased */
	CHECK_EQ(kvc_remove_force(c, "looked"), 0);
	fill_pool(c, "old", 50, sizeof(val));
	for (int i = 0; i < 50; i++) {
		snprintf(key, sizeof(key), "old/%d", i);
		CHECK_EQ(kvc_exists(c, key), 1); /* a router's look: a lease each */
	}
	/* 50 MiB leased would be over half of 64 MiB: the oldest yielded */
	CHECK(counter(c, "leases_broken") >= 18);
	for (int i = 0; i < 16; i++) {
		snprintf(key, sizeof(key), "new/%d", i);
		test_fill(val, sizeof(val), i);
		CHECK_EQ(kvc_put(c, key, val, sizeof(val), NULL), 0);
	}
	for (int i = 0; i < 16; i++) {
		snprintf(key, sizeof(key), "new/%d", i);
		kept += present(c, key, NULL);
	}
	CHECK_EQ(kept, 16);
	for (int i = 0; i < 16; i += 5) {
		ssize_t n;

		snprintf(key, sizeof(key), "new/%d", i);
		n = kvc_get(c, key, val, sizeof(val));
		CHECK_EQ(n, (ssize_t) sizeof(val));
		CHECK(test_verify(val, sizeof(val), i));
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

int main(void)
{
	test_pressure();
	test_protection();
	test_lease_yield();
	test_lease_order();
	test_prefix_chains();
	test_device_tier();
	return 0;
}
