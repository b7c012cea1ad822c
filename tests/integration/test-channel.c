/* SPDX-License-Identifier: MIT */
/* The shared-memory fast path: batches and scatter-gather, registered
 * buffers, async submission, many threads and clients at once, a client
 * that writes garbage into its ring, and a client killed mid-flight. */
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"
#include "raw.h"
#include "ring.h"
#include "shmem.h"

static struct test_daemon td;

#define LAYERS 8

static void test_batch_sg(struct kvc_client *c)
{
	/* 40 blocks, each stored from 8 per-layer buffers and loaded back
	 * into 8 others, as an engine keeps one buffer per layer */
	enum { N = 40, LAYER = 3000 };
	static uint8_t src[N][LAYERS][LAYER], dst[N][LAYERS][LAYER];
	struct kvc_iovec in[N][LAYERS], out[N][LAYERS];
	const struct kvc_iovec *inp[N], *outp[N];
	size_t n_iov[N];
	char names[N][64];
	const char *keys[N];
	int res[N];
	ssize_t got[N];

	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "sg@block%02d", i);
		keys[i] = names[i];
		for (int l = 0; l < LAYERS; l++) {
			test_fill(src[i][l], LAYER, (uint64_t) (i * 100 + l));
			in[i][l] = (struct kvc_iovec) { src[i][l], LAYER };
			out[i][l] = (struct kvc_iovec) { dst[i][l], LAYER };
		}
		inp[i] = in[i];
		outp[i] = out[i];
		n_iov[i] = LAYERS;
	}
	CHECK_EQ(kvc_batch_put(c, N, keys, inp, n_iov, NULL, res), N);
	for (int i = 0; i < N; i++)
		CHECK_EQ(res[i], 0);
	/* again: every key exists now */
	CHECK_EQ(kvc_batch_put(c, N, keys, inp, n_iov, NULL, res), 0);
	for (int i = 0; i < N; i++)
		CHECK_EQ(res[i], -EEXIST);
	memset(dst, 0, sizeof(dst));
	CHECK_EQ(kvc_batch_get(c, N, keys, outp, n_iov, got), N);
	for (int i = 0; i < N; i++) {
		CHECK_EQ(got[i], LAYERS * LAYER);
		for (int l = 0; l < LAYERS; l++)
			CHECK(test_verify(dst[i][l], LAYER, (uint64_t) (i * 100 + l)));
	}
	/* one missing, one too small, the rest fine */
	{
		const char *k2[3] = { keys[0], "sg@missing", keys[2] };
		size_t n2[3] = { LAYERS, LAYERS, LAYERS - 1 };
		ssize_t g2[3];

		CHECK_EQ(kvc_batch_get(c, 3, k2, outp, n2, g2), 1);
		CHECK_EQ(g2[0], LAYERS * LAYER);
		CHECK_EQ(g2[1], -ENOENT);
		CHECK_EQ(g2[2], -ENOBUFS);
	}
	/* the views taken by batch_get were all released */
	for (int i = 0; i < N; i++)
		CHECK_EQ(kvc_remove(c, keys[i]), 0);
}

/* Batches longer than the requests kept in flight (128): every key's bytes
 * and result in its own place, a missing key or a short buffer anywhere
 * in the stream, and every view let go by the time the batch returns. */
static void test_long_batches(struct kvc_client *c)
{
	enum { N = 700, LEN = 1000 };
	static uint8_t src[N][LEN], dst[N][LEN];
	static char names[N][32];
	static struct kvc_iovec in[N], out[N];
	static const struct kvc_iovec *inp[N], *outp[N];
	static size_t n_iov[N];
	static ssize_t got[N];
	static int res[N];
	static const char *keys[N];
	struct kvc_buffer buf;
	static struct kvc_iov rio[N];
	static const struct kvc_iov *riop[N];
	static ssize_t rres[N];
	int stored = 0;

	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "long@%d", i);
		keys[i] = names[i];
		test_fill(src[i], LEN, (uint64_t) i + 5000);
		in[i] = (struct kvc_iovec) { src[i], LEN };
		out[i] = (struct kvc_iovec) { dst[i], i % 97 == 13 ? LEN - 1 : LEN };
		inp[i] = &in[i];
		outp[i] = &out[i];
		n_iov[i] = 1;
	}
	/* every 50th key is never stored */
	for (int i = 0; i < N; i++)
		if (i % 50 != 7)
			stored++;
	{
		static const char *skeys[N];
		static const struct kvc_iovec *sinp[N];
		static size_t sn[N];
		int k = 0;

		for (int i = 0; i < N; i++)
			if (i % 50 != 7) {
				skeys[k] = keys[i];
				sinp[k] = inp[i];
				sn[k++] = 1;
			}
		CHECK_EQ(kvc_batch_put(c, (size_t) k, skeys, sinp, sn, NULL, res), stored);
	}
	memset(dst, 0, sizeof(dst));
	{
		int want = 0;

		for (int i = 0; i < N; i++)
			want += i % 50 != 7 && i % 97 != 13;
		CHECK_EQ(kvc_batch_get(c, N, keys, outp, n_iov, got), want);
	}
	for (int i = 0; i < N; i++) {
		if (i % 50 == 7)
			CHECK_EQ(got[i], -ENOENT);
		else if (i % 97 == 13)
			CHECK_EQ(got[i], -ENOBUFS);
		else {
			CHECK_EQ(got[i], LEN);
			CHECK(test_verify(dst[i], LEN, (uint64_t) i + 5000));
		}
	}
	/* into a registered buffer, each key at its own offset */
	CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * LEN, &buf), 0);
	memset(buf.data, 0, buf.len);
	for (int i = 0; i < N; i++) {
		rio[i] = (struct kvc_iov) { .buf = &buf, .offset = (uint64_t) i * LEN, .len = LEN };
		riop[i] = &rio[i];
	}
	CHECK_EQ(kvc_batch_get_into(c, N, keys, riop, n_iov, rres), stored);
	for (int i = 0; i < N; i++) {
		if (i % 50 == 7) {
			CHECK_EQ(rres[i], -ENOENT);
			continue;
		}
		CHECK_EQ(rres[i], LEN);
		CHECK(test_verify((uint8_t *) buf.data + (size_t) i * LEN, LEN, (uint64_t) i + 5000));
	}
	CHECK_EQ(kvc_buffer_free(c, &buf), 0);
	/* no view is left: each key can go at once */
	for (int i = 0; i < N; i++)
		CHECK_EQ(kvc_remove(c, keys[i]), i % 50 == 7 ? -ENOENT : 0);
}

