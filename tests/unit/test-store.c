/* SPDX-License-Identifier: MIT */
/*
 * The store and eviction, in process: a dram tier in a memfd, an index, a
 * loop that never runs (its clock is read at creation), holders for two
 * "clients".  No daemon process, no sockets.
 *
 *   - put/get semantics: reserve is invisible, commit publishes, a second
 *     commit of the key is -EEXIST, abort gives the space back;
 *   - views pin: a viewed object is neither removed nor evicted, and a
 *     replaced one keeps its bytes until released;
 *   - eviction: least recently used first, soft pins after unpinned ones,
 *     a prefix chain cut from its tail, hard pins never, -ENOSPC only when
 *     nothing is left to give way, each victim found by one look.
 */
#include "tier.h"
#include "helpers.h"
#include "log.h"
#include "store.h"
#include "values.h"

#define KiB 1024u

static struct config cfg;
static struct store st = { .cfg = &cfg };
static char msg[STORE_MSG_MAX];

static int put(struct holder *h, const char *key, uint32_t len, uint32_t flags, const char *parent)
{
	struct put_args a = { .key = key, .key_len = strlen(key), .len = len, .flags = flags,
			      .parent = parent, .parent_len = parent ? strlen(parent) : 0 };
	struct extent x;
	int r = store_reserve(h, &a, &x, msg);

	if (r < 0)
		return r;
	memset((uint8_t *) st.tiers[x.segment].seg.base + x.offset, key[0], len);
	return store_commit(h, x.handle, msg);
}

static bool present(const char *key)
{
	return index_find(&st.index, key, strlen(key), index_hash(key, strlen(key))) != NULL;
}

static void fill(struct holder *h, const char *prefix, int n, uint32_t len)
{
	char key[32];

	for (int i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s%d", prefix, i);
		CHECK_EQ(put(h, key, len, 0, NULL), 0);
	}
}

static void test_put_semantics(struct holder *a, struct holder *b)
{
	struct put_args pa = { .key = "k", .key_len = 1, .len = 100 };
	struct extent xa, xb, v;
	struct fetch *f = NULL;
	uint64_t used = st.tiers[0].alloc.used;

	CHECK_EQ(store_reserve(a, &pa, &xa, msg), 0);
	CHECK(!present("k"));                       /* invisible until commit */
	CHECK_EQ(store_reserve(b, &pa, &xb, msg), 0);
	CHECK_EQ(store_commit(a, xa.handle, msg), 0);
	CHECK_EQ(store_commit(b, xb.handle, msg), -EEXIST); /* exactly one wins */
	CHECK_EQ(store_commit(a, xa.handle, msg), -ESTALE);
	CHECK(present("k"));
	CHECK_EQ(store_acquire(b, "k", 1, false, &v, &f, msg), 0);
	CHECK_EQ(v.len, 100);
	CHECK_EQ(store_remove(&st, "k", 1, true, false, msg), -EBUSY); /* a view, even forced */
	CHECK_EQ(store_release(b, v.handle, msg), 0);
	CHECK_EQ(store_release(b, v.handle, msg), -ESTALE);
	CHECK_EQ(store_remove(&st, "k", 1, false, false, msg), 0);
	CHECK_EQ(store_remove(&st, "k", 1, false, false, msg), -ENOENT);
	CHECK_EQ(store_reserve(a, &pa, &xa, msg), 0);
	CHECK_EQ(store_abort(a, xa.handle, msg), 0);
	CHECK_EQ(st.tiers[0].alloc.used, used);       /* nothing leaked */
	pa.len = UINT64_C(1) << 31;
	CHECK_EQ(store_reserve(a, &pa, &xa, msg), -E2BIG);
	pa.len = 1;
	pa.flags = 1u << 7;
	CHECK_EQ(store_reserve(a, &pa, &xa, msg), -EINVAL);
}

