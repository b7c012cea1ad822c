/* SPDX-License-Identifier: MIT */
/* The public API's semantics against a private daemon. */
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"

static struct test_daemon td;

static void test_put_get(struct kvc_client *c)
{
	char buf[64];
	uint8_t big[10000];

	CHECK_EQ(kvc_put(c, "a", "hello", 5, NULL), 0);
	CHECK_EQ(kvc_get(c, "a", buf, sizeof(buf)), 5);
	CHECK(memcmp(buf, "hello", 5) == 0);
	CHECK_EQ(kvc_exists(c, "a"), 1);
	CHECK_EQ(kvc_exists(c, "b"), 0);
	CHECK_EQ(kvc_get(c, "b", buf, sizeof(buf)), -ENOENT);
	/* immutable: a second put fails, the first value stays */
	CHECK_EQ(kvc_put(c, "a", "world", 5, NULL), -EEXIST);
	CHECK_EQ(kvc_get(c, "a", buf, sizeof(buf)), 5);
	CHECK(memcmp(buf, "hello", 5) == 0);
	/* replace */
	{
		struct kvc_put_opts o = { .flags = KVC_PUT_REPLACE };

		CHECK_EQ(kvc_put(c, "a", "world!", 6, &o), 0);
		CHECK_EQ(kvc_get(c, "a", buf, sizeof(buf)), 6);
		CHECK(memcmp(buf, "world!", 6) == 0);
	}
	/* buffer too small: nothing copied */
	memset(buf, 'x', sizeof(buf));
	CHECK_EQ(kvc_get(c, "a", buf, 3), -ENOBUFS);
	CHECK_EQ(buf[0], 'x');
	/* remove */
	CHECK_EQ(kvc_remove(c, "a"), 0);
	CHECK_EQ(kvc_remove(c, "a"), -ENOENT);
	CHECK_EQ(kvc_exists(c, "a"), 0);

	test_fill(big, sizeof(big), 99);
	CHECK_EQ(kvc_put(c, "big", big, sizeof(big), NULL), 0);
	memset(big, 0, sizeof(big));
	CHECK_EQ(kvc_get(c, "big", big, sizeof(big)), sizeof(big));
	CHECK(test_verify(big, sizeof(big), 99));
	CHECK_EQ(kvc_remove(c, "big"), 0);
}

/* kvc_get_alloc: the buffer is asked for once the length is known */
struct alloc_calls {
	unsigned calls;
	size_t len;
	void *give;
};

static void *alloc_calls(void *ctx, size_t len)
{
	struct alloc_calls *a = ctx;

	a->calls++;
	a->len = len;
	return a->give;
}

static void test_get_alloc(struct kvc_client *c)
{
	uint8_t big[10000], out[10000];
	struct alloc_calls a = { .give = out };
	void *got = NULL;

	test_fill(big, sizeof(big), 7);
	CHECK_EQ(kvc_put(c, "ga", big, sizeof(big), NULL), 0);
	CHECK_EQ(kvc_get_alloc(c, "ga", alloc_calls, &a, &got), (ssize_t) sizeof(big));
	CHECK(got == out && a.calls == 1 && a.len == sizeof(big));
	CHECK(test_verify(out, sizeof(out), 7));
	/* a miss asks for nothing */
	a = (struct alloc_calls) { .give = out };
	CHECK_EQ(kvc_get_alloc(c, "ga-none", alloc_calls, &a, &got), -ENOENT);
	CHECK(a.calls == 0 && got == NULL);
	/* refused: -ENOMEM */
	a = (struct alloc_calls) { 0 };
	CHECK_EQ(kvc_get_alloc(c, "ga", alloc_calls, &a, &got), -ENOMEM);
	CHECK(a.calls == 1 && got == NULL);
	CHECK_EQ(kvc_get_alloc(c, "ga", NULL, &a, &got), -EINVAL);
	CHECK_EQ(kvc_get_alloc(c, "ga", alloc_calls, &a, NULL), -EINVAL);
	CHECK_EQ(kvc_remove(c, "ga"), 0);
}

/* A get lets its view go without waiting; a removal asked on the socket
 * right after still finds it gone (each round: removed, none skipped). */