static void test_registered(struct kvc_client *c)
{
	struct kvc_buffer a, b;
	const size_t sz = 3 << 20;

	CHECK_EQ(kvc_buffer_alloc(c, sz, &a), 0);
	CHECK_EQ(kvc_buffer_alloc(c, sz, &b), 0);
	CHECK(a.data && a.len == sz);
	CHECK_EQ(test_counter(c, "registered_bytes"), 2 * sz);
	test_fill(a.data, sz, 7);
	CHECK_EQ(kvc_put_from(c, "reg1", &a, 0, 1 << 20, NULL), 0);
	CHECK_EQ(kvc_put_from(c, "reg2", &a, 1 << 20, 2 << 20, NULL), 0);
	CHECK_EQ(kvc_put_from(c, "reg1", &a, 0, 10, NULL), -EEXIST);
	memset(b.data, 0, sz);
	CHECK_EQ(kvc_get_into(c, "reg2", &b, 4096, sz - 4096), 2 << 20);
	CHECK(memcmp((uint8_t *) b.data + 4096, (uint8_t *) a.data + (1 << 20), 2 << 20) == 0);
	CHECK_EQ(kvc_get_into(c, "reg1", &b, 0, 100), -ENOBUFS);
	CHECK_EQ(kvc_get_into(c, "nope", &b, 0, sz), -ENOENT);
	/* pieces beyond the buffer are refused, not copied */
	CHECK_EQ(kvc_get_into(c, "reg1", &b, sz - 10, 1 << 20), -EFAULT);
	CHECK_EQ(kvc_put_from(c, "reg3", &a, sz, 1, NULL), -EFAULT);
	CHECK_EQ(kvc_exists(c, "reg3"), 0);
	/* the object matches what kvc_get sees */
	{
		static uint8_t buf[1 << 20];

		CHECK_EQ(kvc_get(c, "reg1", buf, sizeof(buf)), 1 << 20);
		CHECK(test_verify(buf, sizeof(buf), 7));
	}
	/* scatter-gather across both buffers */
	{
		struct kvc_iov iov[2] = { { &a, 0, 1000 }, { &b, 0, 1000 } };
		struct kvc_op op = { .opcode = KVC_OP_PUT_FROM, .key = "reg-sg", .iov = iov,
				     .n_iov = 2, .user_data = 5 };
		struct kvc_completion cp;
		uint8_t buf[2000];

		memset(b.data, 0x5a, 1000);
		CHECK_EQ(kvc_submit(c, &op, 1), 1);
		CHECK_EQ(kvc_wait(c, &cp, 1, 1, 5000), 1);
		CHECK_EQ(cp.user_data, 5);
		CHECK_EQ(cp.res, 0);
		CHECK_EQ(kvc_get(c, "reg-sg", buf, sizeof(buf)), 2000);
		CHECK(memcmp(buf, a.data, 1000) == 0);
		CHECK_EQ(buf[1500], 0x5a);
		CHECK_EQ(kvc_remove(c, "reg-sg"), 0);
	}
	/* the batch forms: four keys, each from and into two pieces */
	{
		const char *keys[4] = { "rb/0", "rb/1", "rb/2", "nope" };
		struct kvc_iov pieces[4][2];
		const struct kvc_iov *ip[4];
		size_t n_iov[4] = { 2, 2, 2, 2 };
		int pres[3];
		ssize_t gres[4];

		for (int i = 0; i < 4; i++) {
			pieces[i][0] = (struct kvc_iov) { &a, (uint64_t) i * 8192, 4096 };
			pieces[i][1] = (struct kvc_iov) { &a, (uint64_t) i * 8192 + 4096, 4096 };
			ip[i] = pieces[i];
		}
		test_fill(a.data, 4 * 8192, 77);
		CHECK_EQ(kvc_batch_put_from(c, 3, keys, ip, n_iov, NULL, pres), 3);
		for (int i = 0; i < 3; i++)
			CHECK_EQ(pres[i], 0);
		for (int i = 0; i < 4; i++) {
			pieces[i][0].buf = &b;
			pieces[i][1].buf = &b;
		}
		memset(b.data, 0, 4 * 8192);
		CHECK_EQ(kvc_batch_get_into(c, 4, keys, ip, n_iov, gres), 3);
		for (int i = 0; i < 3; i++)
			CHECK_EQ(gres[i], 8192);
		CHECK_EQ(gres[3], -ENOENT);
		CHECK(memcmp(b.data, a.data, 3 * 8192) == 0);
		for (int i = 0; i < 3; i++)
			CHECK_EQ(kvc_remove(c, keys[i]), 0);
	}

	/* a freed buffer's handle is refused */
	{
		struct kvc_buffer stale = b;

		CHECK_EQ(kvc_buffer_free(c, &b), 0);
		stale.data = a.data; /* keep the library's pointer checks out of it */
		CHECK_EQ(kvc_get_into(c, "reg1", &stale, 0, 1 << 20), -EFAULT);
	}
	CHECK_EQ(kvc_buffer_free(c, &a), 0);
	CHECK_EQ(test_counter(c, "registered_bytes"), 0);
	CHECK_EQ(kvc_remove(c, "reg1"), 0);
	CHECK_EQ(kvc_remove(c, "reg2"), 0);
}

