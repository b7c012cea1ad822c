/* SPDX-License-Identifier: MIT */
/* kvcache-bench local --objects/--fill-disk/--pinned/--leased, burst, recovery. */
#include "bench.h"

/* ---- pressure: many objects, pins, leases, a full disk tier, bursts ---- */


static void remove_dir(const char *dir)
{
	char cmd[400];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "kvcache-bench: could not remove %s\n", dir);
}

/* A second client doing exists in a loop: the longest answer it saw is the
 * longest the daemon's loop stopped serving. */
struct prober {
	pthread_t thread;
	const char *sock;
	volatile bool stop;
	uint64_t n, max_ns, over_1ms;
};

static void *prober_main(void *arg)
{
	struct prober *p = arg;
	struct kvc_client *c;

	if (kvc_connect(p->sock, &c) < 0)
		return NULL;
	kvc_put(c, "probe", "x", 1, NULL);
	while (!p->stop) {
		uint64_t a = now_ns(), d;

		kvc_exists(c, "probe");
		d = now_ns() - a;
		p->n++;
		if (d > p->max_ns)
			p->max_ns = d;
		p->over_1ms += d > 1000000;
		usleep(50); /* a client that pauses, as engines do */
	}
	kvc_disconnect(c);
	return NULL;
}

static void prober_start(struct prober *p, const char *sock)
{
	*p = (struct prober) { .sock = sock };
	if (pthread_create(&p->thread, NULL, prober_main, p) != 0)
		die(0, "%s", "cannot start the prober thread");
}

static void prober_stop(struct prober *p)
{
	p->stop = true;
	pthread_join(p->thread, NULL);
}

/* Put objects [from, to) of 1 KiB; returns puts/s. */
static double fill_small(struct kvc_client *c, const char *ns, uint64_t from, uint64_t to,
			 const struct kvc_put_opts *o)
{
	static uint8_t v[1024];
	uint64_t t0 = now_ns();
	char key[96];

	memset(v, 0x33, sizeof(v));
	for (uint64_t i = from; i < to; i++) {
		int r;

		snprintf(key, sizeof(key), "%s/%" PRIu64, ns, i);
		r = kvc_put(c, key, v, sizeof(v), o);
		if (r < 0 && r != -EEXIST)
			die(r, "put %s (%s)", key, kvc_last_error_msg());
	}
	return (double) (to - from) / ((double) (now_ns() - t0) / 1e9);
}

static void print_cell(const char *what, const struct result *r)
{
	printf("  %-34s p50 %7.2f us  p99 %8.2f us  p999 %8.2f us  %9.0f ops/s\n", what, r->p50,
	       r->p99, r->p999, ops_s(r));
}

static void measure_small(struct kvc_client *c, struct counters *k, const char *label,
			  struct result *ex, struct result *get)
{
	static uint8_t v[4096], out[4096];
	char text[80];

	check(kvc_put(c, "bench/small", v, sizeof(v), &(struct kvc_put_opts) {
		.flags = KVC_PUT_REPLACE }), "put");
	*ex = (struct result) { .op = "exists" };
	TIMED_LOOP(ex, k, if (kvc_exists(c, "bench/small") != 1) die(0, "%s", "exists missed"));
	*get = (struct result) { .op = "get", .size = 4096 };
	TIMED_LOOP(get, k, if (kvc_get(c, "bench/small", out, sizeof(out)) != 4096)
		die(0, "%s", "get missed"));
	snprintf(text, sizeof(text), "exists, %s", label);
	print_cell(text, ex);
	snprintf(text, sizeof(text), "4 KiB get, %s", label);
	print_cell(text, get);
}

/* --objects N [--fill-disk]: the fast path at 1K objects and at N, the
 * longest stall while N are stored, with a disk tier in steady state. */
