/* SPDX-License-Identifier: MIT */
/* Loop timers: loop_timer_arm() sets the time, loop_timer_arm_by() only
 * brings it forward, so a stream of later deadlines arming a shared timer
 * never postpones what it already had to do; the loop's sleep counter; when
 * it spins and when it sleeps; when it moves off its clients' CPU; a
 * control socket served while it spins; the policies helper threads take.
 * No daemon process. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"

#define MS USEC_PER_MSEC
#include "helpers.h"

struct rec {
	struct loop *l;
	int calls;
	usec_t at;
};

static void fired(struct loop_source *s, void *u)
{
	struct rec *r = u;

	(void) s;
	r->calls++;
	r->at = loop_now(r->l);
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

	loop_timer_arm_by(p->timer, loop_now(p->l) + 50 * MS);
	p->armed++;
	return false;
}

/* Run the loop until the timer fires (or the watchdog, 3 s on): it must
 * have fired once more, at want_ms after t0 or later, well before then. */
static void run_until_fired(struct loop *l, struct loop_source *dog, struct rec *r, int calls,
			    uint64_t t0, uint64_t want_ms)
{
	loop_timer_arm(dog, t0 + 3000 * MS);
	CHECK_EQ(loop_run(l), 0);
	CHECK_EQ(r->calls, calls);
	CHECK(r->at >= t0 + want_ms * MS && r->at < t0 + 4000 * MS);
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

/*
 * The spin policy: a loop whose window is a whole second spins after a turn
 * that served a local client (a request answered, an answer posted), and
 * sleeps at once after anything else: a timer (as a peer's request or a
 * helper's completion would be), or the same client's request that waits
 * on another node (another client's leaves the window running).
 * Each phase is a timer 30 ms after the last; what the loop did in between
 * is read from a poller (how often it polled) and its sleep hook (how often
 * it went to sleep).
 */
struct spin {
	struct loop *l;
	struct loop_source *t;
	unsigned phase;
	uint64_t polls, sleeps, mark_polls, mark_sleeps;
	uint64_t got_polls[8], got_sleeps[8];
};

static bool count_poll(void *u)
{
	((struct spin *) u)->polls++;
	return false;
}

static void count_sleep(void *u, bool sleeping)
{
	if (sleeping)
		((struct spin *) u)->sleeps++;
}

static void spin_phase(struct loop_source *s, void *u)
{
	/* each phase's turn, and whose: client 1 or 2 */
	static const int turn[] = { LOOP_CLIENT_WAITS, -1, LOOP_CLIENT_ASKED, LOOP_CLIENT_WAITS,
				    LOOP_CLIENT_ANSWERED, -1, LOOP_CLIENT_WAITS };
	static const int who[] = { 1, 0, 1, 1, 1, 0, 2 };
	static const int clients[3];
	struct spin *z = u;

	(void) s;
	if (z->phase) {
		/* what the loop did since the last phase's turn */
		z->got_polls[z->phase - 1] = z->polls - z->mark_polls;
		z->got_sleeps[z->phase - 1] = z->sleeps - z->mark_sleeps;
	}
	if (z->phase == sizeof(turn) / sizeof(turn[0])) {
		loop_quit(z->l);
		return;
	}
	if (turn[z->phase] >= 0)
		loop_client_turn(z->l, (enum loop_client) turn[z->phase], &clients[who[z->phase]]);
	z->phase++;
	z->mark_polls = z->polls;
	z->mark_sleeps = z->sleeps;
	loop_timer_arm(z->t, loop_now(z->l) + 30 * MS);
}

static void test_spin_policy(void)
{
	struct spin z = { 0 };
	struct loop_source *ps;

	CHECK_EQ(loop_new(1000000, &z.l), 0);
	CHECK_EQ(loop_add_poller(z.l, count_poll, count_sleep, &z, &ps), 0);
	CHECK_EQ(loop_add_timer(z.l, spin_phase, &z, &z.t), 0);
	loop_timer_arm(z.t, loop_now(z.l) + 1 * MS);
	CHECK_EQ(loop_run(z.l), 0);
	CHECK_EQ(z.phase, 7u);
	/* after a request that waits, and after a timer: asleep at once (a
	 * few polls around the sleep and the wake-up, not a spin) */
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(z.got_sleeps[i], 1u);
		CHECK(z.got_polls[i] <= 8);
	}
	/* after a request answered: spinning the whole 30 ms, never asleep */
	CHECK_EQ(z.got_sleeps[2], 0u);
	CHECK(z.got_polls[2] > 100);
	/* a request that waits ends the spin */
	CHECK_EQ(z.got_sleeps[3], 1u);
	CHECK(z.got_polls[3] <= 8);
	/* an answer posted: spinning again */
	CHECK_EQ(z.got_sleeps[4], 0u);
	CHECK(z.got_polls[4] > 100);
	/* a timer does not end a client's window */
	CHECK_EQ(z.got_sleeps[5], 0u);
	CHECK(z.got_polls[5] > 100);
	/* nor does another client's request that waits */
	CHECK_EQ(z.got_sleeps[6], 0u);
	CHECK(z.got_polls[6] > 100);
	/* four phases of 30 ms (on a clock read in whole ms: at least 29)
	 * spent spinning, counted */
	CHECK(loop_spin_us(z.l) >= 4 * 29000);
	loop_free(z.l);
}