static void test_get_then_remove_all(struct kvc_client *c)
{
	char buf[16];

	for (int i = 0; i < 300; i++) {
		uint64_t skipped = 1;

		CHECK_EQ(kvc_put(c, "gr", "value", 5, NULL), 0);
		CHECK_EQ(kvc_get(c, "gr", buf, sizeof(buf)), 5);
		CHECK_EQ(kvc_remove_prefix(c, "gr", 0, &skipped), 1);
		CHECK_EQ(skipped, 0u);
	}
}

/*
 * kvc_batch_put commits each value as its copy ends, not all at the end
 * (what one pushes leaves while the next is copied): the second value's
 * bytes come from pages userfaultfd holds back, and while the library's
 * copy waits on them another client finds the first value committed.
 */
struct held_source {
	int uffd;
	uint8_t *area;
	size_t len;
	int first_seen; /* kvc_exists of the first key at the first fault */
};

static void *serve_faults(void *arg)
{
	struct held_source *h = arg;
	static uint8_t page[4096];
	struct kvc_client *other;
	size_t served = 0;

	CHECK_EQ(kvc_connect(td.socket, &other), 0);
	memset(page, 0x5c, sizeof(page));
	while (served < h->len) {
		struct pollfd p = { .fd = h->uffd, .events = POLLIN };
		struct uffd_msg m;
		struct uffdio_copy cp;

		CHECK_EQ(poll(&p, 1, 10000), 1);
		CHECK_EQ(read(h->uffd, &m, sizeof(m)), (ssize_t) sizeof(m));
		CHECK_EQ(m.event, UFFD_EVENT_PAGEFAULT);
		if (h->first_seen < 0)
			h->first_seen = kvc_exists(other, "bpc-0");
		cp = (struct uffdio_copy) {
			.dst = m.arg.pagefault.address & ~(uint64_t) 4095,
			.src = (uintptr_t) page,
			.len = sizeof(page),
		};
		CHECK_EQ(ioctl(h->uffd, UFFDIO_COPY, &cp), 0);
		served += sizeof(page);
	}
	kvc_disconnect(other);
	return NULL;
}

static void test_batch_put_commits_as_it_copies(struct kvc_client *c)
{
	struct held_source h = { .len = 16 * 4096, .first_seen = -1 };
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg;
	static uint8_t first[8192];
	const char *keys[2] = { "bpc-0", "bpc-1" };
	struct kvc_iovec iv[2];
	const struct kvc_iovec *iov[2] = { &iv[0], &iv[1] };
	size_t n_iov[2] = { 1, 1 };
	int res[2];
	pthread_t t;
	uint8_t *got;

	h.uffd = (int) syscall(SYS_userfaultfd, O_CLOEXEC);
	if (h.uffd < 0 || ioctl(h.uffd, UFFDIO_API, &api) < 0) {
		printf("no userfaultfd here (%s): batch put's commit order not checked\n",
		       strerror(errno));
		if (h.uffd >= 0)
			close(h.uffd);
		return;
	}
	h.area = mmap(NULL, h.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(h.area != MAP_FAILED);
	reg = (struct uffdio_register) {
		.range = { .start = (uintptr_t) h.area, .len = h.len },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	CHECK_EQ(ioctl(h.uffd, UFFDIO_REGISTER, &reg), 0);
	memset(first, 0x3a, sizeof(first));
	iv[0] = (struct kvc_iovec) { first, sizeof(first) };
	iv[1] = (struct kvc_iovec) { h.area, h.len };
	CHECK_EQ(pthread_create(&t, NULL, serve_faults, &h), 0);
	CHECK_EQ(kvc_batch_put(c, 2, keys, iov, n_iov, NULL, res), 2);
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK(res[0] == 0 && res[1] == 0);
	CHECK_EQ(h.first_seen, 1); /* committed while the second was copied */
	got = malloc(h.len);
	CHECK(got != NULL);
	CHECK_EQ(kvc_get(c, "bpc-1", got, h.len), (ssize_t) h.len);
	for (size_t i = 0; i < h.len; i++)
		CHECK_EQ(got[i], 0x5c);
	free(got);
	munmap(h.area, h.len);
	close(h.uffd);
	CHECK_EQ(kvc_remove(c, "bpc-0"), 0);
	CHECK_EQ(kvc_remove(c, "bpc-1"), 0);
}

static void test_bad_args(struct kvc_client *c)
{
	char key[600];
	char buf[8];

	memset(key, 'k', sizeof(key));
	key[512] = '\0';
	CHECK_EQ(kvc_put(c, key, "x", 1, NULL), -EINVAL); /* 512 bytes */
	key[511] = '\0';
	CHECK_EQ(kvc_put(c, key, "x", 1, NULL), 0);       /* 511 bytes is fine */
	CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), 1);
	CHECK_EQ(kvc_remove(c, key), 0);
	CHECK_EQ(kvc_put(c, "", "x", 1, NULL), -EINVAL);
	CHECK_EQ(kvc_put(c, NULL, "x", 1, NULL), -EINVAL);
	CHECK_EQ(kvc_put(c, "k", "x", 0, NULL), -EINVAL);
	CHECK_EQ(kvc_put(c, "k", NULL, 1, NULL), -EINVAL);
	CHECK_EQ(kvc_exists(c, ""), -EINVAL);
	{
		struct kvc_put_opts o = { .flags = 1u << 20 };

		CHECK_EQ(kvc_put(c, "k", "x", 1, &o), -EINVAL);
		CHECK(strstr(kvc_last_error_msg(), "flags"));
		o = (struct kvc_put_opts) { .tier = KVC_TIER_DISK };
		CHECK_EQ(kvc_put(c, "k", "x", 1, &o), -EINVAL);
		CHECK(strstr(kvc_last_error_msg(), "tier"));
	}
	/* larger than the pool (64 MiB here) and larger than any value */
	{
		struct kvc_buf b;

		CHECK_EQ(kvc_reserve(c, "huge", 65 << 20, NULL, &b), -E2BIG);
		CHECK(strstr(kvc_last_error_msg(), "larger than"));
		CHECK_EQ(kvc_reserve(c, "huge", (size_t) KVC_VALUE_MAX + 1, NULL, &b), -E2BIG);
	}
	CHECK_EQ(kvc_exists(c, "k"), 0);
}