int run_objects(void)
{
	uint64_t n = arg_objects ? arg_objects : 1000000;
	struct result ex1, get1, exn, getn;
	struct prober pr;
	struct kvc_client *c;
	struct counters k;
	struct kvc_status *st;
	char sock[200], disk[300];
	double rate;

	bench_setup();
	if (arg_fill_disk) {
		const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk, "--disk-size",
					"64GiB", "--default-kv-lease-ttl", "0", NULL };

		snprintf(disk, sizeof(disk), "%s/bench-disk-XXXXXX", arg_dir ? arg_dir : "/var/tmp");
		if (!mkdtemp(disk))
			die(0, "cannot make %s", disk);
		start_daemon_args(sock, sizeof(sock), extra);
	} else
		start_daemon(sock, sizeof(sock), "4GiB", "0");
	check(kvc_connect(sock, &c), "connect");
	check(kvc_status_get(c, &st), "status");
	counters_init(&k, (pid_t) st->pid);
	kvc_status_free(st);
	printf("kvcache-bench local --objects %" PRIu64 "%s: values of 1 KiB, %.1f s per cell\n", n,
	       arg_fill_disk ? " --fill-disk (64 MiB dram, the rest on disk)" : "", arg_duration);
	fill_small(c, "obj", 0, 1000, NULL);
	measure_small(c, &k, "1K objects", &ex1, &get1);
	prober_start(&pr, sock);
	rate = fill_small(c, "obj", 1000, n, NULL);
	if (arg_fill_disk)
		check(kvc_flush(c, -1), "flush"); /* steady state: everything has a record */
	usleep(200000);
	prober_stop(&pr);
	printf("  stored %" PRIu64 " objects at %.0f puts/s; longest loop turn %.2f ms unpreempted "
	       "(%.2f ms wall clock, preemption included), the loop slept while working %" PRIu64
	       " time(s); a second client's exists meanwhile: longest %.2f ms, %" PRIu64 " of %"
	       PRIu64 " over 1 ms\n", n, rate,
	       (double) counter(c, "loop_longest_busy_us") / 1e3,
	       (double) counter(c, "loop_longest_turn_us") / 1e3, counter(c, "loop_blocked"),
	       (double) pr.max_ns / 1e6, pr.over_1ms, pr.n);
	measure_small(c, &k, "", &exn, &getn);
	printf("  at %" PRIu64 " objects against 1K: exists p50 %.0f%% of the 1K rate, 4 KiB get "
	       "p50 %.0f%%\n", n, 100.0 * ex1.p50 / exn.p50, 100.0 * get1.p50 / getn.p50);
	if (arg_fill_disk)
		printf("  disk records %" PRIu64 ", dram objects %" PRIu64 "\n",
		       counter(c, "disk.records"), counter(c, "dram.objects"));
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	if (arg_fill_disk)
		remove_dir(disk);
	rmdir(tmpdir);
	return 0;
}

/* Puts of 1 KiB into a full pool, each evicting: rate and tail, after
 * `pinned` hard-pinned objects were stored first (the LRU's old end). */
