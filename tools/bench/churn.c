/* SPDX-License-Identifier: MIT */
/* kvcache-bench churn: a pool that is always full. */
#include "bench.h"

/* ---- churn: a pool that is always full ---- */

uint64_t pool_capacity(struct kvc_client *c)
{
	struct kvc_status *st;
	uint64_t cap = 0;

	check(kvc_status_get(c, &st), "status");
	for (size_t i = 0; i < st->n_tiers; i++)
		cap += st->tiers[i].capacity;
	kvc_status_free(st);
	return cap;
}

uint64_t counter(struct kvc_client *c, const char *name)
{
	struct kvc_counter *v;
	uint64_t val = 0;
	size_t n;

	check(kvc_stats_get(c, &v, &n), "stats");
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			val = v[i].value;
	kvc_stats_free(v);
	return val;
}

/* A daemon that has run a while: its tiers faulted in (--prefault, on by
 * default), which a daemon just started is still doing.  Seconds waited. */
double wait_prefault(const char *sock)
{
	uint64_t t0 = now_ns(), last = UINT64_MAX;
	struct kvc_client *c;

	check(kvc_connect(sock, &c), "connect");
	for (int i = 0; i < 600; i++) {
		uint64_t done = counter(c, "prefaulted_bytes");

		if (done == last)
			break;
		last = done;
		usleep(200 * 1000);
	}
	kvc_disconnect(c);
	return (double) (now_ns() - t0) / 1e9;
}

/*
 * Replay a prompt trace; returns usable prefix blocks / blocks asked for.
 * An engine prefills many prompts at once, so requests come in batches of
 * 16 and their missing blocks are stored round-robin, block 0 of every
 * prompt, then block 1, ...: in LRU order the heads of all 16 chains are the
 * oldest entries.
 */
static double prefix_trace(struct kvc_client *c, const char *ns, bool parents, uint64_t pool,
			   uint8_t *src, uint64_t *ret_requests)
{
	enum { BLOCKS = 16, BLOCK = 32 << 10, BATCH = 16 };
	uint64_t prompts = 3 * pool / (BLOCKS * BLOCK), rs = 1234, usable = 0, asked = 0;
	uint64_t requests = prompts * 8;
	static char keys[BATCH][BLOCKS][96];
	const char *kp[BLOCKS];
	int hit[BATCH];

	for (uint64_t q = 0; q < requests; q += BATCH) {
		for (int j = 0; j < BATCH; j++) {
			uint64_t p = bench_rand(&rs) % prompts;

			for (int b = 0; b < BLOCKS; b++) {
				snprintf(keys[j][b], sizeof(keys[j][b]), "%s@prompt%06" PRIu64 "@block%02d",
					 ns, p, b);
				kp[b] = keys[j][b];
			}
			hit[j] = kvc_prefix_lookup(c, kp, BLOCKS);
			if (hit[j] < 0)
				die(hit[j], "%s", "prefix lookup");
			usable += (uint64_t) hit[j];
			asked += BLOCKS;
		}
		for (int b = 0; b < BLOCKS; b++)
			for (int j = 0; j < BATCH; j++) {
				struct kvc_put_opts o = { .flags = KVC_PUT_REPLACE,
							  .parent_key = parents && b ? keys[j][b - 1] : NULL };
				int r;

				if (b < hit[j])
					continue;
				r = kvc_put(c, keys[j][b], src, BLOCK, &o);
				if (r < 0 && r != -EBUSY)
					die(r, "%s", "put");
			}
	}
	*ret_requests = requests;
	return (double) usable / (double) asked;
}