static void test_async(struct kvc_client *c)
{
	enum { N = 200, SZ = 16384 };
	struct kvc_buffer buf;
	struct kvc_op ops[N];
	struct kvc_completion cp[N];
	static char keys[N][32];
	bool seen[N] = { false };
	int got = 0, r;

	CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * SZ, &buf), 0);
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "async%d", i);
		test_fill((uint8_t *) buf.data + (size_t) i * SZ, SZ, (uint64_t) i + 1000);
		ops[i] = (struct kvc_op) { .opcode = KVC_OP_PUT_FROM, .key = keys[i], .buf = &buf,
					   .offset = (uint64_t) i * SZ, .len = SZ,
					   .user_data = (uint64_t) i };
	}
	CHECK_EQ(kvc_submit(c, ops, N), N);
	while (got < N) {
		r = kvc_wait(c, cp, 1, N, 10000);
		CHECK(r > 0);
		for (int i = 0; i < r; i++) {
			CHECK(cp[i].user_data < N && !seen[cp[i].user_data]);
			CHECK_EQ(cp[i].res, 0);
			seen[cp[i].user_data] = true;
		}
		got += r;
	}
	CHECK_EQ(kvc_poll(c, cp, N), 0);
	/* load them all back, overlapping, into the other half order */
	memset(buf.data, 0, (size_t) N * SZ);
	for (int i = 0; i < N; i++)
		ops[i] = (struct kvc_op) { .opcode = KVC_OP_GET_INTO, .key = keys[N - 1 - i],
					   .buf = &buf, .offset = (uint64_t) i * SZ, .len = SZ,
					   .user_data = (uint64_t) i };
	CHECK_EQ(kvc_submit(c, ops, N), N);
	for (got = 0; got < N;) {
		r = kvc_wait(c, cp, 1, N, 10000);
		CHECK(r > 0);
		for (int i = 0; i < r; i++)
			CHECK_EQ(cp[i].res, SZ);
		got += r;
	}
	for (int i = 0; i < N; i++)
		CHECK(test_verify((uint8_t *) buf.data + (size_t) i * SZ, SZ,
				  (uint64_t) (N - 1 - i) + 1000));

	/* back-pressure: at most 256 in flight, the rest is -EAGAIN */
	{
		struct kvc_op ex[300];
		int queued = 0;

		for (int i = 0; i < 300; i++)
			ex[i] = (struct kvc_op) { .opcode = KVC_OP_EXISTS, .key = keys[i % N],
						  .user_data = (uint64_t) i };
		r = kvc_submit(c, ex, 300);
		CHECK(r > 0 && r <= 256);
		queued = r;
		CHECK_EQ(kvc_submit(c, ex + queued, 300 - (size_t) queued), -EAGAIN);
		for (got = 0; got < queued;) {
			r = kvc_wait(c, cp, 1, N, 10000);
			CHECK(r > 0);
			for (int i = 0; i < r; i++)
				CHECK_EQ(cp[i].res, 1);
			got += r;
		}
		/* room again */
		CHECK_EQ(kvc_submit(c, ex, 1), 1);
		CHECK_EQ(kvc_wait(c, cp, 1, 1, 10000), 1);
	}
	/* malformed first op */
	{
		struct kvc_op bad = { .opcode = 99, .key = "x" };

		CHECK_EQ(kvc_submit(c, &bad, 1), -EINVAL);
		bad = (struct kvc_op) { .opcode = KVC_OP_EXISTS, .key = "" };
		CHECK_EQ(kvc_submit(c, &bad, 1), -EINVAL);
	}
	CHECK_EQ(kvc_wait(c, cp, 1, 1, 10), -ETIMEDOUT);
	for (int i = 0; i < N; i++)
		CHECK_EQ(kvc_remove(c, keys[i]), 0);
	CHECK_EQ(kvc_buffer_free(c, &buf), 0);
}

/* ---- many threads on one client, many clients at once ---- */

struct worker {
	struct kvc_client *c;
	int id;
	int rounds;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	static __thread uint8_t buf[65536];
	struct kvc_buffer rb;

	CHECK_EQ(kvc_buffer_alloc(w->c, 65536, &rb), 0);
	for (int i = 0; i < w->rounds; i++) {
		char key[64], k2[64];
		size_t len = 1 + (size_t) (i * 7919 + w->id * 31) % 60000;
		uint64_t seed = (uint64_t) w->id << 32 | (uint64_t) i;
		struct kvc_view v;

		snprintf(key, sizeof(key), "mt%d/%d", w->id, i);
		snprintf(k2, sizeof(k2), "mt%d/%d/r", w->id, i);
		switch (i % 3) {
		case 0:
			test_fill(buf, len, seed);
			CHECK_EQ(kvc_put(w->c, key, buf, len, NULL), 0);
			break;
		case 1:
			test_fill(rb.data, len, seed);
			CHECK_EQ(kvc_put_from(w->c, key, &rb, 0, len, NULL), 0);
			break;
		default: {
			struct kvc_iovec iov[2] = { { buf, len / 2 }, { buf + len / 2, len - len / 2 } };
			const struct kvc_iovec *ip = iov;
			size_t n = 2;
			int res;

			test_fill(buf, len, seed);
			CHECK_EQ(kvc_batch_put(w->c, 1, (const char *const[]) { key }, &ip, &n, NULL,
					       &res), 1);
		}
		}
		CHECK_EQ(kvc_exists(w->c, key), 1);
		CHECK_EQ(kvc_acquire(w->c, key, &v), 0);
		CHECK_EQ(v.len, len);
		CHECK(test_verify(v.data, v.len, seed));
		CHECK_EQ(kvc_release(w->c, &v), 0);
		memset(rb.data, 0, len);
		CHECK_EQ(kvc_get_into(w->c, key, &rb, 0, 65536), len);
		CHECK(test_verify(rb.data, len, seed));
		CHECK_EQ(kvc_get(w->c, key, buf, sizeof(buf)), len);
		CHECK(test_verify(buf, len, seed));
		CHECK_EQ(kvc_exists(w->c, k2), 0);
		CHECK_EQ(kvc_remove(w->c, key), 0);
	}
	CHECK_EQ(kvc_buffer_free(w->c, &rb), 0);
	return NULL;
}

