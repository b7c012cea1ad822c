/* SPDX-License-Identifier: MIT */
/* Eight client processes at once put and get values of random size
 * (1 B .. 8 MiB, log-uniform) and check every byte they read back. */
#include <sys/wait.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"

#define CLIENTS 8
#define OPS 120
#define MAX_VALUE (8u << 20)
#define LIVE_BYTES (16u << 20) /* per client: the pool never has to evict */

struct live {
	char key[64];
	size_t len;
	uint64_t seed;
};

static size_t random_size(uint64_t *rs)
{
	/* log-uniform: as many 10-byte values as 1-MiB ones */
	unsigned bits = (unsigned) (test_rand(rs) % 24); /* 0..23 */
	size_t lo = (size_t) 1 << bits, v = lo + test_rand(rs) % lo;

	return v > MAX_VALUE ? MAX_VALUE : v;
}

static int client(const char *sock, int id)
{
	static struct live live[OPS];
	struct kvc_client *c;
	uint8_t *buf = malloc(MAX_VALUE);
	uint64_t rs = (uint64_t) id * 7919 + 1, live_bytes = 0;
	size_t n = 0, first = 0;

	CHECK(buf);
	CHECK_EQ(kvc_connect(sock, &c), 0);
	for (int op = 0; op < OPS; op++) {
		struct live *l = &live[n];
		size_t len = random_size(&rs);
		int mode = (int) (test_rand(&rs) % 3);

		snprintf(l->key, sizeof(l->key), "model@tp_rank:%d@%08d", id, op);
		l->len = len;
		l->seed = (uint64_t) id << 32 | (uint64_t) op;
		/* drop the oldest values to stay within this client's share */
		while (live_bytes + len > LIVE_BYTES && first < n) {
			CHECK_EQ(kvc_remove(c, live[first].key), 0);
			live_bytes -= live[first].len;
			first++;
		}
		if (mode == 0) {
			test_fill(buf, len, l->seed);
			CHECK_EQ(kvc_put(c, l->key, buf, len, NULL), 0);
		} else {
			struct kvc_buf b;

			CHECK_EQ(kvc_reserve(c, l->key, len, NULL, &b), 0);
			test_fill(b.data, len, l->seed);
			CHECK_EQ(kvc_commit(c, &b), 0);
		}
		live_bytes += len;
		n++;
		/* read back a random live value, by copy or by view */
		{
			struct live *r = &live[first + test_rand(&rs) % (n - first)];

			if (test_rand(&rs) & 1) {
				memset(buf, 0, r->len);
				CHECK_EQ(kvc_get(c, r->key, buf, MAX_VALUE), r->len);
				CHECK(test_verify(buf, r->len, r->seed));
			} else {
				struct kvc_view v;

				CHECK_EQ(kvc_acquire(c, r->key, &v), 0);
				CHECK_EQ(v.len, r->len);
				CHECK(test_verify(v.data, v.len, r->seed));
				CHECK_EQ(kvc_release(c, &v), 0);
			}
		}
	}
	/* everything still live reads back exactly */
	for (size_t i = first; i < n; i++) {
		CHECK_EQ(kvc_get(c, live[i].key, buf, MAX_VALUE), live[i].len);
		CHECK(test_verify(buf, live[i].len, live[i].seed));
	}
	kvc_disconnect(c);
	free(buf);
	return 0;
}

int main(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	pid_t pids[CLIENTS];
	struct kvc_status *s;

	test_daemon_start(&td, "--dram-size", "512MB", "--default-kv-lease-ttl", "0", NULL);
	for (int i = 0; i < CLIENTS; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0)
			_exit(client(td.socket, i));
	}
	for (int i = 0; i < CLIENTS; i++)
		CHECK_EQ(test_wait(pids[i]), 0);

	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(test_counter(c, "evictions"), 0);
	CHECK_EQ(test_counter(c, "misses"), 0);
	CHECK_EQ(test_counter(c, "puts"), CLIENTS * OPS);
	CHECK_EQ(test_counter(c, "errors"), 0);
	CHECK_EQ(kvc_status_get(c, &s), 0);
	printf("objects left %llu, dram used %llu\n", (unsigned long long) s->objects,
	       (unsigned long long) s->tiers[0].used);
	CHECK(s->objects > 0);
	kvc_status_free(s);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	return 0;
}