static void evicting_puts(uint64_t pinned, struct result *r)
{
	struct kvc_put_opts hard = { .flags = KVC_PUT_HARD_PIN };
	static uint8_t v[1024];
	struct kvc_client *c;
	struct counters k;
	char sock[200], key[96];
	uint64_t pool;

	start_daemon(sock, sizeof(sock), "128MiB", "0");
	check(kvc_connect(sock, &c), "connect");
	counters_init(&k, daemon_pid);
	fill_small(c, "pin", 0, pinned, &hard);
	pool = pool_capacity(c) / 1024;
	fill_small(c, "fill", 0, 2 * pool, NULL); /* full, and evicting */
	*r = (struct result) { .op = "put" };
	TIMED_LOOP(r, &k, {
		snprintf(key, sizeof(key), "churn/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
	});
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
}

/* --pinned N: puts under eviction with N hard pins, against none. */
int run_pinned(void)
{
	struct result a, b;
	char text[80];

	bench_setup();
	printf("kvcache-bench local --pinned %" PRIu64 ": 1 KiB puts into a full 128 MiB pool, "
	       "each evicting, %.1f s per cell\n", arg_pinned, arg_duration);
	evicting_puts(0, &a);
	print_cell("put under eviction, no pins", &a);
	evicting_puts(arg_pinned, &b);
	snprintf(text, sizeof(text), "put under eviction, %" PRIu64 " pins", arg_pinned);
	print_cell(text, &b);
	printf("  with pins: %.0f%% of the unpinned rate\n", 100.0 * ops_s(&b) / ops_s(&a));
	rmdir(tmpdir);
	return 0;
}

/* --leased: everything in the pool leased; puts must fail fast. */
int run_leased(void)
{
	static uint8_t v[1024];
	struct kvc_client *c;
	struct counters k;
	struct result r, ok;
	char sock[200], key[96];
	uint64_t pool, enospc = 0, dropped = 0;

	bench_setup();
	start_daemon(sock, sizeof(sock), "16MiB", "600000");
	check(kvc_connect(sock, &c), "connect");
	counters_init(&k, daemon_pid);
	pool = pool_capacity(c) / 1024;
	printf("kvcache-bench local --leased: 16 MiB pool, 1 KiB objects, leases of 600 s\n");
	ok = (struct result) { .op = "put" };
	TIMED_LOOP(&ok, &k, {
		snprintf(key, sizeof(key), "fresh/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
		kvc_remove(c, key);
	});
	print_cell("put, pool not full", &ok);
	for (uint64_t i = 0; i < 2 * pool; i++) {
		int e;

		snprintf(key, sizeof(key), "leased/%" PRIu64, i);
		e = kvc_put(c, key, v, sizeof(v), NULL);
		if (e == -ENOSPC)
			break;
		check(e, "put");
		e = kvc_exists(c, key); /* leased */
		check(e, "exists");
		dropped += e == 0; /* gone right after its put returned 0 */
	}
	if (dropped)
		printf("  %" PRIu64 " objects were gone right after their put returned 0\n", dropped);
	r = (struct result) { .op = "put" };
	TIMED_LOOP(&r, &k, {
		snprintf(key, sizeof(key), "refused/%" PRIu64, i);
		enospc += kvc_put(c, key, v, sizeof(v), NULL) == -ENOSPC;
	});
	print_cell("put, everything leased (-ENOSPC)", &r);
	printf("  %" PRIu64 " of the attempts answered -ENOSPC\n", enospc);
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	return 0;
}

/* burst: 300 x 1 MiB put back to back into 64 MiB over a disk tier. */
int run_burst(void)
{
	enum { N = 300, LEN = 1 << 20 };
	const char *dir = arg_dir ? arg_dir : "/var/tmp";
	char sock[200], disk[300], key[64];
	uint8_t *v = malloc(LEN), *out = malloc(LEN);
	struct kvc_client *c;
	uint64_t t0, lost = 0, t_put;

	bench_setup();
	snprintf(disk, sizeof(disk), "%s/bench-burst-XXXXXX", dir);
	if (!v || !out || !mkdtemp(disk))
		die(0, "%s", "cannot set up");
	{
		const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk,
					"--default-kv-lease-ttl", "0", "--hugepages", "off", NULL };

		start_daemon_args(sock, sizeof(sock), extra);
	}
	check(kvc_connect(sock, &c), "connect");
	memset(v, 0x77, LEN);
	t0 = now_ns();
	for (int i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "burst/%d", i);
		check(kvc_put(c, key, v, LEN, NULL), "put");
	}
	t_put = now_ns() - t0;
	for (int i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "burst/%d", i);
		lost += kvc_get(c, key, out, LEN) != LEN || memcmp(out, v, LEN) != 0;
	}
	printf("kvcache-bench burst: %d x 1 MiB put back to back into 64 MiB dram over a disk tier "
	       "in %s\n", N, dir);
	printf("  puts took %.0f ms (%.2f GB/s); %" PRIu64 " waited for a spill; %" PRIu64
	       " of %d lost; dram evictions %" PRIu64 "\n", (double) t_put / 1e6,
	       (double) N * LEN / (double) t_put, counter(c, "spill_waits"), lost, N,
	       counter(c, "dram.evictions"));
	kvc_disconnect(c);
	stop_daemon();
	remove_dir(disk);
	rmdir(tmpdir);
	free(v);
	free(out);
	return 0;
}

/* recovery: a restart over N records of 4 KiB; how soon it answers, how
 * long until every record is indexed. */
