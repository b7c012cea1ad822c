/* SPDX-License-Identifier: MIT */
/* Fetches: one per object however many wait (single flight); every waiter
 * told exactly once, off the list; a waiter that leaves is not told; the
 * next fetch starts afresh.  A fake backend; no daemon process. */
#include "tier.h"
#include "fetch.h"
#include "helpers.h"

static int started, fail_next;

static int fake_fetch(void *be, struct object *o)
{
	(void) be;
	(void) o;
	if (fail_next) {
		fail_next = 0;
		return -EIO;
	}
	started++;
	return 0;
}

static const struct below_ops fake = {
	.version = BELOW_OPS_VERSION,
	.name = "fake",
	.fetch = fake_fetch,
};

struct rec {
	struct waiter w; /* first */
	int calls, res;
};

static void done(struct waiter *w, int res)
{
	struct rec *r = (struct rec *) w;

	r->calls++;
	r->res = res;
	CHECK(!w->fetch); /* off the list before it runs */
}

int main(void)
{
	struct store st = { 0 };
	struct object *o = object_new("k", 1);
	struct rec a = { .w.done = done }, b = { .w.done = done }, c = { .w.done = done };
	struct fetch *f1, *f2;

	CHECK_EQ(loop_new(0, &st.loop), 0);
	CHECK_EQ(store_fetch(&st, o, &f1), -EIO); /* nothing below */
	st.below = (struct below) { &fake, NULL };

	fail_next = 1;
	CHECK_EQ(store_fetch(&st, o, &f1), -EIO); /* the backend could not start */
	CHECK(!o->fetch);

	CHECK_EQ(store_fetch(&st, o, &f1), 0);
	CHECK_EQ(store_fetch(&st, o, &f2), 0);
	CHECK(f1 == f2);                          /* single flight */
	CHECK_EQ(started, 1);
	fetch_wait(f1, &a.w);
	fetch_wait(f1, &b.w);
	fetch_wait(f1, &c.w);
	fetch_unwait(&b.w);                       /* this one went away first */
	fetch_unwait(&b.w);                       /* idempotent */
	fetch_done(&st, o, 0);
	CHECK(!o->fetch);
	CHECK_EQ(a.calls, 1);
	CHECK_EQ(c.calls, 1);
	CHECK_EQ(b.calls, 0);
	CHECK_EQ(a.res, 0);
	fetch_done(&st, o, 0);                     /* nothing left to tell */
	CHECK_EQ(a.calls, 1);

	/* a failure reaches every waiter; the next fetch starts afresh */
	CHECK_EQ(store_fetch(&st, o, &f1), 0);
	CHECK_EQ(started, 2);
	fetch_wait(f1, &a.w);
	fetch_done(&st, o, -EBADMSG);
	CHECK_EQ(a.calls, 2);
	CHECK_EQ(a.res, -EBADMSG);

	/* a waiting room: woken one at a time, the longest waiting first,
	 * whoever left it meanwhile (the oldest, or the newest) */
	{
		struct fetch room = { 0 };
		struct rec d = { .w.done = done };

		a.calls = b.calls = c.calls = 0;
		fetch_wait(&room, &a.w);
		fetch_wait(&room, &b.w);
		fetch_wait(&room, &c.w);
		fetch_wait(&room, &d.w);
		fetch_unwait(&a.w); /* the oldest left */
		fetch_unwait(&d.w); /* and the newest */
		CHECK(fetch_wake_oldest(&room, FETCH_AGAIN));
		CHECK_EQ(b.calls, 1);
		CHECK_EQ(b.res, FETCH_AGAIN);
		CHECK_EQ(c.calls, 0);
		CHECK(fetch_wake_oldest(&room, FETCH_AGAIN));
		CHECK_EQ(c.calls, 1);
		CHECK(!fetch_wake_oldest(&room, FETCH_AGAIN));
		CHECK(!room.waiters && !room.oldest);
		CHECK_EQ(a.calls + d.calls, 0);
		fetch_wait(&room, &d.w); /* empty again: it is the oldest */
		CHECK(fetch_wake_oldest(&room, 0));
		CHECK_EQ(d.calls, 1);
	}
	free(o);
	loop_free(st.loop);
	return 0;
}
