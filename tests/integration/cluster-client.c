/* SPDX-License-Identifier: MIT */
/*
 * The batch and registered-buffer calls across nodes (run by
 * test-cluster.sh batch-across-nodes): values put through node A's daemon
 * are read through node B's with kvc_batch_get, kvc_get_into and
 * kvc_batch_get_into, several fetches in flight at once, every byte
 * checked.  Usage: cluster-client A_SOCKET B_SOCKET
 *
 * cluster-client A_SOCKET B_SOCKET lookups: batches of 64 keys that only A
 * holds, asked from B with kvc_prefix_lookup and kvc_batch_exists, each
 * batch answered by one directory question and then from what B
 * remembers: every key is found, every time.
 *
 * cluster-client A_SOCKET B_SOCKET put-burst: 6000 values of 64 KiB put
 * through A, 500 a request.
 *
 * cluster-client A_SOCKET B_SOCKET put-many | put-batched | find-many: MANY
 * keys put through A (one a request, or 500 a request); then, asked from B,
 * all of them held somewhere (within 10 s: the directory hears of them in
 * batches).  get-many-async, exists-many-async: all of them read, or
 * looked for, from B, 1024 at once.  push-apis: every put that names
 * push_to pushes (push_apis()); push-many: many pushes at once.
 *
 * cluster-client A_SOCKET B_SOCKET put-in-flight: lookups from B of keys
 * whose put through A is in progress (reserved, or announced) wait for it:
 * found once it commits, missed once it is aborted or when B's
 * --lookup-wait-ms passes first (put_in_flight()).
 *
 * cluster-client B_SOCKET B_SOCKET get-many-stalled: with the holder of
 * put-many's keys stopped, 1024 of them asked for from B at once (four
 * clients, 256 each, asynchronously): none is read, and every one ends;
 * prints how long the last took (the test holds it to B's
 * --remote-timeout-ms).
 *
 * cluster-client A_SOCKET B_SOCKET get-streamed: values of 8 MiB put
 * through A, each read from B with kvc_get, which copies behind the bytes
 * as they land (get_streamed()): every byte right, each get told where its
 * value lands (gets_streamed); a buffer too small gets -ENOBUFS and keeps
 * its bytes.  Run against a holder that cuts answers short with junk
 * (KVCACHE_TEST_CUT_PEER_SEND), the same holds: what was copied before
 * the bytes started over is not kept.  Every other get is kvc_get_alloc's,
 * whose buffer is asked for once, at the value's length; refused, the get
 * fails with -ENOMEM; a miss asks for none.  get-streamed-plain: the gets
 * alone, once A has written the values through to its shared tier.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "clock.h"
#include "helpers.h"

#define N 12
#define LEN (200u * 1024 + 3)
#define LEN2 (300u * 1024 + 5)

static void fill(uint8_t *p, size_t len, int k)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t) (i * 31 + (size_t) k * 7);
}

static int same(const uint8_t *p, size_t len, int k)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != (uint8_t) (i * 31 + (size_t) k * 7))
			return 0;
	return 1;
}

static int lookups(struct kvc_client *a, struct kvc_client *b)
{
	/* these names put keys that share a slot of a direct-mapped cache of
	 * 65536 answers into one batch (keys 64..127): the defect this found */
	enum { KEYS = 1280, BATCH = 64 };
	static char names[KEYS][32];
	const char *keys[BATCH];
	uint8_t present[BATCH], x = 1;
	char **nodes;
	size_t nn;
	int tries;

	for (int i = 0; i < KEYS; i++) {
		snprintf(names[i], sizeof(names[i]), "lk-p/%d", i);
		CHECK_EQ(kvc_put(a, names[i], &x, 1, NULL), 0);
	}
	/* the directory hears of commits in batches, in order */
	for (tries = 0; tries < 400 && kvc_where(b, names[KEYS - 1], &nodes, &nn) != 0; tries++)
		usleep(50000);
	CHECK(tries < 400);
	kvc_where_free(nodes);
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < KEYS; i += BATCH) {
			for (int k = 0; k < BATCH; k++)
				keys[k] = names[i + k];
			/* even batches: prefix first; odd ones: batch_exists first */
			if ((i / BATCH) % 2 == 0) {
				CHECK_EQ(kvc_prefix_lookup(b, keys, BATCH), BATCH);
				CHECK_EQ(kvc_batch_exists(b, keys, BATCH, present), BATCH);
			} else {
				CHECK_EQ(kvc_batch_exists(b, keys, BATCH, present), BATCH);
				CHECK_EQ(kvc_prefix_lookup(b, keys, BATCH), BATCH);
			}
		}
	printf("%d keys in batches of %d found from the other node, twice\n", KEYS, BATCH);
	return 0;
}

