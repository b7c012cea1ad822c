/* SPDX-License-Identifier: MIT */
/* The offset allocator against a model: random alloc/free sequences keep
 * every live block inside the range, disjoint and aligned; every invariant
 * holds after each step; freeing everything restores one free block. */
#include "helpers.h"
#include "shmem.h"

#define BASE 4096u
#define LIVE_MAX 4096

struct live {
	struct shm_block *b;
	uint64_t req;
};

static int cmp_off(const void *a, const void *b)
{
	uint64_t x = (*(struct shm_block *const *) a)->offset, y = (*(struct shm_block *const *) b)->offset;

	return x < y ? -1 : x > y;
}

static void check_disjoint(struct live *l, size_t n, const struct shm_alloc *a)
{
	static struct shm_block *sorted[LIVE_MAX];
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		sorted[i] = l[i].b;
	qsort(sorted, n, sizeof(sorted[0]), cmp_off);
	for (size_t i = 0; i < n; i++) {
		CHECK(sorted[i]->offset >= a->base);
		CHECK(sorted[i]->offset + sorted[i]->size <= a->base + a->size);
		CHECK(sorted[i]->offset % SHM_ALLOC_ALIGN == 0);
		if (i)
			CHECK(sorted[i - 1]->offset + sorted[i - 1]->size <= sorted[i]->offset);
		sum += sorted[i]->size;
	}
	CHECK_EQ(sum, a->used);
	CHECK_EQ(n, a->n_used);
}

static void test_random(uint64_t seed, uint64_t arena, uint64_t max_req, unsigned steps)
{
	static struct live live[LIVE_MAX];
	struct shm_alloc a;
	size_t n = 0;
	uint64_t rs = seed, nospc = 0;

	CHECK_EQ(shm_alloc_init(&a, BASE, arena), 0);
	for (unsigned step = 0; step < steps; step++) {
		bool do_alloc = n == 0 || (n < LIVE_MAX && test_rand(&rs) % 100 < 55);

		if (do_alloc) {
			uint64_t req = 1 + test_rand(&rs) % max_req;
			struct shm_block *b;
			int r = shm_alloc_block(&a, req, &b);

			if (r == -ENOSPC) {
				/* must be honest: no free block of the aligned size */
				uint64_t need = (req + SHM_ALLOC_ALIGN - 1) & ~(uint64_t) (SHM_ALLOC_ALIGN - 1);

				CHECK(shm_alloc_largest_free(&a) < need ||
				      shm_alloc_largest_free(&a) < need + (need >> SHM_ALLOC_SL_LOG2));
				nospc++;
			} else {
				CHECK_EQ(r, 0);
				CHECK(b->size >= req);
				live[n++] = (struct live) { b, req };
			}
		} else {
			size_t i = test_rand(&rs) % n;

			shm_alloc_free(&a, live[i].b);
			live[i] = live[--n];
		}
		if (step % 64 == 0) {
			CHECK_EQ(shm_alloc_check(&a), 0);
			check_disjoint(live, n, &a);
		}
	}
	CHECK_EQ(shm_alloc_check(&a), 0);
	check_disjoint(live, n, &a);
	while (n)
		shm_alloc_free(&a, live[--n].b);
	CHECK_EQ(shm_alloc_check(&a), 0);
	CHECK_EQ(a.used, 0);
	/* all coalesced back into one block */
	CHECK(a.first && a.first->free && !a.first->next_phys);
	CHECK_EQ(shm_alloc_largest_free(&a), a.size);
	printf("seed %llu: arena %llu, %u steps, %llu ENOSPC\n", (unsigned long long) seed,
	       (unsigned long long) arena, steps, (unsigned long long) nospc);
	shm_alloc_done(&a);
}

static void test_exhaustion(void)
{
	struct shm_alloc a;
	struct shm_block *b[64], *x;
	const uint64_t arena = 64 * 1024;

	CHECK_EQ(shm_alloc_init(&a, BASE, arena), 0);
	CHECK_EQ(shm_alloc_block(&a, 0, &x), -EINVAL);
	CHECK_EQ(shm_alloc_block(&a, arena + 1, &x), -E2BIG);
	/* exactly fill the arena with 64 blocks of 1 KiB */
	for (int i = 0; i < 64; i++)
		CHECK_EQ(shm_alloc_block(&a, 1024, &b[i]), 0);
	CHECK_EQ(a.used, arena);
	CHECK_EQ(shm_alloc_block(&a, 1, &x), -ENOSPC);
	CHECK_EQ(shm_alloc_largest_free(&a), 0);
	/* free every other block: 32 KiB free, but no 2 KiB hole */
	for (int i = 0; i < 64; i += 2)
		shm_alloc_free(&a, b[i]);
	CHECK_EQ(a.used, arena / 2);
	CHECK_EQ(shm_alloc_block(&a, 2048, &x), -ENOSPC);
	CHECK_EQ(shm_alloc_largest_free(&a), 1024);
	CHECK_EQ(shm_alloc_block(&a, 1000, &x), 0); /* fits a hole */
	CHECK_EQ(x->size, 1024);
	shm_alloc_free(&a, x);
	/* freeing a neighbour coalesces three blocks into one 3 KiB hole */
	shm_alloc_free(&a, b[1]);
	CHECK_EQ(shm_alloc_largest_free(&a), 3072);
	CHECK_EQ(shm_alloc_block(&a, 3072, &x), 0);
	CHECK_EQ(x->offset, BASE);
	CHECK_EQ(shm_alloc_check(&a), 0);
	shm_alloc_done(&a);

	/* the whole arena in one block, even when its size is not a list boundary */
	CHECK_EQ(shm_alloc_init(&a, BASE, 1000 * 1000 * 64), 0);
	CHECK_EQ(shm_alloc_block(&a, a.size, &x), 0);
	CHECK_EQ(x->size, a.size);
	shm_alloc_free(&a, x);
	shm_alloc_done(&a);
}

