/* SPDX-License-Identifier: MIT */
/* Rings: wrap-around, a full ring refusing more, a hostile tail detected,
 * and ordering under two threads (every entry arrives whole, in order). */
#include <pthread.h>

#include "helpers.h"
#include "ring.h"

#define SMALL 8

struct item {
	uint64_t seq;
	uint64_t check[7];
};

static struct shm_ring ring;
static struct item entries[SMALL];

static void test_wrap_and_full(void)
{
	struct ring_side p, c;
	uint64_t next = 0, want = 0;

	memset(&ring, 0, sizeof(ring));
	/* start near the 32-bit wrap of the positions */
	ring.head = ring.tail = UINT32_MAX - 3;
	ring_side_init(&p, &ring, entries, sizeof(struct item), SMALL, ring.tail);
	ring_side_init(&c, &ring, entries, sizeof(struct item), SMALL, ring.head);
	for (int round = 0; round < 100; round++) {
		uint32_t k = (uint32_t) (round % SMALL) + 1;

		CHECK_EQ(ring_space(&p), SMALL);
		CHECK_EQ(ring_ready(&c), 0);
		for (uint32_t i = 0; i < k; i++) {
			struct item *it = ring_entry(&p, p.pos + i);

			it->seq = next++;
		}
		ring_publish(&p, k);
		CHECK_EQ(ring_space(&p), SMALL - k);
		CHECK_EQ(ring_ready(&c), k);
		for (uint32_t i = 0; i < k; i++)
			CHECK_EQ(((struct item *) ring_entry(&c, c.pos + i))->seq, want++);
		ring_consume(&c, k);
	}
	/* full: no space until the consumer gives one back */
	ring_publish(&p, SMALL);
	CHECK_EQ(ring_space(&p), 0);
	CHECK_EQ(ring_ready(&c), SMALL);
	ring_consume(&c, 1);
	CHECK_EQ(ring_space(&p), 1);
	ring_consume(&c, SMALL - 1);

	/* a tail further ahead than the ring is long is impossible */
	ring.tail = c.pos + SMALL + 1;
	CHECK_EQ(ring_ready(&c), -1);
	ring.tail = c.pos - 1; /* behind the consumer */
	CHECK_EQ(ring_ready(&c), -1);
	/* a head the producer cannot have reached reads as full */
	ring.tail = p.pos;
	ring.head = p.pos + 5;
	CHECK_EQ(ring_space(&p), 0);
}

#define BIG 64
#define COUNT 2000000

static struct shm_ring ring2;
static struct item entries2[BIG];

static void *producer(void *arg)
{
	struct ring_side p;

	(void) arg;
	ring_side_init(&p, &ring2, entries2, sizeof(struct item), BIG, 0);
	for (uint64_t seq = 0; seq < COUNT;) {
		uint32_t space = ring_space(&p);

		if (!space) {
			cpu_relax();
			continue;
		}
		for (uint32_t i = 0; i < space && seq < COUNT; i++, seq++) {
			struct item *it = ring_entry(&p, p.pos);

			it->seq = seq;
			for (int k = 0; k < 7; k++)
				it->check[k] = seq * 31 + (uint64_t) k;
			ring_publish(&p, 1);
		}
	}
	return NULL;
}

static void test_two_threads(void)
{
	struct ring_side c;
	pthread_t t;
	uint64_t want = 0;

	memset(&ring2, 0, sizeof(ring2));
	ring_side_init(&c, &ring2, entries2, sizeof(struct item), BIG, 0);
	CHECK(pthread_create(&t, NULL, producer, NULL) == 0);
	while (want < COUNT) {
		int64_t n = ring_ready(&c);

		CHECK(n >= 0 && n <= BIG);
		for (int64_t i = 0; i < n; i++) {
			const struct item *it = ring_entry(&c, c.pos + (uint32_t) i);

			/* release/acquire: the payload written before the
			 * tail was published is all there */
			CHECK_EQ(it->seq, want);
			for (int k = 0; k < 7; k++)
				CHECK_EQ(it->check[k], want * 31 + (uint64_t) k);
			want++;
		}
		if (n)
			ring_consume(&c, (uint32_t) n);
		else
			cpu_relax();
	}
	pthread_join(t, NULL);
	printf("%d entries passed in order between two threads\n", COUNT);
}

static void test_need_wakeup(void)
{
	struct shm_ring r = { 0 };

	CHECK(!ring_peer_sleeping(&r));
	ring_set_need_wakeup(&r, true);
	CHECK(ring_peer_sleeping(&r));
	ring_set_need_wakeup(&r, false);
	CHECK(!ring_peer_sleeping(&r));
}

int main(void)
{
	test_wrap_and_full();
	test_need_wakeup();
	test_two_threads();
	return 0;
}