#define MANY 3000

static int put_many(struct kvc_client *a)
{
	uint8_t x = 7;

	for (int i = 0; i < MANY; i++) {
		char key[32];

		snprintf(key, sizeof(key), "many/%d", i);
		CHECK_EQ(kvc_put(a, key, &x, 1, NULL), 0);
	}
	return 0;
}

/* BURST values of 64 KiB put through A 500 a request, as a prefill stores
 * a prompt's per-layer objects: A queues every one for its checksum taken
 * ahead (test-cluster.sh sums-ahead) */
#define BURST 6000

static int put_burst(struct kvc_client *a)
{
	enum { AT_ONCE = 500, LEN64 = 64 << 10 };
	static char names[AT_ONCE][32];
	const char *keys[AT_ONCE];
	struct kvc_iovec io[AT_ONCE];
	const struct kvc_iovec *iop[AT_ONCE];
	size_t n_iov[AT_ONCE];
	int res[AT_ONCE];
	uint8_t *v = malloc((size_t) AT_ONCE * LEN64);

	CHECK(v);
	for (int i = 0; i < BURST; i += AT_ONCE) {
		for (int k = 0; k < AT_ONCE; k++) {
			snprintf(names[k], sizeof(names[k]), "burst/%d", i + k);
			keys[k] = names[k];
			io[k] = (struct kvc_iovec) { v + (size_t) k * LEN64, LEN64 };
			fill(io[k].base, LEN64, i + k);
			iop[k] = &io[k];
			n_iov[k] = 1;
		}
		CHECK_EQ(kvc_batch_put(a, AT_ONCE, keys, iop, n_iov, NULL, res), AT_ONCE);
		for (int k = 0; k < AT_ONCE; k++)
			CHECK_EQ(res[k], 0);
	}
	free(v);
	return 0;
}

/* the same keys, 500 a request: a loop turn commits hundreds at once */
static int put_batched(struct kvc_client *a)
{
	static char names[MANY][32];
	const char *keys[500];
	struct kvc_iovec io = { .base = (uint8_t[]){ 7 }, .len = 1 };
	const struct kvc_iovec *iop[500];
	size_t n_iov[500];
	int res[500];

	for (int i = 0; i < MANY; i += 500) {
		for (int k = 0; k < 500; k++) {
			snprintf(names[i + k], sizeof(names[i + k]), "many/%d", i + k);
			keys[k] = names[i + k];
			iop[k] = &io;
			n_iov[k] = 1;
		}
		CHECK_EQ(kvc_batch_put(a, 500, keys, iop, n_iov, NULL, res), 500);
	}
	return 0;
}

/* MANY keys read from B at once by four clients, 256 asynchronous gets
 * each: more than B fetches at a time, so most wait their turn; every one
 * must come (the whole value, 1 byte), none may be a miss.  With exists,
 * asynchronous exists instead: more than B asks the directory at a time;
 * every key must be found. */

static int get_many_stalled(const char *b_sock)
{
	static char names[1024][32];
	struct kvc_client *c[4];
	struct kvc_buffer buf[4];
	struct kvc_completion done[256];
	long long t0, last = 0;
	int read = 0, ended = 0;

	for (int k = 0; k < 4; k++) {
		CHECK_EQ(kvc_connect(b_sock, &c[k]), 0);
		CHECK_EQ(kvc_buffer_alloc(c[k], 4096, &buf[k]), 0);
	}
	t0 = (long long) (mono_us() / USEC_PER_MSEC);
	for (int k = 0; k < 4; k++) {
		struct kvc_op ops[256];

		for (int i = 0; i < 256; i++) {
			snprintf(names[k * 256 + i], sizeof(names[0]), "many/%d", k * 256 + i);
			ops[i] = (struct kvc_op) { .opcode = KVC_OP_GET_INTO, .key = names[k * 256 + i],
						   .buf = &buf[k], .offset = (uint64_t) i, .len = 1,
						   .user_data = (uint64_t) (k * 256 + i) };
		}
		CHECK_EQ(kvc_submit(c[k], ops, 256), 256);
	}
	for (int k = 0; k < 4; k++)
		for (int left = 256; left > 0;) {
			int r = kvc_wait(c[k], done, 1, 256, 60000);

			CHECK(r > 0);
			for (int j = 0; j < r; j++) {
				read += done[j].res == 1;
				ended++;
			}
			left -= r;
			if ((long long) (mono_us() / USEC_PER_MSEC) - t0 > last)
				last = (long long) (mono_us() / USEC_PER_MSEC) - t0;
		}
	for (int k = 0; k < 4; k++) {
		CHECK_EQ(kvc_buffer_free(c[k], &buf[k]), 0);
		kvc_disconnect(c[k]);
	}
	printf("%d of 1024 ended, %d read, the last after %lld ms\n", ended, read, last);
	CHECK_EQ(ended, 1024);
	CHECK_EQ(read, 0);
	return 0;
}