static void test_reserve_commit(struct kvc_client *c)
{
	struct kvc_buf b, b2;
	struct kvc_view v;
	uint64_t used0 = test_tier_used(c, "dram");

	CHECK_EQ(kvc_reserve(c, "r1", 4096, NULL, &b), 0);
	CHECK_EQ(b.len, 4096);
	CHECK(test_tier_used(c, "dram") >= used0 + 4096);
	/* reserved objects are invisible */
	CHECK_EQ(kvc_exists(c, "r1"), 0);
	test_fill(b.data, b.len, 1);
	CHECK_EQ(kvc_commit(c, &b), 0);
	CHECK_EQ(kvc_exists(c, "r1"), 1);
	CHECK_EQ(kvc_acquire(c, "r1", &v), 0);
	CHECK_EQ(v.len, 4096);
	CHECK(test_verify(v.data, v.len, 1));
	/* a viewed object cannot be removed */
	CHECK_EQ(kvc_remove(c, "r1"), -EBUSY);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_release(c, &v), -EINVAL); /* handle cleared */
	CHECK_EQ(kvc_remove(c, "r1"), 0);

	/* abort gives the space back */
	CHECK_EQ(kvc_reserve(c, "r2", 1 << 20, NULL, &b), 0);
	CHECK_EQ(kvc_abort(c, &b), 0);
	CHECK_EQ(kvc_exists(c, "r2"), 0);
	CHECK_EQ(test_tier_used(c, "dram"), used0);

	/* two reservations of one key: the first commit wins, the second
	 * gets -EEXIST and its space is released */
	CHECK_EQ(kvc_reserve(c, "r3", 100, NULL, &b), 0);
	CHECK_EQ(kvc_reserve(c, "r3", 200, NULL, &b2), 0);
	memset(b.data, 1, 100);
	memset(b2.data, 2, 200);
	CHECK_EQ(kvc_commit(c, &b2), 0);
	CHECK_EQ(kvc_commit(c, &b), -EEXIST);
	CHECK_EQ(kvc_acquire(c, "r3", &v), 0);
	CHECK_EQ(v.len, 200);
	CHECK_EQ(((const uint8_t *) v.data)[199], 2);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_remove(c, "r3"), 0);
	CHECK_EQ(test_tier_used(c, "dram"), used0);

	/* a forged handle is refused */
	b = (struct kvc_buf) { .handle = 0xdead00000001ull };
	CHECK_EQ(kvc_commit(c, &b), -ESTALE);
	v = (struct kvc_view) { .handle = 12345 };
	CHECK_EQ(kvc_release(c, &v), -ESTALE);
}