/*
 * The spin cap (loop_set_spin_cap()): a client that asks 20 ms after its
 * last turn, the loop having slept meanwhile, stretches a 2 ms window to
 * 1.5 times that gap, and the loop spins 15 ms after its next request
 * without sleeping; with the helpers busy, it spins only its 2 ms and
 * sleeps.  Phases as in test_spin_policy().
 */
struct capped {
	struct spin z;
	bool busy;
};

static bool helpers_busy(void *u)
{
	return ((struct capped *) u)->busy;
}

static void cap_phase(struct loop_source *s, void *u)
{
	static const int client;
	struct capped *c = u;
	struct spin *z = &c->z;
	static const usec_t next[] = { 20 * MS, 15 * MS, 15 * MS };

	(void) s;
	if (z->phase) {
		z->got_polls[z->phase - 1] = z->polls - z->mark_polls;
		z->got_sleeps[z->phase - 1] = z->sleeps - z->mark_sleeps;
	}
	if (z->phase == 3) {
		loop_quit(z->l);
		return;
	}
	/* 0: a turn to spin after; 1: a request 20 ms later (stretches the
	 * window); 2: the same with the helpers busy */
	c->busy = z->phase == 2;
	loop_client_turn(z->l, z->phase ? LOOP_CLIENT_ASKED : LOOP_CLIENT_ANSWERED, &client);
	z->mark_polls = z->polls;
	z->mark_sleeps = z->sleeps;
	loop_timer_arm(z->t, loop_now(z->l) + next[z->phase++]);
}

static void test_spin_cap(void)
{
	struct capped c = { 0 };
	struct loop_source *ps;

	CHECK_EQ(loop_new(2000, &c.z.l), 0);
	loop_set_spin_cap(c.z.l, helpers_busy, &c);
	CHECK_EQ(loop_add_poller(c.z.l, count_poll, count_sleep, &c.z, &ps), 0);
	CHECK_EQ(loop_add_timer(c.z.l, cap_phase, &c, &c.z.t), 0);
	loop_timer_arm(c.z.t, loop_now(c.z.l) + 1 * MS);
	CHECK_EQ(loop_run(c.z.l), 0);
	CHECK_EQ(c.z.phase, 3u);
	CHECK_EQ(c.z.got_sleeps[0], 1u); /* its 2 ms, then asleep */
	CHECK_EQ(c.z.got_sleeps[1], 0u); /* stretched: 15 ms spinning */
	CHECK(c.z.got_polls[1] > 100);
	CHECK_EQ(c.z.got_sleeps[2], 1u); /* busy helpers: 2 ms, then asleep */
	loop_free(c.z.l);
}

/*
 * Clients asking from the loop's CPU: after SAME_CPU_ANSWERS (8) answers
 * in a row the loop moves to another CPU it may run on, and may run on
 * all of them again; an answer to a client elsewhere starts the count
 * over; it moves at most every 10 ms.  On a machine (or a mask) of one
 * CPU it never moves.
 */
struct stepper {
	struct loop *l;
	struct loop_source *t;
	unsigned phase;
	bool several;          /* allowed on two CPUs or more */
	cpu_set_t allowed;
	uint64_t steps_seen;   /* by the poller */
	uint64_t moved_us[4];  /* when the poller saw each move */
	uint64_t asked_us[5];  /* when each phase's answers were given */
	uint64_t steps[5];
};

static bool watch_steps(void *u)
{
	struct stepper *z = u;

	if (loop_steps_aside(z->l) != z->steps_seen) {
		z->steps_seen = loop_steps_aside(z->l);
		if (z->steps_seen <= 4)
			z->moved_us[z->steps_seen - 1] = mono_us();
	}
	return false;
}