static int get_many_async(const char *b_sock, bool exists)
{
	static char names[MANY][32];
	struct kvc_client *c[4];
	struct kvc_buffer buf[4];
	struct kvc_completion done[256];
	int got = 0;

	for (int i = 0; i < MANY; i++)
		snprintf(names[i], sizeof(names[i]), "many/%d", i);
	for (int k = 0; k < 4; k++) {
		CHECK_EQ(kvc_connect(b_sock, &c[k]), 0);
		CHECK_EQ(kvc_buffer_alloc(c[k], 4096, &buf[k]), 0);
	}
	for (int base = 0; base < MANY; base += 4 * 256) {
		int sent[4] = { 0 };

		for (int k = 0; k < 4; k++) {
			struct kvc_op ops[256];
			int n = 0;

			for (int i = base + k * 256; i < base + (k + 1) * 256 && i < MANY; i++)
				ops[n++] = (struct kvc_op) { .opcode = exists ? KVC_OP_EXISTS
									      : KVC_OP_GET_INTO,
							     .key = names[i],
							     .buf = &buf[k], .offset = (uint64_t) (i % 4096),
							     .len = 1, .user_data = (uint64_t) i };
			if (n)
				CHECK_EQ(kvc_submit(c[k], ops, (size_t) n), n);
			sent[k] = n;
		}
		for (int k = 0; k < 4; k++)
			for (int left = sent[k]; left > 0;) {
				int r = kvc_wait(c[k], done, 1, 256, 20000);

				CHECK(r > 0);
				for (int j = 0; j < r; j++) {
					if (done[j].res != 1)
						fprintf(stderr, "%s: %lld\n", names[done[j].user_data],
							(long long) done[j].res);
					got += done[j].res == 1;
				}
				left -= r;
			}
	}
	for (int k = 0; k < 4; k++) {
		CHECK_EQ(kvc_buffer_free(c[k], &buf[k]), 0);
		kvc_disconnect(c[k]);
	}
	printf("%d of %d keys %s from the other node, up to 1024 at once\n", got, MANY,
	       exists ? "found" : "read");
	return got == MANY ? 0 : 1;
}

static int find_many(struct kvc_client *b)
{
	static char names[MANY][32];
	const char *keys[64];
	uint8_t present[64];
	int found = 0;

	for (int i = 0; i < MANY; i++)
		snprintf(names[i], sizeof(names[i]), "many/%d", i);
	for (int tries = 0; tries < 100; tries++) {
		found = 0;
		for (int i = 0; i < MANY; i += 64) {
			int n = MANY - i < 64 ? MANY - i : 64, r;

			for (int k = 0; k < n; k++)
				keys[k] = names[i + k];
			r = kvc_batch_exists(b, keys, (size_t) n, present);
			CHECK(r >= 0);
			found += r;
		}
		if (found == MANY)
			return 0;
		usleep(100000);
	}
	fprintf(stderr, "%d of %d keys found from the other node\n", found, MANY);
	return 1;
}

/* A pushed copy, once it has landed on b (at most 10 s): its length, or
 * the last error. */
static ssize_t get_pushed(struct kvc_client *b, const char *key, uint8_t *buf, size_t cap)
{
	ssize_t n = -1;

	for (int tries = 0; tries < 200; tries++) {
		n = kvc_get(b, key, buf, cap);
		if (n >= 0)
			break;
		usleep(50000);
	}
	return n;
}