static void test_replace_while_viewed(struct kvc_client *c)
{
	struct kvc_put_opts o = { .flags = KVC_PUT_REPLACE };
	struct kvc_view v;
	char buf[8];

	CHECK_EQ(kvc_put(c, "rv", "old!", 4, NULL), 0);
	CHECK_EQ(kvc_acquire(c, "rv", &v), 0);
	CHECK_EQ(kvc_put(c, "rv", "new!", 4, &o), 0);
	/* the view still sees the bytes it pinned */
	CHECK(memcmp(v.data, "old!", 4) == 0);
	CHECK_EQ(kvc_get(c, "rv", buf, sizeof(buf)), 4);
	CHECK(memcmp(buf, "new!", 4) == 0);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_remove(c, "rv"), 0);
}

static void test_batch(struct kvc_client *c)
{
	char names[100][32];
	const char *keys[100];
	uint8_t present[100];

	for (int i = 0; i < 100; i++) {
		snprintf(names[i], sizeof(names[i]), "model@tp_rank:0@%04d", i);
		keys[i] = names[i];
	}
	for (int i = 0; i < 40; i++)
		CHECK_EQ(kvc_put(c, keys[i], &i, sizeof(i), NULL), 0);
	CHECK_EQ(kvc_put(c, keys[60], "x", 1, NULL), 0);
	CHECK_EQ(kvc_prefix_lookup(c, keys, 100), 40);
	CHECK_EQ(kvc_prefix_lookup(c, keys, 10), 10);
	CHECK_EQ(kvc_prefix_lookup(c, keys + 40, 60), 0);
	CHECK_EQ(kvc_prefix_lookup(c, keys, 0), 0);
	CHECK_EQ(kvc_batch_exists(c, keys, 100, present), 41);
	for (int i = 0; i < 100; i++)
		CHECK_EQ(present[i], i < 40 || i == 60);
	/* listing with a prefix */
	{
		struct kvc_key_info *v;
		size_t n;
		uint64_t total;

		CHECK_EQ(kvc_list(c, "model@tp_rank:0@00", 5, &v, &n, &total), 0);
		CHECK_EQ(n, 5);
		CHECK_EQ(total, 41 < 100 ? 41 : 0); /* keys 0000..0039 and 0060 */
		for (size_t i = 0; i < n; i++) {
			CHECK(strncmp(v[i].key, "model@tp_rank:0@00", 18) == 0);
			CHECK_EQ(v[i].state, KVC_STATE_COMMITTED);
			CHECK_EQ(v[i].tier, KVC_TIER_DRAM);
		}
		kvc_list_free(v);
		/* one key by name: that key alone, not those it begins */
		CHECK_EQ(kvc_list_key(c, keys[6], &v, &n), 0);
		CHECK_EQ(n, 1);
		CHECK(strcmp(v[0].key, keys[6]) == 0);
		CHECK_EQ(v[0].state, KVC_STATE_COMMITTED);
		kvc_list_free(v);
		CHECK_EQ(kvc_list_key(c, "model@tp_rank:0@00", &v, &n), 0);
		CHECK_EQ(n, 0);
		kvc_list_free(v);
		CHECK_EQ(kvc_list_key(c, keys[50], &v, &n), 0); /* not stored */
		CHECK_EQ(n, 0);
		kvc_list_free(v);
		CHECK_EQ(kvc_list_key(c, "", &v, &n), -EINVAL);
	}
	for (int i = 0; i < 40; i++)
		CHECK_EQ(kvc_remove(c, keys[i]), 0);
	CHECK_EQ(kvc_remove(c, keys[60]), 0);
}

struct race {
	int id;
	int result;
};

static void *racer(void *arg)
{
	struct race *r = arg;
	struct kvc_client *c;
	char v[64];

	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	memset(v, 'A' + r->id, sizeof(v));
	r->result = kvc_put(c, "contended", v, sizeof(v), NULL);
	kvc_disconnect(c);
	return NULL;
}

