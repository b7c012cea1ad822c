/* SPDX-License-Identifier: MIT */
/* kvcache-bench local: the fast path, op by op and size by size. */
#include "bench.h"

/* ---- the kvcache workloads ---- */


void check(int r, const char *what)
{
	if (r < 0)
		die(r, "%s failed", what);
}

void bench_exists(struct kvc_client *c, struct counters *k, struct result *r)
{
	check(kvc_put(c, "bench/exists", "x", 1, NULL), "put");
	*r = (struct result) { .op = "exists" };
	TIMED_LOOP(r, k, if (kvc_exists(c, "bench/exists") != 1) die(0, "%s", "exists missed"));
	kvc_remove_force(c, "bench/exists");
}

void make_key(char *buf, size_t len, const char *what, uint64_t size, uint64_t i)
{
	snprintf(buf, len, "bench/%s/%" PRIu64 "@tp_rank:0@%016" PRIx64 "%016" PRIx64, what, size, i,
		 (uint64_t) (i * UINT64_C(0x9e3779b97f4a7c15)));
}

static uint64_t window_for(uint64_t size)
{
	uint64_t w = (256ull << 20) / size;

	return w < 4 ? 4 : w > 64 ? 64 : w;
}

void bench_put(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
		      uint8_t *src)
{
	/* Overwrite a rolling set of keys (KVC_PUT_REPLACE): the pool holds
	 * at most window + 1 values and every put is one put. */
	struct kvc_put_opts replace = { .flags = KVC_PUT_REPLACE };
	uint64_t window = window_for(size);
	struct kvc_buf bufs[64];
	uint8_t *dsts[64];
	const uint8_t *srcs[64];
	char key[128];

	/* the baseline: memcpy into pool space of this size */
	for (uint64_t i = 0; i < window; i++) {
		make_key(key, sizeof(key), "base", size, i);
		check(kvc_reserve(c, key, size, NULL, &bufs[i]), "reserve");
		dsts[i] = bufs[i].data;
		srcs[i] = src;
	}
	*r = (struct result) { .op = "put", .size = size };
	r->memcpy_gbs = memcpy_cycle(dsts, srcs, window, size);
	for (uint64_t i = 0; i < window; i++)
		kvc_abort(c, &bufs[i]);

	TIMED_LOOP(r, k, {
		make_key(key, sizeof(key), "put", size, i % window);
		check(kvc_put(c, key, src, size, &replace), "put");
	});
	for (uint64_t i = 0; i < window; i++) {
		make_key(key, sizeof(key), "put", size, i);
		kvc_remove_force(c, key);
	}
}

void bench_get(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
		      uint8_t *src, uint8_t *dst, bool acquire)
{
	uint64_t n_keys = (512ull << 20) / size;
	char keys[64][128];

	if (n_keys > 64)
		n_keys = 64;
	if (n_keys < 2)
		n_keys = 2;
	for (uint64_t i = 0; i < n_keys; i++) {
		make_key(keys[i], sizeof(keys[i]), "get", size, i);
		check(kvc_put(c, keys[i], src, size, NULL), "put");
	}
	*r = (struct result) { .op = acquire ? "acquire" : "get", .size = size };
	if (!acquire) {
		/* the baseline: memcpy from the stored objects themselves */
		struct kvc_view views[64];
		uint8_t *dsts[64];
		const uint8_t *srcs[64];

		for (uint64_t i = 0; i < n_keys; i++) {
			check(kvc_acquire(c, keys[i], &views[i]), "acquire");
			srcs[i] = views[i].data;
			dsts[i] = dst;
		}
		r->memcpy_gbs = memcpy_cycle(dsts, srcs, n_keys, size);
		for (uint64_t i = 0; i < n_keys; i++)
			kvc_release(c, &views[i]);
	}
	if (acquire) {
		TIMED_LOOP(r, k, {
			struct kvc_view v;

			check(kvc_acquire(c, keys[i % n_keys], &v), "acquire");
			check(kvc_release(c, &v), "release");
		});
	} else {
		TIMED_LOOP(r, k, {
			if (kvc_get(c, keys[i % n_keys], dst, size) != (ssize_t) size)
				die(0, "%s", "get returned a wrong length");
		});
		if (memcmp(dst, src, size) != 0)
			die(0, "%s", "get returned wrong bytes");
	}
	for (uint64_t i = 0; i < n_keys; i++)
		kvc_remove_force(c, keys[i]);
}