/* Every put that can name push_to does push: kvc_put, kvc_batch_put,
 * kvc_put_from (small: copied by the loop; large: by the copier),
 * kvc_batch_put_from, an asynchronous PUT_FROM; B then holds each, byte
 * for byte, without fetching it.  A node that is not up: the put stands,
 * the answer is -EHOSTUNREACH.  old: the daemon pushes only when asked
 * apart (the library asks after the put; an asynchronous put cannot). */
static int push_apis(struct kvc_client *a, struct kvc_client *b, bool old)
{
	static const char *const names[] = { "p-put", "p-batch-0", "p-batch-1", "p-from",
					     "p-from-big", "p-bfrom-0", "p-bfrom-1", "p-async" };
	enum { K = sizeof(names) / sizeof(names[0]) };
	const size_t lens[K] = { 5000, 3000, 70000, 4000, 3u << 20, 100, 200000, 9000 };
	struct kvc_put_opts o = { .push_to = "B" }, bad = { .push_to = "nowhere" };
	struct kvc_buffer buf;
	uint8_t *v = malloc(3u << 20), *got = malloc(3u << 20);
	size_t off[K], at = 0;
	int k;

	CHECK(v && got);
	CHECK_EQ(kvc_buffer_alloc(a, 4u << 20, &buf), 0);
	for (k = 0; k < K; k++) {
		off[k] = at;
		if (k >= 3) { /* from the registered buffer */
			fill((uint8_t *) buf.data + at, lens[k], k);
			at += lens[k];
		}
	}
	fill(v, lens[0], 0);
	CHECK_EQ(kvc_put(a, names[0], v, lens[0], &o), 0);
	{
		uint8_t *p1 = malloc(lens[1]), *p2 = malloc(lens[2]);
		struct kvc_iovec io[2] = { { p1, lens[1] }, { p2, lens[2] } };
		const struct kvc_iovec *iop[2] = { &io[0], &io[1] };
		size_t n_iov[2] = { 1, 1 };
		int res[2];

		CHECK(p1 && p2);
		fill(p1, lens[1], 1);
		fill(p2, lens[2], 2);
		CHECK_EQ(kvc_batch_put(a, 2, names + 1, iop, n_iov, &o, res), 2);
		CHECK_EQ(res[0], 0);
		CHECK_EQ(res[1], 0);
		free(p1);
		free(p2);
	}
	CHECK_EQ(kvc_put_from(a, names[3], &buf, off[3], lens[3], &o), 0);
	CHECK_EQ(kvc_put_from(a, names[4], &buf, off[4], lens[4], &o), 0);
	{
		struct kvc_iov io[2] = { { &buf, off[5], lens[5] }, { &buf, off[6], lens[6] } };
		const struct kvc_iov *iop[2] = { &io[0], &io[1] };
		size_t n_iov[2] = { 1, 1 };
		int res[2];

		CHECK_EQ(kvc_batch_put_from(a, 2, names + 5, iop, n_iov, &o, res), 2);
		CHECK_EQ(res[0], 0);
		CHECK_EQ(res[1], 0);
	}
	{
		struct kvc_op op = { .opcode = KVC_OP_PUT_FROM, .key = names[7], .buf = &buf,
				     .offset = off[7], .len = lens[7], .opts = &o, .user_data = 77 };
		struct kvc_completion cp;

		fill((uint8_t *) buf.data + off[7], lens[7], 7);
		if (old) {
			/* a daemon that cannot push with the put: said at once */
			CHECK_EQ(kvc_submit(a, &op, 1), -EOPNOTSUPP);
			CHECK_EQ(kvc_put_from(a, names[7], &buf, off[7], lens[7], &o), 0);
		} else {
			CHECK_EQ(kvc_submit(a, &op, 1), 1);
			CHECK_EQ(kvc_wait(a, &cp, 1, 1, 10000), 1);
			CHECK_EQ(cp.user_data, 77u);
			CHECK_EQ(cp.res, 0);
		}
	}
	/* B holds each (pushed, not fetched: asked of B alone) */
	kvc_set_get_flags(b, KVC_LOCAL_ONLY);
	for (k = 0; k < K; k++) {
		ssize_t n = get_pushed(b, names[k], got, 3u << 20);

		if (n != (ssize_t) lens[k] || !same(got, lens[k], k)) {
			fprintf(stderr, "%s on B: %zd bytes\n", names[k], n);
			return 1;
		}
	}
	kvc_set_get_flags(b, 0);
	/* a node that is not up: the put stands, the push is refused */
	CHECK_EQ(kvc_put_from(a, "p-nowhere", &buf, 0, 100, &bad), -EHOSTUNREACH);
	CHECK_EQ(kvc_exists(a, "p-nowhere"), 1);
	CHECK_EQ(kvc_put(a, "p-nowhere-2", v, 10, &bad), -EHOSTUNREACH);
	CHECK_EQ(kvc_exists(a, "p-nowhere-2"), 1);
	CHECK_EQ(kvc_buffer_free(a, &buf), 0);
	free(v);
	free(got);
	return 0;
}