static void test_concurrent_same_key(struct kvc_client *c)
{
	for (int round = 0; round < 20; round++) {
		pthread_t t[4];
		struct race r[4];
		int ok = 0, exist = 0;
		char buf[64];

		for (int i = 0; i < 4; i++) {
			r[i] = (struct race) { .id = i };
			CHECK(pthread_create(&t[i], NULL, racer, &r[i]) == 0);
		}
		for (int i = 0; i < 4; i++) {
			pthread_join(t[i], NULL);
			ok += r[i].result == 0;
			exist += r[i].result == -EEXIST;
		}
		CHECK_EQ(ok, 1);
		CHECK_EQ(exist, 3);
		CHECK_EQ(kvc_get(c, "contended", buf, sizeof(buf)), 64);
		for (int i = 0; i < 4; i++)
			if (r[i].result == 0)
				CHECK_EQ(buf[0], 'A' + i);
		CHECK_EQ(kvc_remove(c, "contended"), 0);
	}
}

static void test_many_threads_one_client(struct kvc_client *c);

struct mt {
	struct kvc_client *c;
	int id;
};

static void *mt_worker(void *arg)
{
	struct mt *m = arg;
	uint8_t buf[3000];

	for (int i = 0; i < 200; i++) {
		char key[64];
		size_t len = 1 + (size_t) (i * 13 + m->id) % sizeof(buf);

		snprintf(key, sizeof(key), "mt-%d-%d", m->id, i);
		test_fill(buf, len, (uint64_t) (m->id * 1000 + i));
		CHECK_EQ(kvc_put(m->c, key, buf, len, NULL), 0);
		memset(buf, 0, sizeof(buf));
		CHECK_EQ(kvc_get(m->c, key, buf, sizeof(buf)), len);
		CHECK(test_verify(buf, len, (uint64_t) (m->id * 1000 + i)));
		CHECK_EQ(kvc_remove(m->c, key), 0);
	}
	return NULL;
}

static void test_many_threads_one_client(struct kvc_client *c)
{
	pthread_t t[4];
	struct mt m[4];

	for (int i = 0; i < 4; i++) {
		m[i] = (struct mt) { c, i };
		CHECK(pthread_create(&t[i], NULL, mt_worker, &m[i]) == 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
}

static void test_status(struct kvc_client *c)
{
	struct kvc_status *s;

	CHECK_EQ(kvc_put(c, "s1", "abc", 3, NULL), 0);
	CHECK_EQ(kvc_status_get(c, &s), 0);
	CHECK(strcmp(s->socket, td.socket) == 0);
	CHECK_EQ(s->objects, 1);
	CHECK_EQ(s->clients, 1);
	CHECK_EQ(s->pid, td.pid);
	CHECK_EQ(s->n_tiers, 1);
	CHECK(strcmp(s->tiers[0].name, "dram") == 0);
	CHECK_EQ(s->tiers[0].capacity, 64 << 20);
	CHECK_EQ(s->tiers[0].objects, 1);
	CHECK(s->tiers[0].used >= 3);
	kvc_status_free(s);
	CHECK_EQ(kvc_remove(c, "s1"), 0);
}

static void test_stats(struct kvc_client *c)
{
	uint64_t puts = test_counter(c, "puts"), hits = test_counter(c, "hits");
	uint64_t misses = test_counter(c, "misses"), in = test_counter(c, "bytes_in");
	char buf[16];

	CHECK_EQ(kvc_put(c, "st", "0123456789", 10, NULL), 0);
	CHECK_EQ(kvc_get(c, "st", buf, sizeof(buf)), 10);
	CHECK_EQ(kvc_get(c, "nope", buf, sizeof(buf)), -ENOENT);
	CHECK_EQ(test_counter(c, "puts"), puts + 1);
	CHECK_EQ(test_counter(c, "hits"), hits + 1);
	CHECK_EQ(test_counter(c, "misses"), misses + 1);
	CHECK_EQ(test_counter(c, "bytes_in"), in + 10);
	CHECK_EQ(kvc_remove(c, "st"), 0);
}

static void test_evict(struct kvc_client *c)
{
	struct kvc_view v;
	uint64_t bytes, objs;
	char key[32];
	struct kvc_put_opts hard = { .flags = KVC_PUT_HARD_PIN };

	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "ev%d", i);
		CHECK_EQ(kvc_put(c, key, key, strlen(key), i == 9 ? &hard : NULL), 0);
	}
	CHECK_EQ(kvc_acquire(c, "ev0", &v), 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &bytes, &objs), 0);
	CHECK_EQ(objs, 8); /* not the viewed one, not the hard-pinned one */
	CHECK_EQ(kvc_exists(c, "ev0"), 1);
	CHECK_EQ(kvc_exists(c, "ev9"), 1);
	CHECK_EQ(kvc_exists(c, "ev5"), 0);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DRAM, 1, 0, &bytes, &objs), 0);
	CHECK_EQ(objs, 1);
	CHECK_EQ(kvc_exists(c, "ev0"), 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEVICE, 1, 0, &bytes, &objs), -EINVAL);
	CHECK_EQ(kvc_remove(c, "ev9"), 0);
}