int run_recovery(void)
{
	uint64_t n = arg_objects ? arg_objects : 100000;
	const char *dir = arg_dir ? arg_dir : "/var/tmp";
	char sock[200], disk[300];
	static uint8_t v[4096];
	const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk, "--disk-size", "8GiB",
				"--default-kv-lease-ttl", "0", NULL };
	struct kvc_client *c;
	uint64_t t0, t_answer, t_done;

	bench_setup();
	snprintf(disk, sizeof(disk), "%s/bench-recovery-XXXXXX", dir);
	if (!mkdtemp(disk))
		die(0, "%s", "cannot set up");
	start_daemon_args(sock, sizeof(sock), extra);
	check(kvc_connect(sock, &c), "connect");
	for (uint64_t i = 0; i < n; i++) {
		char key[64];

		snprintf(key, sizeof(key), "rec/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
	}
	check(kvc_flush(c, -1), "flush");
	kvc_disconnect(c);
	stop_daemon();

	t0 = now_ns();
	start_daemon_args(sock, sizeof(sock), extra); /* returns once it answers */
	t_answer = now_ns() - t0;
	check(kvc_connect(sock, &c), "connect");
	for (;;) {
		struct kvc_status *st;
		bool done;

		check(kvc_status_get(c, &st), "status");
		done = !st->recovering;
		kvc_status_free(st);
		if (done)
			break;
		usleep(1000);
	}
	t_done = now_ns() - t0;
	printf("kvcache-bench recovery: restart over %" PRIu64 " records of 4 KiB in %s\n", n, dir);
	printf("  first answer after %.0f ms; every record indexed after %.0f ms (%.0f records/s); "
	       "%" PRIu64 " objects\n", (double) t_answer / 1e6, (double) t_done / 1e6,
	       (double) n / ((double) t_done / 1e9), counter(c, "disk.records"));
	kvc_disconnect(c);
	stop_daemon();
	remove_dir(disk);
	rmdir(tmpdir);
	return 0;
}

/*
 * hangup: clients that registered a large buffer, had the daemon copy into
 * every page of it, and went away.  Tearing down such a mapping costs the
 * kernel time in proportion to its pages; the prober shows whether other
 * clients waited for it.
 */
int run_hangup(uint64_t size)
{
	const uint64_t piece = 16 << 20;
	uint64_t t_gone = 0, pages;
	struct kvc_client *c;
	struct prober pr;
	struct kvc_status *st;
	uint8_t *v;
	char sock[200];
	bool huge;

	size = (size + piece - 1) / piece * piece;
	bench_setup();
	start_daemon(sock, sizeof(sock), "256MiB", "0");
	check(kvc_connect(sock, &c), "connect");
	check(kvc_status_get(c, &st), "status");
	huge = st->hugepages;
	kvc_status_free(st);
	v = malloc(piece);
	if (!v)
		die(0, "%s", "out of memory");
	memset(v, 0x5a, piece);
	check(kvc_put(c, "hangup/piece", v, piece, NULL), "put");
	prober_start(&pr, sock);
	for (unsigned r = 0; r < arg_rounds; r++) {
		struct kvc_client *h;
		struct kvc_buffer b;
		uint64_t t0;

		check(kvc_connect(sock, &h), "connect");
		check(kvc_buffer_alloc(h, size, &b), "buffer_alloc");
		for (uint64_t off = 0; off < size; off += piece)
			if (kvc_get_into(h, "hangup/piece", &b, off, piece) != (ssize_t) piece)
				die(0, "get_into at %" PRIu64 " (%s)", off, kvc_last_error_msg());
		if (memcmp((uint8_t *) b.data + size - piece, v, piece) != 0)
			die(0, "%s", "get_into: wrong bytes");
		t0 = now_ns();
		kvc_disconnect(h);
		/* gone when the daemon no longer counts its buffer */
		while (counter(c, "registered_bytes") != 0)
			usleep(100);
		t_gone += now_ns() - t0;
	}
	usleep(200000);
	prober_stop(&pr);
	pages = size / (huge ? 2 << 20 : 4096);
	printf("kvcache-bench hangup: %u clients, each with a %.2f GiB registered buffer (%" PRIu64
	       " pages of %s) the daemon copied into, hung up one after another\n",
	       arg_rounds, (double) size / (1 << 30), pages, huge ? "2 MiB" : "4 KiB");
	printf("  a second client's exists meanwhile: longest %.2f ms, %" PRIu64 " of %" PRIu64
	       " over 1 ms; longest loop turn %.2f ms unpreempted (%.2f ms wall clock), the loop "
	       "slept while working %" PRIu64 " time(s); %.2f ms from hang-up to buffer gone "
	       "(mean)\n",
	       (double) pr.max_ns / 1e6, pr.over_1ms, pr.n,
	       (double) counter(c, "loop_longest_busy_us") / 1e3,
	       (double) counter(c, "loop_longest_turn_us") / 1e3, counter(c, "loop_blocked"),
	       (double) t_gone / arg_rounds / 1e6);
	free(v);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	return 0;
}