/* 64 puts at once through A that push to B, four of whose keys B holds
 * already: many pushes queued together go one after another on a
 * connection (the test checks pushes_ahead); B ends up with every one,
 * and keeps its own four. */
static int push_many(struct kvc_client *a, struct kvc_client *b)
{
	enum { K = 64 };
	static char names[K][32];
	const char *keys[K];
	struct kvc_iovec io[K];
	const struct kvc_iovec *iop[K];
	size_t n_iov[K], len[K];
	struct kvc_put_opts o = { .push_to = "B" };
	uint8_t *got = malloc(200000);
	int res[K], k;

	CHECK(got);
	for (k = 0; k < K; k++) {
		snprintf(names[k], sizeof(names[k]), "pm/%d", k);
		keys[k] = names[k];
		len[k] = 1000 + (size_t) k * 1500;
		io[k] = (struct kvc_iovec) { malloc(len[k]), len[k] };
		CHECK(io[k].base);
		iop[k] = &io[k];
		n_iov[k] = 1;
		if (k % 20 == 3) { /* B's own */
			fill(io[k].base, len[k], k + 1000);
			CHECK_EQ(kvc_put(b, keys[k], io[k].base, len[k], NULL), 0);
		}
		fill(io[k].base, len[k], k);
	}
	CHECK_EQ(kvc_batch_put(a, K, keys, iop, n_iov, &o, res), K);
	kvc_set_get_flags(b, KVC_LOCAL_ONLY);
	for (k = 0; k < K; k++) {
		ssize_t n = get_pushed(b, keys[k], got, 200000);
		int want = k % 20 == 3 ? k + 1000 : k;

		if (n != (ssize_t) len[k] || !same(got, len[k], want)) {
			fprintf(stderr, "%s on B: %zd bytes\n", keys[k], n);
			return 1;
		}
		free(io[k].base);
	}
	free(got);
	return 0;
}

/* A lookup from B on its own connection, while the caller holds A's put. */
struct asker {
	pthread_t t;
	const char *sock;
	const char *keys[3];
	size_t n;
	bool prefix;
	int result;
};

static void *ask(void *u)
{
	struct asker *q = u;
	struct kvc_client *c;
	uint8_t present[3];

	q->result = -1000;
	if (kvc_connect(q->sock, &c) != 0)
		return NULL;
	q->result = q->prefix ? kvc_prefix_lookup(c, q->keys, q->n)
			      : kvc_batch_exists(c, q->keys, q->n, present);
	kvc_disconnect(c);
	return NULL;
}

static void ask_start(struct asker *q)
{
	/* the directory hears of A's put in A's next turn: well before this */
	usleep(300000);
	CHECK_EQ(pthread_create(&q->t, NULL, ask, q), 0);
	usleep(300000); /* B's lookup is waiting by now */
}

static int ask_end(struct asker *q)
{
	CHECK_EQ(pthread_join(q->t, NULL), 0);
	return q->result;
}

#define STREAMED 4
#define STREAMED_LEN ((8u << 20) + 4093)

/* kvc_get_alloc's buffer: the test's, or none (refuse); the calls made. */
struct alloc_rec {
	uint8_t *buf;
	bool refuse;
	unsigned calls;
	size_t len;
};

static void *alloc_rec(void *ctx, size_t len)
{
	struct alloc_rec *a = ctx;

	a->calls++;
	a->len = len;
	return a->refuse || len > STREAMED_LEN ? NULL : a->buf;
}