static void test_full_pool_evicts_lru(struct kvc_client *c)
{
	/* 64 MiB pool: 80 puts of 1 MiB must succeed by dropping the least
	 * recently used; recently read ones survive. */
	static uint8_t buf[1 << 20];
	char key[32];

	for (int i = 0; i < 80; i++) {
		snprintf(key, sizeof(key), "lru%d", i);
		test_fill(buf, sizeof(buf), (uint64_t) i);
		CHECK_EQ(kvc_put(c, key, buf, sizeof(buf), NULL), 0);
		if (i >= 1) /* keep lru0 hot */
			CHECK_EQ(kvc_exists(c, "lru0"), 1);
	}
	CHECK_EQ(kvc_exists(c, "lru0"), 1);
	CHECK_EQ(kvc_exists(c, "lru1"), 0);
	CHECK_EQ(kvc_get(c, "lru79", buf, sizeof(buf)), sizeof(buf));
	CHECK(test_verify(buf, sizeof(buf), 79));
	CHECK(test_counter(c, "evictions") >= 16);
	CHECK_EQ(kvc_evict(c, 0, 0, KVC_EVICT_ALL, NULL, NULL), 0);
}

/* Mooncake's remove(key, force), remove_all, and removal by prefix. */
static void test_remove_parity(void)
{
	struct test_daemon t2;
	struct kvc_client *c;
	struct kvc_view v;
	struct kvc_buf b;
	uint64_t skipped = 99;
	char key[32];

	test_daemon_start(&t2, "--dram-size", "16MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "60000", NULL);
	CHECK_EQ(kvc_connect(t2.socket, &c), 0);
	for (int i = 0; i < 50; i++) {
		snprintf(key, sizeof(key), "%s/%d", i % 2 ? "odd" : "even", i);
		CHECK_EQ(kvc_put(c, key, "v", 1, NULL), 0);
	}
	/* force ignores a lease, never a view */
	CHECK_EQ(kvc_exists(c, "even/0"), 1);
	CHECK_EQ(kvc_remove(c, "even/0"), -EBUSY);
	CHECK_EQ(kvc_remove_force(c, "even/0"), 0);
	CHECK_EQ(kvc_remove_force(c, "even/0"), -ENOENT);
	CHECK_EQ(kvc_acquire(c, "even/2", &v), 0);
	CHECK_EQ(kvc_remove_force(c, "even/2"), -EBUSY);
	CHECK_EQ(kvc_remove_force(c, NULL), -EINVAL);

	/* by prefix: leased ones stay without force, viewed ones always */
	CHECK_EQ(kvc_exists(c, "odd/1"), 1);
	CHECK_EQ(kvc_remove_prefix(c, "odd/", 0, &skipped), 24);
	CHECK_EQ(skipped, 1);
	CHECK_EQ(kvc_exists(c, "odd/1"), 1);
	CHECK_EQ(kvc_exists(c, "even/4"), 1);
	CHECK_EQ(kvc_remove_prefix(c, "odd/", KVC_REMOVE_FORCE, &skipped), 1);
	CHECK_EQ(skipped, 0);
	CHECK_EQ(kvc_remove_prefix(c, "nothing/", 0, NULL), 0);
	CHECK_EQ(kvc_remove_prefix(c, "x", 2, NULL), -EINVAL);

	/* all, with a reservation in progress: it is not an object yet */
	CHECK_EQ(kvc_reserve(c, "pending", 8, NULL, &b), 0);
	CHECK_EQ(kvc_remove_all(c, KVC_REMOVE_FORCE, &skipped), 23); /* even/4..48 but even/2 */
	CHECK_EQ(skipped, 1);
	memcpy(b.data, "complete", 8);
	CHECK_EQ(kvc_commit(c, &b), 0);
	CHECK_EQ(kvc_exists(c, "pending"), 1);
	CHECK_EQ(kvc_release(c, &v), 0);
	CHECK_EQ(kvc_remove_all(c, KVC_REMOVE_FORCE, &skipped), 2);
	CHECK_EQ(skipped, 0);
	CHECK_EQ(test_counter(c, "removes"), 50 + 1);
	kvc_disconnect(c);
	test_daemon_stop(&t2);
}

static bool readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* kvc_completion_fd(): readable exactly while completions wait; closed
 * with the client, its thread stopped. */
static void test_completion_fd(void)
{
	struct kvc_completion done[8];
	struct kvc_client *c;
	struct kvc_op ops[3];
	int fd, n = 0;

	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_put(c, "cfd/a", "abc", 3, NULL), 0);
	fd = kvc_completion_fd(c);
	CHECK(fd > 2);
	CHECK_EQ(kvc_completion_fd(c), fd);
	CHECK(!readable(fd, 0));
	for (int i = 0; i < 3; i++)
		ops[i] = (struct kvc_op) { .opcode = KVC_OP_EXISTS, .key = i ? "cfd/none" : "cfd/a",
					   .user_data = (uint64_t) i + 10 };
	CHECK_EQ(kvc_submit(c, ops, 3), 3);
	CHECK(readable(fd, 10000));
	while (n < 3) {
		int r = kvc_poll(c, done + n, 8 - (size_t) n);

		CHECK(r >= 0);
		n += r;
		if (n < 3)
			CHECK(readable(fd, 10000));
	}
	for (int i = 0; i < 3; i++)
		CHECK_EQ(done[i].res, done[i].user_data == 10 ? 1 : 0);
	/* all reaped: unreadable (the helper may still be on its way) */
	for (int i = 0; i < 100 && readable(fd, 0); i++)
		usleep(1000);
	CHECK(!readable(fd, 0));
	CHECK_EQ(kvc_completion_fd(NULL), -EINVAL);
	kvc_disconnect(c);
	CHECK(fcntl(fd, F_GETFD) < 0 && errno == EBADF); /* closed with the client */
}