static void run_threads(struct kvc_client *c, int n, int rounds, int id_base)
{
	pthread_t t[8];
	struct worker w[8];

	for (int i = 0; i < n; i++) {
		w[i] = (struct worker) { c, id_base + i, rounds };
		CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

static void test_threads_and_clients(void)
{
	pid_t pids[4];

	for (int p = 0; p < 4; p++) {
		pids[p] = fork();
		CHECK(pids[p] >= 0);
		if (pids[p] == 0) {
			struct kvc_client *c;

			CHECK_EQ(kvc_connect(td.socket, &c), 0);
			run_threads(c, 4, 300, p * 10);
			kvc_disconnect(c);
			_exit(0);
		}
	}
	for (int p = 0; p < 4; p++)
		CHECK_EQ(test_wait(pids[p]), 0);
}

/* ---- a client that writes garbage into its ring ---- */

static void test_hostile_ring(struct kvc_client *good)
{
	struct raw_chan rc;
	static uint8_t keeper[100000];
	struct shm_sqe e;
	uint64_t used;

	test_fill(keeper, sizeof(keeper), 31337);
	CHECK_EQ(kvc_put(good, "keeper", keeper, sizeof(keeper), NULL), 0);
	used = test_tier_used(good, "dram");
	raw_chan_open(&rc, td.socket);
	memcpy(rc.arena, "keeper", 6);

	/* a well-formed request works */
	e = (struct shm_sqe) { .opcode = SHM_OP_EXISTS, .key_len = 6, .user_data = 1 };
	CHECK_EQ(raw_chan_call(&rc, &e), 1);
	/* unknown opcode */
	e = (struct shm_sqe) { .opcode = 200, .user_data = 2 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EOPNOTSUPP);
	/* key beyond the arena, key too long, key of zero bytes */
	e = (struct shm_sqe) { .opcode = SHM_OP_EXISTS, .key_off = SHM_CHAN_ARENA_SIZE - 3,
			       .key_len = 6, .user_data = 3 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
	e = (struct shm_sqe) { .opcode = SHM_OP_ACQUIRE, .key_off = UINT32_MAX, .key_len = 100,
			       .user_data = 4 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
	e = (struct shm_sqe) { .opcode = SHM_OP_EXISTS, .key_len = 600, .user_data = 5 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EINVAL);
	e = (struct shm_sqe) { .opcode = SHM_OP_REMOVE, .key_len = 0, .user_data = 6 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EINVAL);
	/* batch with a key list beyond the arena, a huge count */
	e = (struct shm_sqe) { .opcode = SHM_OP_BATCH_EXISTS, .count = 1000,
			       .list_off = SHM_CHAN_ARENA_SIZE - 100, .user_data = 7 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
	e = (struct shm_sqe) { .opcode = SHM_OP_PREFIX_LOOKUP, .count = UINT32_MAX, .user_data = 8 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EINVAL);
	/* key refs inside the list pointing outside the arena */
	{
		struct shm_key_ref ref = { SHM_CHAN_ARENA_SIZE, 5 };

		memcpy(rc.arena + 1024, &ref, sizeof(ref));
		e = (struct shm_sqe) { .opcode = SHM_OP_PREFIX_LOOKUP, .count = 1, .list_off = 1024,
				       .user_data = 9 };
		CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
	}
	/* copies with forged buffer handles, or pieces beyond a buffer */
	{
		struct shm_iov iov = { .buffer = 0x100000001ull, .off = 0, .len = 100000 };

		memcpy(rc.arena + 2048, &iov, sizeof(iov));
		e = (struct shm_sqe) { .opcode = SHM_OP_GET_INTO, .key_len = 6, .count = 1,
				       .list_off = 2048, .user_data = 10 };
		CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
		memcpy(rc.arena + 64, "evil", 4);
		e = (struct shm_sqe) { .opcode = SHM_OP_PUT_FROM, .key_off = 64, .key_len = 4,
				       .count = 1, .list_off = 2048, .user_data = 11 };
		CHECK_EQ(raw_chan_call(&rc, &e), -EFAULT);
		e.count = 5000;
		CHECK_EQ(raw_chan_call(&rc, &e), -EINVAL);
	}
	/* handles that are not this client's */
	e = (struct shm_sqe) { .opcode = SHM_OP_COMMIT, .arg = 0xffffffff00000001ull, .user_data = 12 };
	CHECK_EQ(raw_chan_call(&rc, &e), -ESTALE);
	e = (struct shm_sqe) { .opcode = SHM_OP_RELEASE, .arg = 1, .user_data = 13 };
	CHECK_EQ(raw_chan_call(&rc, &e), -ESTALE);
	/* a reservation of 0 bytes, or larger than the pool */
	e = (struct shm_sqe) { .opcode = SHM_OP_RESERVE, .key_off = 64, .key_len = 4, .arg = 0,
			       .user_data = 14 };
	CHECK_EQ(raw_chan_call(&rc, &e), -EINVAL);
	e.arg = UINT64_MAX;
	CHECK_EQ(raw_chan_call(&rc, &e), -E2BIG);

	/* the others are fine, nothing leaked or was damaged */
	{
		struct kvc_view v;

		CHECK_EQ(kvc_acquire(good, "keeper", &v), 0);
		CHECK(test_verify(v.data, v.len, 31337));
		CHECK_EQ(kvc_release(good, &v), 0);
		CHECK_EQ(kvc_exists(good, "evil"), 0);
		CHECK_EQ(test_tier_used(good, "dram"), used);
	}

	/* an impossible tail stops this channel, and only this one */
	{
		uint64_t one = 1, errs = test_counter(good, "protocol_errors");

		rc.sq.r->tail = rc.sq.pos + 100000;
		CHECK(write(rc.efd, &one, sizeof(one)) == sizeof(one));
		for (int i = 0; i < 500 && test_counter(good, "protocol_errors") == errs; i++)
			usleep(2000);
		CHECK(test_counter(good, "protocol_errors") > errs);
	}
	CHECK_EQ(kvc_exists(good, "keeper"), 1);
	munmap(rc.base, SHM_CHAN_SIZE);
	close(rc.efd);
	close(rc.sock);
	CHECK_EQ(kvc_remove(good, "keeper"), 0);
}

/* ---- killed with operations in flight ---- */

static bool wait_counter(struct kvc_client *c, const char *name, uint64_t want)
{
	for (int i = 0; i < 500; i++) {
		if (test_counter(c, name) == want)
			return true;
		usleep(10000);
	}
	return false;
}

/*
 * A child client that submits n GET_INTO (of `shared`) and PUT_FROM (of
 * prefix%d) operations of len bytes over and over without reaping, until it
 * is killed; with hold it also keeps a view of `shared` and a 4 MiB
 * reservation.  Returns once it has submitted its first n.
 */
static pid_t submit_until_killed(const char *shared, const char *prefix, uint64_t len, int n,
				 bool hold)
{
	int ready[2];
	pid_t pid;
	char b;

	CHECK(pipe(ready) == 0 && n <= 100);
	pid = fork();
	if (pid == 0) {
		struct kvc_client *c;
		struct kvc_buffer buf;
		struct kvc_view v;
		struct kvc_buf r;
		struct kvc_op ops[100];
		static char keys[100][32];

		CHECK_EQ(kvc_connect(td.socket, &c), 0);
		CHECK_EQ(kvc_buffer_alloc(c, 8 << 20, &buf), 0);
		if (hold) {
			CHECK_EQ(kvc_acquire(c, shared, &v), 0);
			CHECK_EQ(kvc_reserve(c, "half-written", 4 << 20, NULL, &r), 0);
		}
		for (int i = 0; i < n; i++) {
			snprintf(keys[i], sizeof(keys[i]), "%s%d", prefix, i);
			ops[i] = (struct kvc_op) { .opcode = i % 2 ? KVC_OP_PUT_FROM : KVC_OP_GET_INTO,
						   .key = i % 2 ? keys[i] : shared, .buf = &buf,
						   .offset = 0, .len = len };
		}
		CHECK_EQ(kvc_submit(c, ops, (size_t) n), n);
		CHECK(write(ready[1], "x", 1) == 1);
		/* keep submitting until killed, never reaping */
		for (;;)
			kvc_submit(c, ops, (size_t) n);
	}
	close(ready[1]);
	CHECK_EQ(read(ready[0], &b, 1), 1);
	close(ready[0]);
	return pid;
}

/* Kill it; then its channel, copies and buffers are gone, and whatever it
 * committed before dying stays, whole: removed here. */
static void kill_and_check(struct kvc_client *good, pid_t pid, const char *prefix, uint64_t len)
{
	struct kvc_key_info *v;
	size_t n;

	kill(pid, SIGKILL);
	CHECK_EQ(test_wait(pid), 128 + SIGKILL);
	CHECK(wait_counter(good, "channels", 1)); /* only ours is left */
	CHECK(wait_counter(good, "copies_in_flight", 0));
	CHECK_EQ(test_counter(good, "registered_bytes"), 0);
	CHECK_EQ(kvc_list(good, prefix, 0, &v, &n, NULL), 0);
	for (size_t i = 0; i < n; i++) {
		CHECK_EQ(v[i].state, KVC_STATE_COMMITTED);
		CHECK_EQ(v[i].size, len);
		CHECK_EQ(kvc_remove(good, v[i].key), 0);
	}
	kvc_list_free(v);
}

static void test_killed_in_flight(struct kvc_client *good)
{
	uint64_t used0;
	pid_t pid;

	CHECK_EQ(kvc_put(good, "shared-block", "abcdef", 6, NULL), 0);
	used0 = test_tier_used(good, "dram");
	pid = submit_until_killed("shared-block", "inflight", 64 << 10, 100, true);
	CHECK_EQ(kvc_remove(good, "shared-block"), -EBUSY);
	CHECK(test_counter(good, "registered_bytes") >= (8 << 20));
	usleep(20000);
	/* a batch of these goes to the copier too, past the loop's share */
	kill_and_check(good, pid, "inflight", 64 << 10);
	CHECK_EQ(kvc_exists(good, "half-written"), 0);
	CHECK_EQ(test_tier_used(good, "dram"), used0);
	CHECK_EQ(kvc_remove(good, "shared-block"), 0);
}

/* ---- large copies: the copier's, not the loop's ---- */

static void test_large_copies(struct kvc_client *c)
{
	enum { N = 6, SZ = (3 << 20) + 4096 + 17 }; /* above COPY_OFFLOAD, odd */
	struct kvc_buffer a, b;
	struct kvc_op ops[N];
	struct kvc_iov iov[N][2];
	struct kvc_completion cp[N];
	static char keys[N][32];
	uint64_t off0 = test_counter(c, "copies_offloaded");
	int got, r;

	CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * SZ, &a), 0);
	CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * SZ, &b), 0);
	/* each value from two pieces in two buffers: its first 1 MiB + 5
	 * bytes in a, the rest in b */
	for (int i = 0; i < N; i++) {
		uint8_t *v = malloc(SZ);
		size_t head = (1 << 20) + 5;

		CHECK(v);
		snprintf(keys[i], sizeof(keys[i]), "large%d", i);
		test_fill(v, SZ, (uint64_t) i + 7000);
		memcpy((uint8_t *) a.data + (size_t) i * SZ, v, head);
		memcpy((uint8_t *) b.data + (size_t) i * SZ, v + head, SZ - head);
		free(v);
		iov[i][0] = (struct kvc_iov) { &a, (uint64_t) i * SZ, head };
		iov[i][1] = (struct kvc_iov) { &b, (uint64_t) i * SZ, SZ - head };
		ops[i] = (struct kvc_op) { .opcode = KVC_OP_PUT_FROM, .key = keys[i], .iov = iov[i],
					   .n_iov = 2, .len = SZ, .user_data = (uint64_t) i };
	}
	CHECK_EQ(kvc_submit(c, ops, N), N);
	for (got = 0; got < N; got += r) {
		r = kvc_wait(c, cp, 1, N, 10000);
		CHECK(r > 0);
		for (int i = 0; i < r; i++)
			CHECK_EQ(cp[i].res, 0);
	}
	/* back, each into one piece of a, in reverse order */
	memset(a.data, 0, (size_t) N * SZ);
	for (int i = 0; i < N; i++)
		ops[i] = (struct kvc_op) { .opcode = KVC_OP_GET_INTO, .key = keys[N - 1 - i], .buf = &a,
					   .offset = (uint64_t) i * SZ, .len = SZ,
					   .user_data = (uint64_t) i };
	CHECK_EQ(kvc_submit(c, ops, N), N);
	for (got = 0; got < N; got += r) {
		r = kvc_wait(c, cp, 1, N, 10000);
		CHECK(r > 0);
		for (int i = 0; i < r; i++)
			CHECK_EQ(cp[i].res, SZ);
	}
	for (int i = 0; i < N; i++)
		CHECK(test_verify((uint8_t *) a.data + (size_t) i * SZ, SZ,
				  (uint64_t) (N - 1 - i) + 7000));
	CHECK_EQ(test_counter(c, "copies_offloaded"), off0 + 2 * N);
	/* synchronous calls take the same way */
	CHECK_EQ(kvc_get_into(c, keys[0], &b, 0, SZ), SZ);
	CHECK(test_verify(b.data, SZ, 7000));
	CHECK_EQ(test_counter(c, "copies_offloaded"), off0 + 2 * N + 1);

	/* the buffer given back while copies into it are in flight: each
	 * answer is the length or -EFAULT (the free came first), the daemon
	 * unmaps it after the last copy, and nothing is left over */
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < N; i++)
			ops[i] = (struct kvc_op) { .opcode = KVC_OP_GET_INTO, .key = keys[i], .buf = &b,
						   .offset = (uint64_t) i * SZ, .len = SZ,
						   .user_data = (uint64_t) i };
		CHECK_EQ(kvc_submit(c, ops, N), N);
		CHECK_EQ(kvc_buffer_free(c, &b), 0);
		for (got = 0; got < N; got += r) {
			r = kvc_wait(c, cp, 1, N, 10000);
			CHECK(r > 0);
			for (int i = 0; i < r; i++)
				CHECK(cp[i].res == SZ || cp[i].res == -EFAULT);
		}
		CHECK(wait_counter(c, "copies_in_flight", 0));
		CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * SZ, &b), 0);
	}
	CHECK_EQ(kvc_buffer_free(c, &a), 0);
	CHECK_EQ(kvc_buffer_free(c, &b), 0);
	CHECK_EQ(test_counter(c, "registered_bytes"), 0);
	for (int i = 0; i < N; i++)
		CHECK_EQ(kvc_remove(c, keys[i]), 0);
}