static int get_streamed(struct kvc_client *a, struct kvc_client *b, bool plain)
{
	uint8_t *v = malloc(STREAMED_LEN), *got = malloc(STREAMED_LEN);
	char names[STREAMED][32];
	const char *keys[STREAMED];
	uint64_t streamed = test_counter(b, "gets_streamed");
	int tries;

	CHECK(v && got);
	for (int i = 0; i < STREAMED; i++) {
		snprintf(names[i], sizeof(names[i]), "streamed-%d", i);
		keys[i] = names[i];
		fill(v, STREAMED_LEN, 40 + i);
		CHECK_EQ(kvc_put(a, keys[i], v, STREAMED_LEN, NULL), 0);
	}
	/* (plain: run with a shared tier A writes through; B asks nothing
	 * before it holds all, or B would remember them missing there) */
	for (tries = 0; plain && tries < 200 && test_counter(a, "shared.writes") < STREAMED; tries++)
		usleep(50000);
	CHECK(tries < 200);
	for (tries = 0; tries < 200; tries++) {
		uint8_t present[STREAMED];

		if (kvc_batch_exists(b, keys, STREAMED, present) == STREAMED)
			break;
		usleep(50000);
	}
	CHECK(tries < 200);
	if (plain)
		goto gets;
	/* too small: refused, and nothing written into it */
	memset(got, 0x11, STREAMED_LEN);
	CHECK_EQ(kvc_get(b, keys[0], got, STREAMED_LEN - 1), -ENOBUFS);
	for (size_t k = 0; k < STREAMED_LEN; k++)
		CHECK_EQ(got[k], 0x11);
	/* (that fetch landed it on B: drop B's copy, so every get below
	 * streams) */
	CHECK(test_counter(b, "gets_streamed") >= streamed + 1);
	kvc_set_get_flags(b, KVC_LOCAL_ONLY);
	CHECK_EQ(kvc_remove_force(b, keys[0]), 0);
	kvc_set_get_flags(b, 0);
gets:
	streamed = test_counter(b, "gets_streamed");
	/* odd ones through kvc_get_alloc: a buffer asked for once, at the
	 * value's length */
	for (int i = 0; i < STREAMED; i++) {
		struct alloc_rec ar = { .buf = got };
		void *out = NULL;

		memset(got, 0x11, STREAMED_LEN);
		if (i % 2) {
			CHECK_EQ(kvc_get_alloc(b, keys[i], alloc_rec, &ar, &out),
				 (ssize_t) STREAMED_LEN);
			CHECK(out == got);
			CHECK_EQ(ar.calls, 1u);
			CHECK_EQ(ar.len, (size_t) STREAMED_LEN);
		} else
			CHECK_EQ(kvc_get(b, keys[i], got, STREAMED_LEN), (ssize_t) STREAMED_LEN);
		CHECK(same(got, STREAMED_LEN, 40 + i));
	}
	CHECK(test_counter(b, "gets_streamed") >= streamed + STREAMED);
	/* no buffer to be had: -ENOMEM; a miss asks for none */
	if (!plain) {
		struct alloc_rec ar = { .buf = got, .refuse = true };
		void *out = got;

		kvc_set_get_flags(b, KVC_LOCAL_ONLY);
		CHECK_EQ(kvc_remove_force(b, keys[3]), 0);
		kvc_set_get_flags(b, 0);
		CHECK_EQ(kvc_get_alloc(b, keys[3], alloc_rec, &ar, &out), -ENOMEM);
		CHECK(ar.calls >= 1 && out == NULL);
		ar = (struct alloc_rec) { .buf = got };
		CHECK_EQ(kvc_get_alloc(b, "streamed-none", alloc_rec, &ar, &out), -ENOENT);
		CHECK_EQ(ar.calls, 0u);
		CHECK_EQ(kvc_get_alloc(b, keys[3], NULL, &ar, &out), -EINVAL);
	}
	/* held on B now: a local get, nothing to stream */
	streamed = test_counter(b, "gets_streamed");
	CHECK_EQ(kvc_get(b, keys[1], got, STREAMED_LEN), (ssize_t) STREAMED_LEN);
	CHECK(same(got, STREAMED_LEN, 41));
	CHECK_EQ(test_counter(b, "gets_streamed"), streamed);
	CHECK_EQ(kvc_get(b, "streamed-none", got, STREAMED_LEN), -ENOENT);
	free(v);
	free(got);
	return 0;
}