static void test_fragmentation(void)
{
	/* Many small values then one large: after freeing the small ones the
	 * large one fits again, so free space really coalesces. */
	struct shm_alloc a;
	static struct shm_block *b[4096];
	struct shm_block *big;
	const uint64_t arena = 4096 * 256;
	uint64_t rs = 7;

	CHECK_EQ(shm_alloc_init(&a, 0, arena), 0);
	for (int i = 0; i < 4096; i++)
		CHECK_EQ(shm_alloc_block(&a, 256, &b[i]), 0);
	CHECK_EQ(shm_alloc_block(&a, 64, &big), -ENOSPC);
	for (int i = 4095; i > 0; i--) { /* free in random order */
		int j = (int) (test_rand(&rs) % (uint64_t) (i + 1));
		struct shm_block *t = b[i];

		b[i] = b[j];
		b[j] = t;
	}
	for (int i = 0; i < 4096; i++)
		shm_alloc_free(&a, b[i]);
	CHECK_EQ(shm_alloc_check(&a), 0);
	CHECK_EQ(shm_alloc_block(&a, arena, &big), 0);
	shm_alloc_free(&a, big);
	shm_alloc_done(&a);
}

/* A warm start: blocks a first allocator handed out are taken at the
 * same offsets by a second one (ascending, then out of order); overlaps
 * and strays are refused and change nothing; what is left free can be
 * allocated, and freeing everything leaves one free block. */
static void test_take(uint64_t seed)
{
	static struct live l[LIVE_MAX];
	static struct shm_block *taken[LIVE_MAX];
	struct shm_alloc a, b;
	struct shm_block *cur = NULL, *x;
	const uint64_t arena = 8 << 20;
	uint64_t rs = seed;
	size_t n = 0, n_taken = 0;

	CHECK_EQ(shm_alloc_init(&a, BASE, arena), 0);
	for (int i = 0; i < 3000; i++) {
		uint64_t req = 1 + test_rand(&rs) % 9000;

		if (n && test_rand(&rs) % 3 == 0) {
			size_t k = (size_t) (test_rand(&rs) % n);

			shm_alloc_free(&a, l[k].b);
			l[k] = l[--n];
		} else if (n < LIVE_MAX && shm_alloc_block(&a, req, &l[n].b) == 0) {
			l[n++].req = req;
		}
	}
	CHECK(n > 10);
	check_disjoint(l, n, &a); /* sorts nothing in l; sort a copy */
	for (size_t i = 0; i < n; i++)
		taken[i] = l[i].b;
	qsort(taken, n, sizeof(taken[0]), cmp_off);

	CHECK_EQ(shm_alloc_init(&b, BASE, arena), 0);
	CHECK_EQ(shm_alloc_take(&b, BASE + 1, 64, &cur, &x), -EINVAL);
	CHECK_EQ(shm_alloc_take(&b, BASE + arena, 64, &cur, &x), -ERANGE);
	CHECK_EQ(shm_alloc_take(&b, BASE + arena - 64, 128, &cur, &x), -ERANGE);
	CHECK_EQ(shm_alloc_take(&b, 0, 64, &cur, &x), -ERANGE);
	/* every other one in ascending order with a cursor, the rest after,
	 * out of order without one */
	for (size_t i = 0; i < n; i += 2) {
		CHECK_EQ(shm_alloc_take(&b, taken[i]->offset, taken[i]->size, &cur, &x), 0);
		CHECK_EQ(x->offset, taken[i]->offset);
		CHECK_EQ(x->size, taken[i]->size);
		/* the same place again, or a block reaching into it */
		CHECK_EQ(shm_alloc_take(&b, taken[i]->offset, 64, &cur, &x), -EBUSY);
		if (taken[i]->offset >= BASE + 64)
			CHECK_EQ(shm_alloc_take(&b, taken[i]->offset - 64, 128, &cur, &x), -EBUSY);
		n_taken++;
	}
	CHECK_EQ(shm_alloc_check(&b), 0);
	for (size_t i = n - 1 - (n % 2 == 0 ? 0 : 1); i < n; i -= 2) {
		struct shm_block *none = NULL;

		CHECK_EQ(shm_alloc_take(&b, taken[i]->offset, taken[i]->size, &none, &x), 0);
		CHECK_EQ(x->offset, taken[i]->offset);
		n_taken++;
		if (i < 2)
			break;
	}
	CHECK_EQ(n_taken, n);
	CHECK_EQ(b.used, a.used);
	CHECK_EQ(b.n_used, a.n_used);
	CHECK_EQ(shm_alloc_check(&b), 0);
	/* the free space is the same: allocate it all in 64-byte blocks */
	{
		uint64_t left = 0;

		while (shm_alloc_block(&b, 64, &x) == 0)
			left += 64;
		CHECK_EQ(left, arena - a.used);
	}
	shm_alloc_done(&b);
	shm_alloc_done(&a);
}

int main(void)
{
	test_take(5);
	test_take(6);
	test_exhaustion();
	test_fragmentation();
	test_random(1, 1 << 20, 4096, 200000);
	test_random(2, 64 << 20, 8 << 20, 50000);
	test_random(3, (1 << 20) + 4032, 300000, 100000);
	test_random(4, UINT64_C(1) << 36, UINT64_C(1) << 30, 50000);
	return 0;
}