/* n answers to a client on the loop's own CPU (read each time: the
 * thread may move meanwhile) */
static void answers(struct stepper *z, unsigned n)
{
	z->asked_us[z->phase] = mono_us();
	for (unsigned i = 0; i < n; i++)
		loop_client_cpu(z->l, sched_getcpu());
}

static void step_phase(struct loop_source *s, void *u)
{
	struct stepper *z = u;
	cpu_set_t now;

	(void) s;
	CHECK_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
	CHECK(CPU_EQUAL(&now, &z->allowed)); /* as it was, always */
	if (z->phase)
		z->steps[z->phase - 1] = loop_steps_aside(z->l);
	switch (z->phase) {
	case 0: /* seven, one elsewhere (or unknown), seven: no move */
		answers(z, 7);
		loop_client_cpu(z->l, -1);
		answers(z, 7);
		break;
	case 1: /* eight: a move */
	case 2: /* eight more soon after: none, within 10 ms of the move */
	case 3: /* 20 ms later: a move again */
		answers(z, 8);
		break;
	default:
		loop_quit(z->l);
		return;
	}
	loop_timer_arm(z->t, loop_now(z->l) + (z->phase == 1 ? 1 : 20) * MS);
	z->phase++;
}

static void test_step_aside(void)
{
	struct stepper z = { 0 };
	struct loop_source *ps;

	CHECK_EQ(sched_getaffinity(0, sizeof(z.allowed), &z.allowed), 0);
	z.several = CPU_COUNT(&z.allowed) >= 2;
	CHECK_EQ(loop_new(0, &z.l), 0);
	CHECK_EQ(loop_add_poller(z.l, watch_steps, NULL, &z, &ps), 0);
	CHECK_EQ(loop_add_timer(z.l, step_phase, &z, &z.t), 0);
	loop_timer_arm(z.t, loop_now(z.l) + 1 * MS);
	CHECK_EQ(loop_run(z.l), 0);
	CHECK_EQ(z.phase, 4u);
	CHECK_EQ(z.steps[0], 0u);
	if (!z.several) {
		CHECK_EQ(loop_steps_aside(z.l), 0u);
		loop_free(z.l);
		return;
	}
	CHECK_EQ(z.steps[1], 1u);
	/* the second eight came within 10 ms of the move (1 ms later, unless
	 * this machine held the thread back): no move then */
	if (z.asked_us[2] - z.moved_us[0] < 9000)
		CHECK_EQ(z.steps[2], 1u);
	else
		CHECK(z.steps[2] == 1 || z.steps[2] == 2);
	CHECK_EQ(z.steps[3], z.steps[2] + 1);
	CHECK_EQ(z.steps_seen, z.steps[3]);
	loop_free(z.l);
}

/*
 * A control socket that becomes ready while the loop spins for a client is
 * served then, not when the window ends: a loop whose window is a whole
 * second starts spinning (a client's request), another thread makes an
 * io source ready 20 ms later, and the source's callback must run with the
 * loop never having slept.
 */
struct ctl {
	struct loop *l;
	int efd;
	bool asked;
	uint64_t sleeps, sleeps_then, polls_then, polls;
	int calls;
};

static bool ctl_poll(void *u)
{
	struct ctl *z = u;

	z->polls++;
	if (!z->asked) {
		z->asked = true;
		loop_client_turn(z->l, LOOP_CLIENT_ASKED, z);
	}
	return false;
}

static void ctl_sleep(void *u, bool sleeping)
{
	if (sleeping)
		((struct ctl *) u)->sleeps++;
}

static void ctl_ready(struct loop_source *s, int fd, uint32_t revents, void *u)
{
	struct ctl *z = u;
	uint64_t v;

	(void) s;
	(void) revents;
	if (read(fd, &v, sizeof(v)) != sizeof(v))
		return;
	z->calls++;
	z->sleeps_then = z->sleeps;
	z->polls_then = z->polls;
	loop_quit(z->l);
}

static void *ctl_later(void *u)
{
	struct ctl *z = u;
	uint64_t one = 1;

	usleep(20000);
	if (write(z->efd, &one, sizeof(one)) != sizeof(one))
		return NULL;
	return NULL;
}