static int put_in_flight(struct kvc_client *a, const char *b_sock)
{
	static uint8_t v[4096];
	const char *done = "pif-done", *soon = "pif-announced";
	struct kvc_buf buf;

	memset(v, 7, sizeof(v));
	CHECK_EQ(kvc_put(a, done, v, sizeof(v), NULL), 0);

	/* committed while B waits: found (a prefix: the key before it too) */
	{
		struct asker q = { .sock = b_sock, .keys = { done, "pif-commit" }, .n = 2,
				   .prefix = true };

		CHECK_EQ(kvc_reserve(a, "pif-commit", sizeof(v), NULL, &buf), 0);
		memset(buf.data, 1, sizeof(v));
		ask_start(&q);
		CHECK_EQ(kvc_commit(a, &buf), 0);
		CHECK_EQ(ask_end(&q), 2);
	}
	/* aborted while B waits: a miss */
	{
		struct asker q = { .sock = b_sock, .keys = { "pif-abort" }, .n = 1 };

		CHECK_EQ(kvc_reserve(a, "pif-abort", sizeof(v), NULL, &buf), 0);
		ask_start(&q);
		CHECK_EQ(kvc_abort(a, &buf), 0);
		CHECK_EQ(ask_end(&q), 0);
	}
	/* still not committed when B's --lookup-wait-ms is over: a miss */
	{
		struct asker q = { .sock = b_sock, .keys = { "pif-slow" }, .n = 1 };

		CHECK_EQ(kvc_reserve(a, "pif-slow", sizeof(v), NULL, &buf), 0);
		ask_start(&q);
		CHECK_EQ(ask_end(&q), 0);
		CHECK_EQ(kvc_commit(a, &buf), 0);
	}
	/* announced, then put while B waits: found */
	{
		struct asker q = { .sock = b_sock, .keys = { soon }, .n = 1 };

		CHECK_EQ(kvc_announce(a, &soon, 1), 1);
		ask_start(&q);
		CHECK_EQ(kvc_put(a, soon, v, sizeof(v), NULL), 0);
		CHECK_EQ(ask_end(&q), 1);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct kvc_client *a, *b;
	char names[N][32];
	const char *keys[N];
	uint8_t *v = malloc(LEN2);
	int i, tries;

	if ((argc != 3 && argc != 4) || !v)
		return 2;
	CHECK_EQ(kvc_connect(argv[1], &a), 0);
	CHECK_EQ(kvc_connect(argv[2], &b), 0);
	if (argc == 4) {
		int r = strcmp(argv[3], "lookups") == 0	  ? lookups(a, b)
			: strcmp(argv[3], "put-many") == 0  ? put_many(a)
			: strcmp(argv[3], "put-batched") == 0 ? put_batched(a)
			: strcmp(argv[3], "put-burst") == 0 ? put_burst(a)
			: strcmp(argv[3], "get-many-async") == 0 ? get_many_async(argv[2], false)
			: strcmp(argv[3], "exists-many-async") == 0 ? get_many_async(argv[2], true)
			: strcmp(argv[3], "get-many-stalled") == 0 ? get_many_stalled(argv[2])
			: strcmp(argv[3], "find-many") == 0 ? find_many(b)
			: strcmp(argv[3], "push-many") == 0 ? push_many(a, b)
			: strcmp(argv[3], "push-apis") == 0 ? push_apis(a, b, false)
			: strcmp(argv[3], "push-apis-old") == 0 ? push_apis(a, b, true)
			: strcmp(argv[3], "put-in-flight") == 0 ? put_in_flight(a, argv[2])
			: strcmp(argv[3], "get-streamed") == 0 ? get_streamed(a, b, false)
			: strcmp(argv[3], "get-streamed-plain") == 0 ? get_streamed(a, b, true)
							    : 2;

		kvc_disconnect(a);
		kvc_disconnect(b);
		free(v);
		return r;
	}
	for (i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "batch-%d", i);
		keys[i] = names[i];
		fill(v, LEN, i);
		CHECK_EQ(kvc_put(a, keys[i], v, LEN, NULL), 0);
	}
	/* the directory hears of commits in batches: wait until B sees all */
	for (tries = 0; tries < 200; tries++) {
		uint8_t present[N];

		if (kvc_batch_exists(b, keys, N, present) == N)
			break;
		usleep(50000);
	}
	CHECK(tries < 200);

	/* kvc_batch_get: four keys fetched from A at once */
	{
		struct kvc_iovec io[4], *iop[4];
		size_t n_iov[4];
		ssize_t res[4];

		for (i = 0; i < 4; i++) {
			io[i] = (struct kvc_iovec) { malloc(LEN), LEN };
			CHECK(io[i].base);
			iop[i] = &io[i];
			n_iov[i] = 1;
		}
		CHECK_EQ(kvc_batch_get(b, 4, keys, (const struct kvc_iovec *const *) iop, n_iov, res),
			 4);
		for (i = 0; i < 4; i++) {
			CHECK_EQ(res[i], (ssize_t) LEN);
			CHECK(same(io[i].base, LEN, i));
			free(io[i].base);
		}
	}
	/* kvc_get_into and kvc_batch_get_into: registered buffers */
	{
		struct kvc_buffer buf;
		struct kvc_iov iov[N], *iop[N];
		size_t n_iov[N];
		ssize_t res[N];

		CHECK_EQ(kvc_buffer_alloc(b, (size_t) LEN * N, &buf), 0);
		CHECK_EQ(kvc_get_into(b, keys[4], &buf, 0, LEN), (ssize_t) LEN);
		CHECK(same(buf.data, LEN, 4));
		for (i = 5; i < N; i++) {
			iov[i] = (struct kvc_iov) { &buf, (uint64_t) LEN * (uint64_t) i, LEN };
			iop[i] = &iov[i];
			n_iov[i] = 1;
		}
		CHECK_EQ(kvc_batch_get_into(b, N - 5, keys + 5, (const struct kvc_iov *const *) (iop + 5),
					    n_iov + 5, res + 5),
			 N - 5);
		for (i = 5; i < N; i++) {
			CHECK_EQ(res[i], (ssize_t) LEN);
			CHECK(same((uint8_t *) buf.data + (size_t) LEN * (size_t) i, LEN, i));
		}
		CHECK_EQ(kvc_buffer_free(b, &buf), 0);
	}
	/* a batch whose fetches go to A at once, asked for on one connection
	 * before any answer is read: some were removed on A after B learned
	 * where they were, so A answers those with a miss between values;
	 * the others arrive whole.  Values of 200 KiB A's loop sends itself,
	 * values of 300 KiB a data thread sends (after any miss the loop
	 * answered before them: in order) */
	for (int round = 0; round < 2; round++) {
		enum { G = 16 };
		char gnames[G][32];
		const char *gkeys[G];
		struct kvc_iovec io[G], *iop[G];
		size_t n_iov[G], len[G];
		ssize_t res[G];
		uint8_t present[G];
		bool gone[G];
		int n_gone = 0;

		for (i = 0; i < G; i++) {
			snprintf(gnames[i], sizeof(gnames[i]), "gone-%d-%d", round, i);
			gkeys[i] = gnames[i];
			len[i] = round == 0 || i % 2 ? LEN : LEN2;
			gone[i] = i % 3 == 2 || (round == 1 && i == 1);
			n_gone += gone[i];
			fill(v, len[i], 100 + i);
			CHECK_EQ(kvc_put(a, gkeys[i], v, len[i], NULL), 0);
			io[i] = (struct kvc_iovec) { malloc(len[i]), len[i] };
			CHECK(io[i].base);
			iop[i] = &io[i];
			n_iov[i] = 1;
		}
		for (tries = 0; tries < 200; tries++) {
			if (kvc_batch_exists(b, gkeys, G, present) == G)
				break;
			usleep(50000);
		}
		CHECK(tries < 200);
		for (i = 0; i < G; i++)
			if (gone[i])
				CHECK_EQ(kvc_remove(a, gkeys[i]), 0);
		CHECK_EQ(kvc_batch_get(b, G, gkeys, (const struct kvc_iovec *const *) iop, n_iov, res),
			 G - n_gone);
		for (i = 0; i < G; i++) {
			if (gone[i])
				CHECK_EQ(res[i], -ENOENT);
			else {
				CHECK_EQ(res[i], (ssize_t) len[i]);
				CHECK(same(io[i].base, len[i], 100 + i));
			}
			free(io[i].base);
		}
	}
	kvc_disconnect(a);
	kvc_disconnect(b);
	free(v);
	printf("batch, get_into and batch_get_into across nodes: every byte matched\n");
	return 0;
}