int run_churn(uint64_t size)
{
	struct kvc_client *c;
	char sock[200], key[96];
	uint8_t *src = malloc(size), *dst = malloc(size);
	uint64_t pool, keys, rs = 99, n_put = 0, put_ns = 0, gets = 0, hits = 0, t0, ev0;
	double empty_rate, churn_rate, rate_prefix, rate_lru;
	uint64_t requests;
	int r;

	if (!src || !dst)
		die(0, "%s", "out of memory");
	memset(src, 0x5a, size);
	bench_setup();
	if (arg_socket)
		snprintf(sock, sizeof(sock), "%s", arg_socket);
	else
		start_daemon(sock, sizeof(sock), "256MB", "50");
	r = kvc_connect(sock, &c);
	if (r < 0)
		die(r, "cannot reach kvcached at %s", sock);
	pool = pool_capacity(c);
	keys = 3 * pool / size;

	/* 0: touch every page of the pool once, then empty it: both phases
	 * below then write into memory the kernel has already handed out */
	for (uint64_t i = 0; i < 2 * pool / size; i++) {
		snprintf(key, sizeof(key), "warm/%" PRIu64, i);
		check(kvc_put(c, key, src, size, NULL), "put");
	}
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");

	/* 1: puts into an empty pool, up to half of it */
	t0 = now_ns();
	for (uint64_t i = 0; i < pool / 2 / size; i++) {
		uint64_t a = now_ns();

		snprintf(key, sizeof(key), "churn/%" PRIu64, i);
		check(kvc_put(c, key, src, size, NULL), "put");
		put_ns += now_ns() - a;
		n_put++;
	}
	empty_rate = (double) n_put / ((double) put_ns / 1e9);
	(void) t0;

	/* 2: cache-aside over a working set 3x the pool: get, and put on a
	 * miss, with the evictor busy all along */
	n_put = put_ns = 0;
	ev0 = counter(c, "evictions");
	t0 = now_ns();
	while (now_ns() - t0 < (uint64_t) (arg_duration * 1e9)) {
		uint64_t k = bench_rand(&rs) % keys, a;
		ssize_t g;

		snprintf(key, sizeof(key), "churn/%" PRIu64, k);
		g = kvc_get(c, key, dst, size);
		gets++;
		if (g == (ssize_t) size) {
			hits++;
			continue;
		}
		if (g != -ENOENT)
			die((int) g, "%s", "get");
		a = now_ns();
		r = kvc_put(c, key, src, size, NULL);
		if (r < 0 && r != -EEXIST)
			die(r, "put while churning (%s)", kvc_last_error_msg());
		put_ns += now_ns() - a;
		n_put++;
	}
	churn_rate = (double) n_put / ((double) put_ns / 1e9);

	printf("kvcache-bench churn: pool %.0f MiB, values of %" PRIu64 " bytes, working set 3x the "
	       "pool, %.1f s, leases 50 ms\n", (double) pool / (1 << 20), size, arg_duration);
	printf("put, empty pool       %10.0f puts/s\n", empty_rate);
	printf("put, evicting         %10.0f puts/s  (%.0f%% of empty; %" PRIu64 " evictions)\n",
	       churn_rate, 100.0 * churn_rate / empty_rate, counter(c, "evictions") - ev0);
	printf("get hit rate          %10.1f%%  (%" PRIu64 " gets; uniform keys over 3x the pool "
	       "cannot beat 33%%)\n", 100.0 * (double) hits / (double) gets, gets);

	/* 3: the same prompt trace, with parent keys and without */
	usleep(60000); /* let the last leases lapse */
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");
	rate_prefix = prefix_trace(c, "pa", true, pool, src, &requests);
	usleep(60000);
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");
	rate_lru = prefix_trace(c, "lru", false, pool, src, &requests);
	printf("prompt trace: %" PRIu64 " requests of 16 x 32 KiB blocks in batches of 16 stored "
	       "round-robin, prompts 3x the pool, uniform reuse\n", requests);
	printf("usable prefix rate    prefix-aware %.1f%%, plain LRU %.1f%%\n", 100.0 * rate_prefix,
	       100.0 * rate_lru);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	free(src);
	free(dst);
	return 0;
}
