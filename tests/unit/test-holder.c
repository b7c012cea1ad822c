/* SPDX-License-Identifier: MIT */
/* Holders: handles name exactly one live slot; a released, foreign, forged
 * or wrong-kind handle names nothing; holder_done() gives everything back
 * and counts it.  No daemon process. */
#include "tier.h"
#include "helpers.h"
#include "holder.h"

static int buffers_released;

static void release_buffer(struct holder *h, void *buf)
{
	(void) h;
	CHECK(buf == &buffers_released);
	buffers_released++;
}

static const struct holder_ops ops = { .release_buffer = release_buffer };

int main(void)
{
	struct store st = { 0 };
	struct holder h, other;
	uint64_t a, b, c, res, views;
	struct object *o1, *o2, *v;
	uint32_t i;

	CHECK_EQ(loop_new(0, &st.loop), 0); /* object_place() reads its clock */
	holder_init(&h, &st, &ops);
	holder_init(&other, &st, &ops);
	o1 = object_new("r1", 2);
	o2 = object_new("r2", 2);
	v = object_new("v", 1);
	CHECK(o1 && o2 && v);

	CHECK_EQ(holder_alloc(&h, SLOT_RESERVE, o1, &a), 0);
	CHECK_EQ(holder_alloc(&h, SLOT_BUFFER, &buffers_released, &b), 0);
	CHECK(a != b);
	CHECK(holder_get(&h, a, SLOT_RESERVE, &i) && h.slots[i].obj == o1);
	CHECK(!holder_get(&h, a, SLOT_VIEW, &i));           /* wrong kind */
	CHECK(!holder_get(&other, a, SLOT_RESERVE, &i));    /* another holder's */
	CHECK(!holder_get(&h, 0, SLOT_RESERVE, &i));        /* forged */
	CHECK(!holder_get(&h, (uint64_t) 1 << 32 | 999, SLOT_RESERVE, &i));

	/* a released slot's handle is stale, even when the slot is reused */
	CHECK(holder_get(&h, b, SLOT_BUFFER, &i));
	holder_release(&h, i);
	CHECK_EQ(buffers_released, 1);
	CHECK(!holder_get(&h, b, SLOT_BUFFER, &i));
	CHECK_EQ(holder_alloc(&h, SLOT_RESERVE, o2, &c), 0);
	CHECK((uint32_t) c == (uint32_t) b);                 /* same slot... */
	CHECK(c != b);                                       /* ...new generation */
	CHECK(!holder_get(&h, b, SLOT_RESERVE, &i));

	/* a view: the object's count goes up and comes back */
	v->views++;
	CHECK_EQ(holder_alloc(&h, SLOT_VIEW, v, &b), 0);
	CHECK_EQ(holder_alloc(&h, SLOT_BUFFER, &buffers_released, &b), 0);
	CHECK_EQ(h.used_slots, 4);

	/* hang-up: everything given back (reservations freed, views dropped,
	 * buffers to their owner), and counted */
	holder_done(&h, &res, &views);
	CHECK_EQ(res, 2);
	CHECK_EQ(views, 1);
	CHECK_EQ(v->views, 0);
	CHECK_EQ(buffers_released, 2);
	CHECK_EQ(h.used_slots, 0);
	CHECK(!holder_get(&h, a, SLOT_RESERVE, &i));
	free(v);

	/* the table is bounded */
	for (uint32_t n = 0; n < HOLDER_MAX_SLOTS; n++)
		CHECK_EQ(holder_alloc(&other, SLOT_BUFFER, &buffers_released, &a), 0);
	CHECK_EQ(holder_alloc(&other, SLOT_BUFFER, &buffers_released, &a), -EMFILE);
	buffers_released = 0;
	holder_done(&other, &res, &views);
	CHECK_EQ(buffers_released, HOLDER_MAX_SLOTS);
	CHECK_EQ(res + views, 0);
	loop_free(st.loop);
	return 0;
}