static void test_control_while_spinning(void)
{
	struct ctl z = { 0 };
	struct loop_source *ps, *io, *dog;
	pthread_t th;

	CHECK_EQ(loop_new(1000000, &z.l), 0);
	z.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	CHECK(z.efd >= 0);
	CHECK_EQ(loop_add_poller(z.l, ctl_poll, ctl_sleep, &z, &ps), 0);
	CHECK_EQ(loop_add_io(z.l, z.efd, EPOLLIN, ctl_ready, &z, &io), 0);
	CHECK_EQ(loop_add_timer(z.l, watchdog, z.l, &dog), 0);
	loop_timer_arm(dog, loop_now(z.l) + 3000 * MS);
	CHECK_EQ(pthread_create(&th, NULL, ctl_later, &z), 0);
	CHECK_EQ(loop_run(z.l), 0);
	pthread_join(th, NULL);
	CHECK_EQ(z.calls, 1);
	CHECK_EQ(z.sleeps_then, 0u); /* found while spinning */
	CHECK(z.polls_then > 100);
	loop_free(z.l);
	close(z.efd);
}

/* A helper thread's name, policy and nice value: work done ahead (the
 * tiers' prefault, a new buffer's) yields to anything that wakes. */
struct helper_probe {
	enum loop_helper how;
	int before, after; /* its policy */
	int nice_before, nice_after;
	char name[16];
};

static void *helper_main(void *arg)
{
	struct helper_probe *h = arg;

	h->before = sched_getscheduler(0);
	h->nice_before = getpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid));
	loop_helper_thread("probe", h->how);
	h->after = sched_getscheduler(0);
	h->nice_after = getpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid));
	if (pthread_getname_np(pthread_self(), h->name, sizeof(h->name)) != 0)
		h->name[0] = '\0';
	return NULL;
}

static void test_helper_policies(void)
{
	static const struct {
		enum loop_helper how;
		int policy, nice;
	} want[] = {
		{ LOOP_HELPER_NORMAL, SCHED_OTHER, 0 },
		{ LOOP_HELPER_BATCH, SCHED_BATCH, 0 },
		{ LOOP_HELPER_LOW, SCHED_OTHER, 19 },
		{ LOOP_HELPER_IDLE, SCHED_IDLE, 0 },
	};
	int nice0 = getpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid));

	if (nice0 != 0) { /* a nice of its own would be inherited: nothing to compare */
		printf("  helper policies: this thread runs at nice %d, not 0: skipped\n", nice0);
		return;
	}

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct helper_probe h = { .how = want[i].how };
		pthread_t th;

		CHECK_EQ(pthread_create(&th, NULL, helper_main, &h), 0);
		pthread_join(th, NULL);
		CHECK_EQ(h.before, SCHED_OTHER);
		CHECK_EQ(h.nice_before, 0);
		CHECK_EQ(h.after, want[i].policy);
		CHECK_EQ(h.nice_after, want[i].nice);
		CHECK(strcmp(h.name, "kvc-probe") == 0);
	}
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
	t0 = loop_now(l);
	loop_timer_arm_by(t, t0 + 30 * MS);
	loop_timer_arm_by(t, t0 + 5000 * MS);
	run_until_fired(l, dog, &r, 1, t0, 30);

	/* an earlier one does */
	t0 = loop_now(l);
	loop_timer_arm(t, t0 + 5000 * MS);
	loop_timer_arm_by(t, t0 + 20 * MS);
	run_until_fired(l, dog, &r, 2, t0, 20);

	/* while something keeps arming it later and later, it still fires
	 * at the first time it was given */
	p.timer = t;
	p.l = l;
	CHECK_EQ(loop_add_idle(l, push_later, &p, &idle), 0);
	t0 = loop_now(l);
	loop_timer_arm(t, t0 + 40 * MS);
	run_until_fired(l, dog, &r, 3, t0, 40);
	CHECK(p.armed > 0);
	loop_source_free(idle);

	/* a loop that sleeps while it works says so: each of the three */
	{
		struct sleeper z = { .l = l };
		struct loop_source *ps;
		uint64_t before = loop_blocked(l);

		CHECK_EQ(loop_add_poller(l, sleep_in_work, NULL, &z, &ps), 0);
		loop_timer_arm(dog, loop_now(l) + 3000 * MS);
		CHECK_EQ(loop_run(l), 0);
		CHECK_EQ(z.calls, 4);
		CHECK(loop_blocked(l) >= before + 3);
		loop_source_free(ps);
	}

	CHECK_EQ(loop_spin_us(l), 0u); /* --poll-us 0 never spins */
	loop_free(l);
	test_spin_policy();
	test_spin_cap();
	test_step_aside();
	test_control_while_spinning();
	test_helper_policies();
	return 0;
}