/* A client killed with large copies in flight, both ways: the copies end
 * unanswered, what they held is let go, and its buffers are unmapped;
 * puts answered before it died stay whole, those still copying were
 * aborted. */
static void test_killed_copying(struct kvc_client *good)
{
	uint8_t *v = calloc(1, 8 << 20);
	uint64_t used0;
	pid_t pid;

	CHECK(v);
	CHECK_EQ(kvc_put(good, "big-shared", v, 8 << 20, NULL), 0);
	free(v);
	used0 = test_tier_used(good, "dram");
	pid = submit_until_killed("big-shared", "copying", 8 << 20, 16, false);
	usleep(5000);
	kill_and_check(good, pid, "copying", 8 << 20);
	CHECK(test_counter(good, "copies_offloaded") > 0);
	CHECK_EQ(test_tier_used(good, "dram"), used0);
	CHECK_EQ(kvc_remove(good, "big-shared"), 0);
}

/* Ask for a buffer on a raw connection and, before the answer, one more
 * request: the answers come in order, the buffer's first. */
static int raw_buffer_then_status(int sock, uint64_t size)
{
	Kvc__Request q = KVC__REQUEST__INIT, st = KVC__REQUEST__INIT;
	Kvc__BufferReq bq = KVC__BUFFER_REQ__INIT;
	Kvc__Response *resp;
	uint8_t *p;
	uint32_t len;
	size_t n_fds;
	int fd = -1;

	q.op = KVC__OP__OP_BUFFER_ALLOC;
	q.body_case = KVC__REQUEST__BODY_BUFFER;
	bq.size = size;
	q.buffer = &bq;
	st.op = KVC__OP__OP_STATUS;
	raw_send_msg(sock, WIRE_REQUEST, &q.base);
	raw_send_msg(sock, WIRE_REQUEST, &st.base);
	CHECK_EQ(raw_recv_fds(sock, &p, &len, &fd, 1, &n_fds), WIRE_RESPONSE);
	resp = kvc__response__unpack(NULL, len, p);
	CHECK(resp && resp->error == 0 && n_fds == 1);
	CHECK(resp->body_case == KVC__RESPONSE__BODY_EXTENT && resp->extent->len == size);
	kvc__response__free_unpacked(resp, NULL);
	free(p);
	CHECK_EQ(raw_recv(sock, &p, &len), WIRE_RESPONSE);
	resp = kvc__response__unpack(NULL, len, p);
	CHECK(resp && resp->error == 0 && resp->body_case == KVC__RESPONSE__BODY_STATUS);
	kvc__response__free_unpacked(resp, NULL);
	free(p);
	return fd;
}