/* A listing larger than one slice of the index the daemon walks per
 * request: the keys wanted, and the total over every slice. */
static void test_list_slices(struct kvc_client *c)
{
	enum { MANY = 10000, OTHER = 100 };
	struct kvc_key_info *v;
	uint64_t total;
	size_t n;
	char key[32];

	for (int i = 0; i < MANY + OTHER; i++) {
		snprintf(key, sizeof(key), i < MANY ? "many/%d" : "other/%d", i);
		CHECK_EQ(kvc_put(c, key, "v", 1, NULL), 0);
	}
	CHECK_EQ(kvc_list(c, "many/", 0, &v, &n, &total), 0);
	CHECK_EQ(n, 1000);
	CHECK_EQ(total, MANY);
	for (size_t i = 0; i < n; i++)
		CHECK(strncmp(v[i].key, "many/", 5) == 0 && v[i].size == 1);
	kvc_list_free(v);
	CHECK_EQ(kvc_list(c, "other/", 4096, &v, &n, &total), 0);
	CHECK_EQ(n, OTHER);
	CHECK_EQ(total, OTHER);
	kvc_list_free(v);
	CHECK_EQ(kvc_list(c, NULL, 100000, &v, &n, &total), 0);
	CHECK_EQ(n, 4096); /* the most one listing answers */
	CHECK(total >= MANY + OTHER);
	kvc_list_free(v);
	CHECK_EQ(kvc_remove_prefix(c, "many/", KVC_REMOVE_FORCE, NULL), MANY);
	CHECK_EQ(kvc_remove_prefix(c, "other/", KVC_REMOVE_FORCE, NULL), OTHER);
}

int main(void)
{
	struct kvc_client *c;

	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off",
			  /* these tests remove what they just read */
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	test_put_get(c);
	test_get_alloc(c);
	test_get_then_remove_all(c);
	test_batch_put_commits_as_it_copies(c);
	test_bad_args(c);
	test_reserve_commit(c);
	test_replace_while_viewed(c);
	test_batch(c);
	test_list_slices(c);
	test_concurrent_same_key(c);
	test_many_threads_one_client(c);
	test_status(c);
	test_stats(c);
	test_evict(c);
	test_full_pool_evicts_lru(c);
	test_remove_parity();
	test_completion_fd();
	kvc_disconnect(c);
	test_daemon_stop(&td);
	return 0;
}