void bench_keys(struct kvc_client *c, struct counters *k, struct result *r, bool prefix)
{
	char names[64][128];
	const char *keys[64];
	uint8_t present[64];

	for (int i = 0; i < 64; i++) {
		make_key(names[i], sizeof(names[i]), prefix ? "prefix" : "batch", 0, (uint64_t) i);
		keys[i] = names[i];
		check(kvc_put(c, keys[i], "kv", 2, NULL), "put");
	}
	*r = (struct result) { .op = prefix ? "prefix64" : "batch64", .keys_per_op = 64 };
	if (prefix)
		TIMED_LOOP(r, k, if (kvc_prefix_lookup(c, keys, 64) != 64) die(0, "%s", "prefix miss"));
	else
		TIMED_LOOP(r, k, if (kvc_batch_exists(c, keys, 64, present) != 64) die(0, "%s", "miss"));
	for (int i = 0; i < 64; i++)
		kvc_remove_force(c, keys[i]);
}

/* The fast path: every op and size against the same run's memcpy, and
 * (--peers) against memcached and Redis. */
int run_local(void)
{
	struct result res[64], peer_res[2][64];
	size_t n_res = 0, n_peer[2] = { 0, 0 };
	char sock[200];
	double prefault_s = 0;
	struct kvc_client *c;
	struct counters k;
	uint64_t max_size = 0;
	uint8_t *src, *dst;
	struct kvc_status *st;
	int r;

	for (size_t i = 0; i < n_sizes; i++)
		if (arg_sizes[i] > max_size)
			max_size = arg_sizes[i];
	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	src = malloc(max_size + 4096);
	dst = malloc(max_size + 4096);
	if (!lat || !src || !dst)
		die(0, "%s", "out of memory");
	for (uint64_t i = 0; i < max_size; i++)
		src[i] = (uint8_t) (i * 131 + (i >> 12));
	memset(dst, 0, max_size);

	bench_setup();
	if (arg_socket)
		snprintf(sock, sizeof(sock), "%s", arg_socket);
	else { /* no leases: each cell removes what it read before the next */
		start_daemon(sock, sizeof(sock), "2GiB", "0");
		/* a daemon that has run a while: its prefault (a low-priority
		 * thread, on these same CPUs) is not measured with the cells */
		prefault_s = wait_prefault(sock);
	}
	r = kvc_connect(sock, &c);
	if (r < 0)
		die(r, "cannot reach kvcached at %s", sock);
	check(kvc_status_get(c, &st), "status");
	counters_init(&k, (pid_t) st->pid);
	/* a daemon someone runs: what an earlier, interrupted run left, and
	 * leases (each cell removes what it read with force before the next) */
	if (arg_socket && kvc_remove_prefix(c, "bench/", KVC_REMOVE_FORCE, NULL) < 0)
		die(0, "%s", "cannot clear the bench's keys of an earlier run");
	if (!arg_json) {
		printf("kvcache-bench local: kvcached %s (pid %u), dram %.1f GiB, %s pages, "
		       "%.1f s per cell, one client thread\n",
		       st->version, st->pid, (double) st->tiers[0].capacity / (1 << 30),
		       st->hugepages ? "2 MiB" : "4 KiB", arg_duration);
		if (!arg_socket) {
			printf("(the daemon faulted its tiers in first, which took %.1f s)\n",
			       prefault_s);
		} else {
			struct kvc_segment seg[8];
			int n = kvc_segments(c, seg, 8);
			uint64_t total = 0, done = counter(c, "prefaulted_bytes");

			for (int i = 0; i < n; i++)
				total += seg[i].len;
			/* 0: --prefault off, or not begun; a just-started daemon
			 * gives clients millisecond tails meanwhile */
			if (done && done < total)
				printf("(the daemon is still faulting its tiers in, %.1f of %.1f GiB: "
				       "figures include that; docs/performance.rst)\n",
				       (double) done / (1 << 30), (double) total / (1 << 30));
		}
		printf("sys/op c|d: system calls per operation in the bench | in the server%s\n",
		       k.self < 0 ? " (n/a: no raw_syscalls tracepoint)" : "");
		print_header();
	}
	kvc_status_free(st);

	if (want_op("exists")) {
		bench_exists(c, &k, &res[n_res]);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}
	for (size_t s = 0; s < n_sizes; s++) {
		uint64_t size = arg_sizes[s];
		static const char *const sized[] = { "get", "put", "acquire" };

		for (size_t o = 0; o < 3; o++) {
			struct result *x = &res[n_res];

			if (!want_op(sized[o]))
				continue;
			if (o == 1)
				bench_put(c, &k, x, size, src);
			else
				bench_get(c, &k, x, size, src, dst, o == 2);
			if (!arg_json)
				print_result(x);
			n_res++;
		}
	}
	if (want_op("prefix64")) {
		bench_keys(c, &k, &res[n_res], true);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}
	if (want_op("batch64")) {
		bench_keys(c, &k, &res[n_res], false);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}

	if (arg_peers) {
		struct peer peers[2] = { { .name = "memcached", .fd = -1 }, { .name = "redis", .fd = -1 } };
		peer_fn fns[2] = { mc_op, redis_op };
		bool up[2];
		char mem[32];

		chmod(tmpdir, 0777); /* memcached drops root for nobody */
		snprintf(peers[0].sock, sizeof(peers[0].sock), "%s/memcached.sock", tmpdir);
		snprintf(peers[1].sock, sizeof(peers[1].sock), "%s/redis.sock", tmpdir);
		snprintf(mem, sizeof(mem), "%" PRIu64, (max_size * 80 >> 20) + 256);
		up[0] = peer_start(&peers[0], (char *[]) { "memcached", "-s", peers[0].sock, "-a", "0777",
							  "-m", mem, "-I", "64m", "-t", "1", "-U", "0",
							  "-u", "nobody", NULL });
		up[1] = peer_start(&peers[1], (char *[]) { "redis-server", "--port", "0", "--unixsocket",
							  peers[1].sock, "--unixsocketperm", "700",
							  "--save", "", "--appendonly", "no",
							  "--proto-max-bulk-len", "512mb", NULL });
		if (!arg_json)
			printf("\npeers over Unix sockets, same workload, same run:\n");
		for (int p = 0; p < 2; p++) {
			struct counters pk;

			if (!up[p]) {
				if (!arg_json)
					printf("%s: not installed or did not start; skipped\n", peers[p].name);
				continue;
			}
			counters_init(&pk, peers[p].pid);
			if (!arg_json) {
				printf("%s (pid %d)\n", peers[p].name, (int) peers[p].pid);
				print_header();
			}
			for (int op = 0; op < 3; op++) {
				static const char *const names[] = { "put", "get", "exists" };

				if (!want_op(names[op]))
					continue;
				for (size_t s = 0; s < (op == 2 ? 1 : n_sizes); s++) {
					struct result *x = &peer_res[p][n_peer[p]++];

					bench_peer(&peers[p], fns[p], op == 0 ? P_PUT : op == 1 ? P_GET : P_EXISTS,
						   arg_sizes[s], src, dst, &pk, x);
					if (!arg_json)
						print_result(x);
				}
			}
			counters_done(&pk);
			peer_stop(&peers[p]);
		}
		if (!arg_json) {
			printf("\nspeed-up of kvcache (p50 latency ratio, throughput ratio):\n");
			printf("%-9s %5s %22s %22s\n", "op", "size", "vs memcached", "vs redis");
			for (size_t i = 0; i < n_res; i++) {
				char sz[32], cells[2][32];

				if (strcmp(res[i].op, "put") && strcmp(res[i].op, "get") &&
				    strcmp(res[i].op, "exists"))
					continue;
				for (int p = 0; p < 2; p++) {
					snprintf(cells[p], sizeof(cells[p]), "-");
					for (size_t j = 0; j < n_peer[p]; j++)
						if (!strcmp(peer_res[p][j].op, res[i].op) &&
						    peer_res[p][j].size == res[i].size)
							snprintf(cells[p], sizeof(cells[p]), "%6.1fx p50 %6.1fx ops",
								 peer_res[p][j].p50 / res[i].p50,
								 ops_s(&res[i]) / ops_s(&peer_res[p][j]));
				}
				size_name(sz, sizeof(sz), res[i].size);
				printf("%-9s %5s %22s %22s\n", res[i].op, sz, cells[0], cells[1]);
			}
		}
	}

	if (arg_json) {
		printf("{\n  \"version\": \"%s\",\n  \"duration_s\": %.2f,\n  \"results\": [\n", KVC_VERSION,
		       arg_duration);
		for (size_t i = 0; i < n_res; i++)
			json_result(stdout, &res[i], "kvcache", i + 1 < n_res || n_peer[0] || n_peer[1]);
		for (int p = 0; p < 2; p++)
			for (size_t i = 0; i < n_peer[p]; i++)
				json_result(stdout, &peer_res[p][i], p ? "redis" : "memcached",
					    i + 1 < n_peer[p] || (p == 0 && n_peer[1]));
		printf("  ]\n}\n");
	}
	if (arg_plot) {
		static struct plot chart;

		plot_results(&chart, res, n_res, "kvcache", false);
		plot_results(&chart, peer_res[0], n_peer[0], "memcached", true);
		plot_results(&chart, peer_res[1], n_peer[1], "redis", true);
		plot_finish(&chart, "kvcache-bench local");
	}
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	free(src);
	free(dst);
	free(lat);
	return 0;
}