/*
 * Buffers are mapped off the loop and answered later: a request sent
 * behind one waits for it; clients that hang up before their buffer is
 * made leave nothing counted against --max-registered-bytes (a leak
 * there would refuse the last buffer here) and nothing mapped (ASan's
 * leak check at the daemon's exit).
 */
static void test_buffers_mapped_later(void)
{
	const uint64_t big = 48 << 20;
	struct test_daemon d;
	struct kvc_client *c;
	struct kvc_buffer b, b2;
	uint8_t *m;
	int sock, fd, r = -ENOSPC;

	/* --poll-us 0: a sleeping loop wakes to the request and the hang-up
	 * together, so most of the hung-up clients go before their answer */
	test_daemon_start(&d, "--dram-size", "16MB", "--hugepages", "off", "--poll-us", "0",
			  "--max-registered-bytes", "64MB", NULL);
	sock = raw_connect(d.socket);
	CHECK_EQ(raw_hello(sock, 1), 0);
	fd = raw_buffer_then_status(sock, big);
	m = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(m != MAP_FAILED);
	m[big - 1] = 7; /* the whole length is there */
	munmap(m, big);
	close(fd);
	close(sock);
	for (int i = 0; i < 20; i++) {
		Kvc__Request q = KVC__REQUEST__INIT;
		Kvc__BufferReq bq = KVC__BUFFER_REQ__INIT;

		sock = raw_connect(d.socket);
		CHECK_EQ(raw_hello(sock, 1), 0);
		q.op = KVC__OP__OP_BUFFER_ALLOC;
		q.body_case = KVC__REQUEST__BODY_BUFFER;
		bq.size = big;
		q.buffer = &bq;
		raw_send_msg(sock, WIRE_REQUEST, &q.base);
		close(sock); /* before the answer */
	}
	CHECK_EQ(kvc_connect(d.socket, &c), 0);
	/* the hung-up clients' jobs end on their own time: a few tries */
	for (int i = 0; i < 200 && r == -ENOSPC; i++) {
		r = kvc_buffer_alloc(c, big, &b);
		if (r == -ENOSPC)
			usleep(10000);
	}
	CHECK_EQ(r, 0);
	CHECK_EQ(kvc_buffer_alloc(c, big, &b2), -ENOSPC); /* and the limit still holds */
	memset(b.data, 0x5a, big);
	CHECK_EQ(kvc_put_from(c, "mapped-later", &b, big - 4096, 4096, NULL), 0);
	CHECK_EQ(kvc_get_into(c, "mapped-later", &b, 0, 4096), 4096);
	CHECK_EQ(((uint8_t *) b.data)[0], 0x5a);
	CHECK_EQ(kvc_buffer_free(c, &b), 0);
	kvc_disconnect(c);
	test_daemon_stop(&d);
}