static void test_eviction(struct holder *h)
{
	struct extent v;
	struct fetch *f;
	uint64_t examined = st.stats.evict_examined, evictions;
	uint64_t cap = st.tiers[0].alloc.size;
	int n = (int) (cap / (64 * KiB));

	/* hard pins and a view at the old end of the LRU */
	CHECK_EQ(put(h, "hard", 64 * KiB, WIRE_PUT_HARD_PIN, NULL), 0);
	CHECK_EQ(put(h, "viewed", 64 * KiB, 0, NULL), 0);
	CHECK_EQ(store_acquire(h, "viewed", 6, false, &v, &f, msg), 0);
	CHECK_EQ(put(h, "soft", 64 * KiB, WIRE_PUT_SOFT_PIN, NULL), 0);
	/* a chain root <- mid <- leaf, older than everything below */
	CHECK_EQ(put(h, "root", 64 * KiB, 0, NULL), 0);
	CHECK_EQ(put(h, "mid", 64 * KiB, 0, "root"), 0);
	CHECK_EQ(put(h, "leaf", 64 * KiB, 0, "mid"), 0);
	fill(h, "old", 4, 64 * KiB);
	/* twice the pool: everything unprotected gives way, oldest first */
	fill(h, "new", 2 * n, 64 * KiB);
	evictions = st.stats.evictions;
	CHECK(evictions > (uint64_t) n);
	CHECK(present("hard"));
	CHECK(present("viewed"));
	CHECK(!present("old0"));                    /* least recently used: gone */
	CHECK(present("new" "0") == false);
	{
		char key[32];

		snprintf(key, sizeof(key), "new%d", 2 * n - 1);
		CHECK(present(key));                    /* the newest stays */
	}
	/* the old chain went, cut from its tail; the soft pin stayed, since
	 * an unpinned candidate was always there */
	CHECK(!present("leaf") && !present("mid") && !present("root"));
	CHECK(present("soft"));
	/* each victim was found by looking at one list tail or so */
	CHECK(st.stats.evict_examined - examined <= 3 * (st.stats.evictions - 0) + 8);
	CHECK_EQ(store_release(h, v.handle, msg), 0);
}

/* A prefix chain is cut from its tail: the oldest block (the chain's
 * root) goes last, after its descendants, before newer unrelated ones. */
static void test_chain_order(struct holder *h)
{
	uint64_t freed, n;

	tier_evict(&st, NULL, 0, true, EVICT_MANUAL, &freed, &n);
	CHECK_EQ(put(h, "c0", KiB, 0, NULL), 0);
	CHECK_EQ(put(h, "c1", KiB, 0, "c0"), 0);
	CHECK_EQ(put(h, "c2", KiB, 0, "c1"), 0);
	CHECK_EQ(put(h, "u0", KiB, 0, NULL), 0);
	CHECK_EQ(put(h, "u1", KiB, 0, NULL), 0);
	tier_evict(&st, NULL, 1, false, EVICT_MANUAL, &freed, &n);
	CHECK_EQ(n, 1);
	CHECK(!present("c2") && present("c1") && present("c0"));
	tier_evict(&st, NULL, 1, false, EVICT_MANUAL, &freed, &n);
	CHECK(!present("c1") && present("c0"));
	tier_evict(&st, NULL, 1, false, EVICT_MANUAL, &freed, &n);
	CHECK(!present("c0") && present("u0") && present("u1"));
	tier_evict(&st, NULL, 1, false, EVICT_MANUAL, &freed, &n);
	CHECK(!present("u0") && present("u1"));
}

static void test_enospc(struct holder *h)
{
	struct put_args a = { .key = "big", .key_len = 3 };
	uint64_t freed, n;
	struct extent x;

	/* everything evictable goes; then only the pins and views are left */
	tier_evict(&st, NULL, 0, true, EVICT_MANUAL, &freed, &n);
	CHECK(present("hard"));
	CHECK(!present("soft"));                    /* soft pins go when nothing else is left */
	a.len = st.tiers[0].alloc.size - 32 * KiB;
	CHECK_EQ(store_reserve(h, &a, &x, msg), -ENOSPC);
	CHECK(strstr(msg, "hard-pinned"));
	CHECK_EQ(store_unpin(&st, "hard", 4, msg), 0);
	CHECK_EQ(store_reserve(h, &a, &x, msg), 0);    /* now it gave way */
	CHECK(!present("hard"));
	CHECK_EQ(store_abort(h, x.handle, msg), 0);
}

int main(void)
{
	struct holder a, b;
	uint64_t r, v;

	config_init(&cfg);
	cfg.dram_size = 8 << 20;
	cfg.hugepages = SHM_HUGEPAGES_OFF;
	cfg.lease_ttl_ms = 0; /* leases would protect everything read here */
	log_configure("error");
	CHECK_EQ(loop_new(0, &st.loop), 0);
	CHECK_EQ(index_init(&st.index), 0);
	CHECK_EQ(tiers_init(&st, -1, -1), 0);
	holder_init(&a, &st, NULL);
	holder_init(&b, &st, NULL);

	test_put_semantics(&a, &b);
	test_eviction(&a);
	test_enospc(&a);
	test_chain_order(&a);

	holder_done(&a, &r, &v);
	holder_done(&b, &r, &v);
	CHECK_EQ(r + v, 0);
	tier_evict(&st, NULL, 0, true, EVICT_MANUAL, NULL, NULL);
	tiers_done(&st);
	index_done(&st.index);
	store_wake_puts(&st);
	if (st.reserving.buckets)
		index_done(&st.reserving);
	loop_free(st.loop);
	return 0;
}
