/* SPDX-License-Identifier: MIT */
/* Loop timers: loop_timer_arm() sets the time, loop_timer_arm_by() only
 * brings it forward, so a stream of later deadlines arming a shared timer
 * never postpones what it already had to do.  No daemon process. */
#include <unistd.h>

#include "loop.h"
#include "helpers.h"

struct rec {
	struct loop *l;
	int calls;
	uint64_t at;
};

static void fired(struct loop_source *s, void *u)
{
	struct rec *r = u;

	(void) s;
	r->calls++;
	r->at = loop_now_ms(r->l);
	loop_quit(r->l);
}

/* Ends a run whose timer never fired. */
static void watchdog(struct loop_source *s, void *u)
{
	(void) s;
	loop_quit(u);
}

/* One idle step that keeps arming the timer 50 ms ahead, as fetches with
 * their own deadlines do. */
struct pusher {
	struct loop_source *timer;
	struct loop *l;
	unsigned armed;
};

static bool push_later(void *u)
{
	struct pusher *p = u;

	loop_timer_arm_by(p->timer, loop_now_ms(p->l) + 50);
	p->armed++;
	return false;
}

/* Run the loop until the timer fires (or the watchdog, 3 s on): it must
 * have fired once more, at want_ms after t0 or later, well before then. */
static void run_until_fired(struct loop *l, struct loop_source *dog, struct rec *r, int calls,
			    uint64_t t0, uint64_t want_ms)
{
	loop_timer_arm(dog, t0 + 3000);
	CHECK_EQ(loop_run(l), 0);
	CHECK_EQ(r->calls, calls);
	CHECK(r->at >= t0 + want_ms && r->at < t0 + 4000);
}

/* A poller that sleeps in its work three times (as a blocking call or a
 * contended lock would), then ends the run. */
struct sleeper {
	struct loop *l;
	int calls;
};

static bool sleep_in_work(void *u)
{
	struct sleeper *z = u;

	if (++z->calls > 3) {
		loop_quit(z->l);
		return false;
	}
	usleep(2000);
	return true;
}

int main(void)
{
	struct loop *l;
	struct loop_source *t, *idle, *dog;
	struct rec r = { 0 };
	struct pusher p = { 0 };
	uint64_t t0;

	CHECK_EQ(loop_new(0, &l), 0);
	r.l = l;
	CHECK_EQ(loop_add_timer(l, fired, &r, &t), 0);
	CHECK_EQ(loop_add_timer(l, watchdog, l, &dog), 0);

	/* arm_by on a disarmed timer arms it; a later one does not move it */
	t0 = loop_now_ms(l);
	loop_timer_arm_by(t, t0 + 30);
	loop_timer_arm_by(t, t0 + 5000);
	run_until_fired(l, dog, &r, 1, t0, 30);

	/* an earlier one does */
	t0 = loop_now_ms(l);
	loop_timer_arm(t, t0 + 5000);
	loop_timer_arm_by(t, t0 + 20);
	run_until_fired(l, dog, &r, 2, t0, 20);

	/* while something keeps arming it later and later, it still fires
	 * at the first time it was given */
	p.timer = t;
	p.l = l;
	CHECK_EQ(loop_add_idle(l, push_later, &p, &idle), 0);
	t0 = loop_now_ms(l);
	loop_timer_arm(t, t0 + 40);
	run_until_fired(l, dog, &r, 3, t0, 40);
	CHECK(p.armed > 0);
	loop_source_free(idle);

	/* a loop that sleeps while it works says so: each of the three */
	{
		struct sleeper z = { .l = l };
		struct loop_source *ps;
		uint64_t before = loop_blocked(l);

		CHECK_EQ(loop_add_poller(l, sleep_in_work, NULL, &z, &ps), 0);
		loop_timer_arm(dog, loop_now_ms(l) + 3000);
		CHECK_EQ(loop_run(l), 0);
		CHECK_EQ(z.calls, 4);
		CHECK(loop_blocked(l) >= before + 3);
		loop_source_free(ps);
	}

	loop_free(l);
	return 0;
}