/* ---- a lookup of a key being stored waits for its commit ---- */

struct lookup_job {
	const char *sock;
	int op;       /* 0 exists, 1 prefix lookup (after a present key), 2 batch exists */
	const char *key;
	int result;
	int done;     /* atomic */
};

static void *lookup_main(void *u)
{
	struct lookup_job *j = u;
	struct kvc_client *c;
	const char *keys[2] = { "pw-present", j->key };
	uint8_t there[1] = { 9 };

	CHECK_EQ(kvc_connect(j->sock, &c), 0);
	if (j->op == 0)
		j->result = kvc_exists(c, j->key);
	else if (j->op == 1)
		j->result = kvc_prefix_lookup(c, keys, 2);
	else
		j->result = kvc_batch_exists(c, &keys[1], 1, there) < 0 ? -1 : there[0];
	kvc_disconnect(c);
	__atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* A prefix lookup of n keys on a client of its own. */
struct prefix_job {
	const char *sock;
	const char *const *keys;
	size_t n;
	int result;
};

static void *prefix_main(void *u)
{
	struct prefix_job *j = u;
	struct kvc_client *c;

	CHECK_EQ(kvc_connect(j->sock, &c), 0);
	j->result = kvc_prefix_lookup(c, j->keys, j->n);
	kvc_disconnect(c);
	return NULL;
}

/* Reserve key on c, start a lookup of it on another client, see that it
 * waits (it has not answered 200 ms later: a lookup that did not wait
 * answers in microseconds), then end the put (commit or abort). */
static int lookup_during_put(struct kvc_client *c, const char *sock, int op, const char *key,
			     bool commit)
{
	struct lookup_job j = { sock, op, key, -100, 0 };
	struct kvc_buf b;
	pthread_t t;

	CHECK_EQ(kvc_reserve(c, key, 4096, NULL, &b), 0);
	CHECK(pthread_create(&t, NULL, lookup_main, &j) == 0);
	usleep(200 * 1000);
	CHECK_EQ(__atomic_load_n(&j.done, __ATOMIC_ACQUIRE), 0);
	memset(b.data, 7, b.len);
	if (commit)
		CHECK_EQ(kvc_commit(c, &b), 0);
	else
		CHECK_EQ(kvc_abort(c, &b), 0);
	CHECK(pthread_join(t, NULL) == 0);
	return j.result;
}

static void test_lookup_waits_for_put(struct kvc_client *c, const char *sock)
{
	struct test_daemon d;
	struct kvc_client *c2;
	struct lookup_job j = { NULL, 0, "pw-late", -100, 0 };
	struct kvc_buf b;
	uint64_t waits0 = test_counter(c, "lookup_waits");

	CHECK_EQ(kvc_put(c, "pw-present", "x", 1, NULL), 0);
	CHECK_EQ(lookup_during_put(c, sock, 0, "pw-1", true), 1);
	CHECK_EQ(lookup_during_put(c, sock, 1, "pw-2", true), 2);
	CHECK_EQ(lookup_during_put(c, sock, 2, "pw-3", true), 1);
	/* an aborted put: the lookup misses */
	CHECK_EQ(lookup_during_put(c, sock, 0, "pw-4", false), 0);
	CHECK_EQ(lookup_during_put(c, sock, 1, "pw-5", false), 1);
	CHECK_EQ(test_counter(c, "lookup_waits") - waits0, 5);
	/* a client's lookup of its own put in progress does not wait for itself */
	{
		struct kvc_buf own;

		CHECK_EQ(kvc_reserve(c, "pw-own", 4096, NULL, &own), 0);
		CHECK_EQ(kvc_exists(c, "pw-own"), 0);
		CHECK_EQ(test_counter(c, "lookup_waits") - waits0, 5);
		CHECK_EQ(kvc_commit(c, &own), 0);
		CHECK_EQ(kvc_exists(c, "pw-own"), 1);
	}
	/* a put announced and not yet begun: the lookup waits for it too */
	{
		const char *ann[] = { "pa-1", "pw-present" };
		struct lookup_job aj = { sock, 1, "pa-1", -100, 0 };
		pthread_t t;

		CHECK_EQ(kvc_announce(c, ann, 2), 2);
		CHECK(pthread_create(&t, NULL, lookup_main, &aj) == 0);
		usleep(200 * 1000);
		CHECK_EQ(__atomic_load_n(&aj.done, __ATOMIC_ACQUIRE), 0);
		CHECK_EQ(kvc_put(c, "pa-1", "v", 1, NULL), 0);
		CHECK(pthread_join(t, NULL) == 0);
		CHECK_EQ(aj.result, 2);
		CHECK_EQ(kvc_announce(c, NULL, 0), 0);
		CHECK_EQ(kvc_announce(c, (const char *[]) { "" }, 1), -EINVAL);
	}

	/* a prompt's blocks announced, then stored one put at a time: the
	 * lookup waits for each in turn and finds all four, not the first */
	{
		const char *blocks[] = { "pb-0", "pb-1", "pb-2", "pb-3" };
		struct prefix_job pj = { sock, blocks, 4, -100 };
		uint64_t w0 = test_counter(c, "lookup_waits");
		pthread_t t;

		CHECK_EQ(kvc_announce(c, blocks, 4), 4);
		CHECK(pthread_create(&t, NULL, prefix_main, &pj) == 0);
		usleep(200 * 1000);
		for (int i = 0; i < 4; i++) {
			CHECK_EQ(kvc_put(c, blocks[i], "b", 1, NULL), 0);
			usleep(20 * 1000);
		}
		CHECK(pthread_join(t, NULL) == 0);
		CHECK_EQ(pj.result, 4);
		CHECK_EQ(test_counter(c, "lookup_waits") - w0, 4);
	}

	/* a put that does not land in time: a miss at the deadline, while the
	 * reservation stays open; with 0 a miss at once */
	test_daemon_start(&d, "--dram-size", "16MB", "--hugepages", "off", "--lookup-wait-ms", "300",
			  NULL);
	CHECK_EQ(kvc_connect(d.socket, &c2), 0);
	CHECK_EQ(kvc_reserve(c2, "pw-late", 4096, NULL, &b), 0);
	j.sock = d.socket;
	lookup_main(&j);
	CHECK_EQ(j.result, 0);
	CHECK_EQ(test_counter(c2, "lookup_waits"), 1);
	CHECK_EQ(kvc_commit(c2, &b), 0);
	CHECK_EQ(kvc_exists(c2, "pw-late"), 1);
	/* an announced put that never comes: a miss at the deadline */
	{
		const char *ann[] = { "pa-never" };

		CHECK_EQ(kvc_announce(c2, ann, 1), 1);
		j = (struct lookup_job) { d.socket, 0, "pa-never", -100, 0 };
		lookup_main(&j);
		CHECK_EQ(j.result, 0);
		CHECK_EQ(test_counter(c2, "lookup_waits"), 2);
		usleep(100 * 1000); /* the announcement itself has gone too */
		CHECK_EQ(kvc_exists(c2, "pa-never"), 0);
		CHECK_EQ(test_counter(c2, "lookup_waits"), 2);
	}
	/* the client holding the reservation goes: its waiters miss */
	{
		pid_t pid = fork();

		CHECK(pid >= 0);
		if (pid == 0) {
			struct kvc_client *cc;
			struct kvc_buf bb;

			if (kvc_connect(d.socket, &cc) < 0 || kvc_reserve(cc, "pw-gone", 4096, NULL, &bb) < 0)
				_exit(1);
			pause();
			_exit(0);
		}
		for (int i = 0; i < 2000 && test_counter(c2, "reserves") < 2; i++)
			usleep(10000);
		CHECK_EQ(test_counter(c2, "reserves"), 2);
		j = (struct lookup_job) { d.socket, 0, "pw-gone", -100, 0 };
		{
			pthread_t t;

			CHECK(pthread_create(&t, NULL, lookup_main, &j) == 0);
			usleep(100 * 1000);
			CHECK_EQ(__atomic_load_n(&j.done, __ATOMIC_ACQUIRE), 0);
			kill(pid, SIGKILL);
			CHECK_EQ(test_wait(pid), 128 + SIGKILL);
			CHECK(pthread_join(t, NULL) == 0);
		}
		CHECK_EQ(j.result, 0);
	}
	kvc_disconnect(c2);
	test_daemon_stop(&d);
	test_daemon_start(&d, "--dram-size", "16MB", "--hugepages", "off", "--lookup-wait-ms", "0",
			  NULL);
	CHECK_EQ(kvc_connect(d.socket, &c2), 0);
	CHECK_EQ(kvc_reserve(c2, "pw-now", 4096, NULL, &b), 0);
	CHECK_EQ(kvc_exists(c2, "pw-now"), 0);
	CHECK_EQ(kvc_announce(c2, (const char *[]) { "pa-now" }, 1), 1);
	CHECK_EQ(kvc_exists(c2, "pa-now"), 0);
	CHECK_EQ(test_counter(c2, "lookup_waits"), 0);
	CHECK_EQ(kvc_abort(c2, &b), 0);
	kvc_disconnect(c2);
	test_daemon_stop(&d);
}

int main(int argc, char **argv)
{
	struct kvc_client *c;
	/* argv[1]: the daemon's --poll-us; 0 makes every wait go to sleep,
	 * which exercises the futex and eventfd wake-ups */
	char *poll_us = argc > 1 ? argv[1] : "100";

	test_daemon_start(&td, "--dram-size", "256MB", "--hugepages", "off", "--poll-us", poll_us,
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	test_batch_sg(c);
	test_long_batches(c);
	test_registered(c);
	test_async(c);
	run_threads(c, 4, 300, 100);
	test_threads_and_clients();
	test_hostile_ring(c);
	test_killed_in_flight(c);
	test_large_copies(c);
	test_killed_copying(c);
	test_lookup_waits_for_put(c, td.socket);
	CHECK_EQ(test_counter(c, "errors") > 0, 1); /* the hostile ring's */
	kvc_disconnect(c);
	test_daemon_stop(&td);
	test_buffers_mapped_later();
	return 0;
}
