/* SPDX-License-Identifier: MIT */
/*
 * The event loop (loop.h).  Two epoll sets: the control set holds io
 * sources; the main set, which the loop sleeps on, holds the doorbells and
 * the control set itself.  While the loop is awake it looks at the control
 * set every CTL_LOOK_US (see loop_run()).
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "handoff.h"
#include "log.h"
#include "loop.h"

#define LOG_TOPIC "loop"

enum source_kind {
	SRC_IO,
	SRC_DOORBELL,
	SRC_POLLER,
	SRC_IDLE,
	SRC_TIMER,
};

struct loop_source {
	enum source_kind kind;
	struct loop *loop;
	struct loop_source *next, *prev; /* in its kind's list, or the dead list */
	int fd;
	uint32_t events;
	bool dead;
	loop_io_fn io;
	loop_poll_fn poll;
	loop_sleep_fn sleep;
	loop_timer_fn timer;
	void *userdata;
	usec_t at;                       /* timers: 0 = disarmed */
};

enum { L_IO, L_DOORBELL, L_POLLER, L_IDLE, L_TIMER, L_DEAD, L_COUNT };

struct loop {
	int epfd;     /* what the loop sleeps on: doorbells + ctl_epfd */
	int ctl_epfd; /* io sources */
	uint64_t ctl_looked; /* when the awake loop last looked at ctl_epfd */
	struct loop_source *lists[L_COUNT];
	usec_t now;
	uint64_t longest_turn_us;
	/* how often the loop thread had been preempted at mark_us (wall),
	 * re-read at most every MARK_US while it works: see tick() */
	long preempted;
	long slept;       /* its voluntary switches at mark_us */
	uint64_t mark_us;
	uint64_t longest_busy_us;
	uint64_t blocked; /* stretches of work in which it slept */
	uint64_t spin_us; /* wall time spent spinning with nothing to do */
	uint32_t poll_us, window_us;
	bool (*spin_busy)(void *data); /* loop_set_spin_cap() */
	void *spin_busy_data;
	uint64_t rounds;
	/* loop_client_turn() since the spin decision: a turn to spin after,
	 * one that took a request, the window's client now waiting */
	bool client_spin, client_asked, client_waits;
	const void *client_who; /* whose turn the window runs from */
	/* answers in a row to clients asking from the loop's CPU; when the
	 * loop last moved off one (see step_aside()) */
	unsigned same_cpu;
	bool step;
	uint64_t stepped_us, steps;
	bool quit;
	/* loop_post(): calls from other threads (handoff.h stack), their
	 * eventfd and the sources that run them */
	struct loop_post *posts;
	int post_efd;
	struct loop_source *post_bell, *post_poller;
};

struct loop_post {
	struct loop_post *next;
	void (*fn)(void *data);
	void *data;
};

/* epoll tags of the main set that are not a source */
static char tag_control, tag_doorbell;

/* While spinning: let the sibling hyperthread run. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

void loop_helper_thread(const char *name, enum loop_helper how)
{
	struct sched_param sp = { 0 };
	char full[16];

	snprintf(full, sizeof(full), "kvc-%s", name);
	pthread_setname_np(pthread_self(), full);
	/* lowering one's own priority needs no privilege; failing is harmless */
	if (how == LOOP_HELPER_LOW)
		(void) setpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid), 19); /* this thread */
	else if (how != LOOP_HELPER_NORMAL)
		pthread_setschedparam(pthread_self(),
				      how == LOOP_HELPER_IDLE ? SCHED_IDLE : SCHED_BATCH, &sp);
}

void loop_mm_pause(void)
{
	nanosleep(&(struct timespec) { 0, 50000 }, NULL);
}

/* The loop must not wait for the address space's lock (mapper.h), which
 * brk() and mmap() take for writing: malloc grows the heap 64 MiB at a
 * time, gives memory back only past 256 MiB free, and serves blocks below
 * 64 MiB from it, not from mmap().  (A cluster run saw a node's loop wait
 * in brk() 25 times, up to 10 ms.) */
void loop_tune_malloc(void)
{
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TOP_PAD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

/* How often the scheduler took the CPU from this thread, and how often it
 * gave it up (slept): a system call, so read sparingly (tick()). */
static void thread_switches(long *ret_preempted, long *ret_slept)
{
	struct rusage ru;

	if (getrusage(RUSAGE_THREAD, &ru) == 0) {
		*ret_preempted = ru.ru_nivcsw;
		*ret_slept = ru.ru_nvcsw;
	} else
		*ret_preempted = *ret_slept = -1;
}

static void list_add(struct loop *l, int which, struct loop_source *s)
{
	s->prev = NULL;
	s->next = l->lists[which];
	if (s->next)
		s->next->prev = s;
	l->lists[which] = s;
}

static void list_del(struct loop *l, int which, struct loop_source *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		l->lists[which] = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->next = s->prev = NULL;
}

static int list_of(const struct loop_source *s)
{
	switch (s->kind) {
	case SRC_IO: return L_IO;
	case SRC_DOORBELL: return L_DOORBELL;
	case SRC_POLLER: return L_POLLER;
	case SRC_IDLE: return L_IDLE;
	default: return L_TIMER;
	}
}

static bool posts_run(void *userdata);

int loop_new(uint32_t poll_us, struct loop **ret)
{
	struct loop *l = calloc(1, sizeof(*l));
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &tag_control };
	int r;

	if (!l)
		return -ENOMEM;
	l->poll_us = l->window_us = poll_us;
	l->now = mono_us();
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	l->ctl_epfd = epoll_create1(EPOLL_CLOEXEC);
	l->post_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->epfd < 0 || l->ctl_epfd < 0 || l->post_efd < 0 ||
	    epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->ctl_epfd, &ev) < 0) {
		r = -errno;
		goto fail;
	}
	r = loop_add_doorbell(l, l->post_efd, &l->post_bell);
	if (r == 0)
		r = loop_add_poller(l, posts_run, NULL, l, &l->post_poller);
	if (r < 0)
		goto fail;
	*ret = l;
	return 0;
fail:
	loop_free(l);
	return r;
}

static void source_destroy(struct loop_source *s)
{
	free(s);
}

struct loop *loop_free(struct loop *l)
{
	if (!l)
		return NULL;
	/* calls never run: the loop is gone, and so may be what they name */
	for (struct loop_post *p = handoff_take(&l->posts), *n; p; p = n) {
		n = p->next;
		free(p);
	}
	if (l->post_efd >= 0)
		close(l->post_efd);
	for (int i = 0; i < L_COUNT; i++)
		while (l->lists[i]) {
			struct loop_source *s = l->lists[i];

			list_del(l, i, s);
			source_destroy(s);
		}
	if (l->ctl_epfd >= 0)
		close(l->ctl_epfd);
	if (l->epfd >= 0)
		close(l->epfd);
	free(l);
	return NULL;
}

/* The calls other threads posted, oldest first. */
static bool posts_run(void *userdata)
{
	struct loop *l = userdata;
	struct loop_post *p, *fifo = NULL;

	if (!__atomic_load_n(&l->posts, __ATOMIC_RELAXED))
		return false;
	p = handoff_collect(&l->posts, l->post_efd);
	while (p) {
		struct loop_post *n = p->next;

		p->next = fifo;
		fifo = p;
		p = n;
	}
	while (fifo) {
		p = fifo;
		fifo = p->next;
		p->fn(p->data);
		free(p);
	}
	return true;
}

void loop_run_posted(struct loop *l)
{
	posts_run(l);
}

int loop_post(struct loop *l, void (*fn)(void *data), void *data)
{
	struct loop_post *p = malloc(sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->fn = fn;
	p->data = data;
	handoff_push_wake(&l->posts, p, next, l->post_efd);
	return 0;
}

static struct loop_source *source_new(struct loop *l, enum source_kind kind, void *userdata)
{
	struct loop_source *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->kind = kind;
	s->loop = l;
	s->fd = -1;
	s->userdata = userdata;
	return s;
}

int loop_add_io(struct loop *l, int fd, uint32_t events, loop_io_fn fn, void *userdata,
		struct loop_source **ret)
{
	struct loop_source *s = source_new(l, SRC_IO, userdata);
	struct epoll_event ev = { .events = events };

	if (!s)
		return -ENOMEM;
	s->fd = fd;
	s->events = events;
	s->io = fn;
	ev.data.ptr = s;
	if (epoll_ctl(l->ctl_epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		free(s);
		return r;
	}
	list_add(l, L_IO, s);
	*ret = s;
	return 0;
}

int loop_set_io_events(struct loop_source *s, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = s };

	if (s->dead || s->events == events)
		return 0;
	if (epoll_ctl(s->loop->ctl_epfd, EPOLL_CTL_MOD, s->fd, &ev) < 0)
		return -errno;
	s->events = events;
	return 0;
}

int loop_add_doorbell(struct loop *l, int fd, struct loop_source **ret)
{
	struct loop_source *s = source_new(l, SRC_DOORBELL, NULL);
	/* Edge-triggered and tagged with a shared tag, never the source: a
	 * doorbell only ends a sleep, and it may ring after its owner went
	 * (the peer holding the other end of an eventfd keeps it alive). */
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = &tag_doorbell };

	if (!s)
		return -ENOMEM;
	s->fd = fd;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		free(s);
		return r;
	}
	list_add(l, L_DOORBELL, s);
	*ret = s;
	return 0;
}

int loop_add_poller(struct loop *l, loop_poll_fn poll, loop_sleep_fn sleep, void *userdata,
		    struct loop_source **ret)
{
	struct loop_source *s = source_new(l, SRC_POLLER, userdata);

	if (!s)
		return -ENOMEM;
	s->poll = poll;
	s->sleep = sleep;
	list_add(l, L_POLLER, s);
	*ret = s;
	return 0;
}

int loop_add_idle(struct loop *l, loop_poll_fn fn, void *userdata, struct loop_source **ret)
{
	struct loop_source *s = source_new(l, SRC_IDLE, userdata);

	if (!s)
		return -ENOMEM;
	s->poll = fn;
	list_add(l, L_IDLE, s);
	*ret = s;
	return 0;
}

int loop_add_timer(struct loop *l, loop_timer_fn fn, void *userdata, struct loop_source **ret)
{
	struct loop_source *s = source_new(l, SRC_TIMER, userdata);

	if (!s)
		return -ENOMEM;
	s->timer = fn;
	list_add(l, L_TIMER, s);
	*ret = s;
	return 0;
}

void loop_timer_arm(struct loop_source *s, usec_t at)
{
	s->at = at;
}

void loop_timer_arm_by(struct loop_source *s, usec_t at)
{
	if (!s->at || at < s->at)
		s->at = at;
}

void loop_source_free(struct loop_source *s)
{
	struct loop *l;

	if (!s || s->dead)
		return;
	l = s->loop;
	if (s->kind == SRC_IO)
		epoll_ctl(l->ctl_epfd, EPOLL_CTL_DEL, s->fd, NULL);
	else if (s->kind == SRC_DOORBELL)
		/* explicitly: a peer may hold the same file, which would keep
		 * the registration alive after our fd is closed */
		epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	list_del(l, list_of(s), s);
	s->dead = true;
	list_add(l, L_DEAD, s);
}

/* Sources freed during the turn go now: no event can name them any more. */
static void reap(struct loop *l)
{
	while (l->lists[L_DEAD]) {
		struct loop_source *s = l->lists[L_DEAD];

		list_del(l, L_DEAD, s);
		source_destroy(s);
	}
}

void loop_quit(struct loop *l)
{
	l->quit = true;
}

usec_t loop_now(const struct loop *l)
{
	return l->now;
}

uint64_t loop_longest_turn_us(const struct loop *l)
{
	return l->longest_turn_us;
}

uint64_t loop_blocked(const struct loop *l)
{
	return l->blocked;
}

/*
 * A client that spins for its answer on the CPU the loop runs on holds
 * that CPU while the loop, which would answer it, waits for it: each
 * request then takes the client's whole spin (50 us) and a wake-up.  Two
 * threads that wake each other are often put on one CPU; on a two-CPU
 * node whose data threads kept both CPUs busy, a local client asking for
 * 4 KiB values over and over sat there with B's loop in about one phase of
 * 20,000 requests in six, and its median request took 55-57 us instead
 * of 1.5.  Yielding the CPU instead of spinning (client or loop) costs
 * whole time slices under unrelated load.  So the loop, finding its
 * clients asking from its own CPU, moves to another CPU it is allowed on
 * (and is allowed on all of them again at once: it only leaves).
 */
#define SAME_CPU_ANSWERS 8
#define STEP_GAP_US 10000

void loop_client_cpu(struct loop *l, int cpu)
{
	if (cpu < 0 || cpu != sched_getcpu()) {
		l->same_cpu = 0;
		return;
	}
	if (++l->same_cpu >= SAME_CPU_ANSWERS)
		l->step = true;
}

static void mark(struct loop *l, uint64_t wall_us, bool working);

/* Between turns; *prev: the clock after it (moving is not a turn). */
static void step_aside(struct loop *l, uint64_t *prev)
{
	cpu_set_t allowed, others;
	uint64_t now = *prev = mono_us();
	int cpu = sched_getcpu();

	l->step = false;
	l->same_cpu = 0;
	if (cpu < 0 || now - l->stepped_us < STEP_GAP_US)
		return;
	l->stepped_us = now;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0 || CPU_COUNT(&allowed) < 2 ||
	    !CPU_ISSET(cpu, &allowed))
		return;
	others = allowed;
	CPU_CLR(cpu, &others);
	if (sched_setaffinity(0, sizeof(others), &others) < 0)
		return;
	sched_setaffinity(0, sizeof(allowed), &allowed);
	l->steps++;
	*prev = mono_us();
	mark(l, *prev, false); /* the move waited: not the loop's blocking */
}

uint64_t loop_steps_aside(const struct loop *l)
{
	return l->steps;
}

uint64_t loop_spin_us(const struct loop *l)
{
	return l->spin_us;
}

void loop_set_spin_cap(struct loop *l, bool (*busy)(void *data), void *data)
{
	l->spin_busy = busy;
	l->spin_busy_data = data;
}

/* How long after the window's client turn the loop spins now: the window,
 * or only --poll-us while the helpers want the CPUs (a window stretched to
 * a client that works milliseconds between requests kept a CPU spinning
 * the whole time: on two CPUs, puts pushing 1 MiB values to another node
 * ran at 1.30 GB/s, 1.59-1.72 without the stretch). */
static uint32_t spin_window(const struct loop *l)
{
	if (l->window_us > l->poll_us && l->spin_busy && l->spin_busy(l->spin_busy_data))
		return l->poll_us;
	return l->window_us;
}

/* A spin (begun at *since; 0: none) ends at now: work, or sleep. */
static void spin_end(struct loop *l, uint64_t *since, uint64_t now)
{
	if (*since) {
		l->spin_us += now > *since ? now - *since : 0;
		*since = 0;
	}
}

uint64_t loop_longest_busy_us(const struct loop *l)
{
	return l->longest_busy_us;
}

/* A turn longer than this is checked for preemption; the mark is re-read
 * when it is this old. */
#define MARK_US 100

/* working: since the last mark the loop worked, so a voluntary switch in
 * between was a wait outside epoll_wait() (a lock, a page fault, a
 * blocking call): counted. */
static void mark(struct loop *l, uint64_t wall_us, bool working)
{
	long slept = l->slept;

	thread_switches(&l->preempted, &l->slept);
	if (working && slept >= 0 && l->slept > slept)
		l->blocked++;
	l->mark_us = wall_us;
}

/*
 * The clock, and the longest stretch between two reads of it while the
 * loop works (a turn: polling, callbacks, maintenance).  On a loaded
 * machine most long turns are the thread being preempted, so the longest
 * turn in which it was not is kept apart: the loop's own work, blocking
 * included.  (The thread's CPU clock cannot tell: on this kind of virtual
 * machine it was seen to jump by 1-2 ms between two reads no time apart.)
 * A turn counts when the preemption count read now equals the mark taken
 * at most MARK_US before the turn began: one system call per MARK_US of
 * work, not two per turn; a preemption just before the turn hides it.
 */
static uint64_t tick(struct loop *l, uint64_t *prev)
{
	uint64_t t = mono_us(), turn = t - *prev;

	if (turn > l->longest_turn_us)
		l->longest_turn_us = turn;
	if (turn >= MARK_US) {
		long before = l->preempted;

		mark(l, t, true);
		if (before >= 0 && l->preempted == before && turn > l->longest_busy_us)
			l->longest_busy_us = turn;
	} else if (t - l->mark_us >= MARK_US)
		mark(l, t, true);
	*prev = t;
	l->now = t;
	return t;
}

/* Run every source of a poll-style list (pollers, idle work): true if
 * any did work.  A callback may free sources: the next one is read first. */
static bool run_list(struct loop *l, int which)
{
	bool did = false;

	for (struct loop_source *s = l->lists[which], *next; s; s = next) {
		next = s->next;
		did |= s->poll(s->userdata);
	}
	return did;
}

static bool poll_all(struct loop *l)
{
	return run_list(l, L_POLLER);
}

static void set_sleeping(struct loop *l, bool sleeping)
{
	for (struct loop_source *s = l->lists[L_POLLER]; s; s = s->next)
		if (s->sleep)
			s->sleep(s->userdata, sleeping);
}

static bool idle_all(struct loop *l)
{
	return run_list(l, L_IDLE);
}

/* Timers due now run; returns the ms to sleep until the next one,
 * rounded up (-1: none). */
static int timers(struct loop *l)
{
	usec_t next = 0, left;

	for (struct loop_source *s = l->lists[L_TIMER], *n; s; s = n) {
		n = s->next;
		if (!s->at)
			continue;
		if (s->at <= l->now) {
			s->at = 0;
			s->timer(s, s->userdata); /* may re-arm */
		}
		if (s->at && !s->dead && (!next || s->at < next))
			next = s->at;
	}
	if (!next)
		return -1;
	left = next > l->now ? next - l->now : 0;
	return left < 60 * USEC_PER_SEC ? (int) ((left + USEC_PER_MSEC - 1) / USEC_PER_MSEC) : 60000;
}

/*
 * The control set (sockets: clients' control connections, peers, the
 * master) is in the set the loop sleeps on; while the loop is awake,
 * spinning or working, it looks at the set itself every CTL_LOOK_US, an
 * epoll_wait() that returns at once.  A thread that blocked on the set and
 * raised a flag for the spinning loop used to do this: it cost no system
 * call while spinning, but every control event that came while the loop
 * slept woke that thread too, and then the loop woke it once more to
 * watch again.  On a two-CPU node those wake-ups went to the CPU the work
 * needed: a remote exists took a p50 of 43-47 us with the thread and
 * 20-21 us without it (p90 160-230 us against 25-28 us), and 64 KiB
 * fetches ran a fifth faster.  Each look costs a system call (0.3-0.5
 * us): looking every 20 us raised a single client's exists p99 from 0.32
 * to 0.46 us and its 4 KiB get p99 from 0.48 to 0.63 us; every 100 us
 * left them as they were.  So a peer's request waits up to 100 us when
 * local clients keep the loop awake, and none when it sleeps.  Looking
 * every 10 us was tried once before and undone: a local client and the
 * loop could settle on one CPU and each request then took the client's
 * whole spin; the loop now moves off such a CPU (step_aside()), and
 * phases of local requests while the node fetched read the same with the
 * look as with the thread.
 */
#define CTL_LOOK_US 100

/* Everything ready on the control set: how many were. */
static int dispatch_control(struct loop *l, uint64_t now)
{
	struct epoll_event evs[64];
	int n = epoll_wait(l->ctl_epfd, evs, 64, 0);

	l->ctl_looked = now;
	for (int i = 0; i < n; i++) {
		struct loop_source *s = evs[i].data.ptr;

		/* a callback earlier in this batch may have freed it: freed
		 * sources stay allocated until reap() */
		if (!s->dead)
			s->io(s, s->fd, evs[i].events, s->userdata);
	}
	return n;
}

void loop_client_turn(struct loop *l, enum loop_client what, const void *who)
{
	if (what != LOOP_CLIENT_WAITS) {
		l->client_spin = true;
		l->client_who = who;
	} else if (who == l->client_who) {
		/* the client the window is for waits now; another client's
		 * long wait leaves the window to this one */
		l->client_spin = false;
		l->client_waits = true;
	}
	l->client_asked |= what != LOOP_CLIENT_ANSWERED;
}

/*
 * Spin, then sleep.  The window runs from the last turn that served a local
 * client (loop_client_turn()) in a way it may follow within microseconds: a
 * peer's request, a helper thread's completion or a timer sends the loop
 * back to sleep at once, and so does the window's client when its next
 * request waits on another node.  (Spinning after every event, two nodes on a two-CPU
 * machine took both CPUs from their data threads and a 1 MiB fetch ran at a
 * third of the speed.)  The window adapts: a client's request found soon after the
 * loop went to sleep stretches it to 1.5x the gap since the last client
 * turn (up to 64x --poll-us, for clients that spend milliseconds between
 * requests); a window that passes idle halves it back.  While awake, the
 * loop looks at the control sockets every CTL_LOOK_US (dispatch_control()).
 */
int loop_run(struct loop *l)
{
	const uint32_t base = l->poll_us, max = base * 64;
	struct epoll_event evs[64];
	/* last_work: the last client turn; woke: when the loop last woke
	 * (0 once a client turn came since) */
	uint64_t last_work = mono_us(), prev = last_work, woke = 0, spin_since = 0;
	bool spin = false; /* the last client turn was one to spin after */

	l->quit = false; /* a loop may run again after it quit */
	l->window_us = base;
	l->now = last_work;
	l->client_spin = l->client_asked = l->client_waits = false;
	mark(l, last_work, false);
	while (!l->quit) {
		uint64_t now;
		int n, timeout;

		if (l->step)
			step_aside(l, &prev);

		reap(l);
		if (poll_all(l)) {
			spin_end(l, &spin_since, tick(l, &prev));
			/* maintenance and control sockets keep up under load too */
			if (++l->rounds % 16 == 0)
				idle_all(l);
			timers(l);
			if (prev - l->ctl_looked >= CTL_LOOK_US)
				dispatch_control(l, prev);
			continue;
		}
		now = tick(l, &prev);
		timeout = timers(l);
		if (idle_all(l) || l->quit) { /* a timer may have ended the loop */
			spin_end(l, &spin_since, now);
			continue;
		}
		if (now - l->ctl_looked >= CTL_LOOK_US && dispatch_control(l, now) > 0) {
			spin_end(l, &spin_since, now);
			continue;
		}
		if (l->client_spin || l->client_waits) {
			/* stretched by requests only: an answer to a request
			 * that waited says nothing about the client's pace */
			if (l->client_asked && base && woke && woke - last_work < max) {
				/* a client woke the loop soon after it gave up:
				 * it works between requests for about that gap;
				 * cover it */
				uint64_t gap = woke - last_work, want = gap + gap / 2;

				if (want > l->window_us)
					l->window_us = (uint32_t) (want < max ? want : max);
			}
			woke = 0;
			last_work = now;
			spin = l->client_spin;
			l->client_spin = l->client_asked = l->client_waits = false;
		}
		if (l->step) { /* before it spins or sleeps */
			step_aside(l, &prev);
			now = prev;
		}
		if (base && spin && now - last_work < spin_window(l)) {
			if (!spin_since)
				spin_since = now;
			cpu_relax();
			continue;
		}
		spin_end(l, &spin_since, now);
		if (base && l->window_us > base)
			l->window_us /= 2; /* a whole window went idle */

		set_sleeping(l, true);
		if (poll_all(l)) { /* raced with a submission */
			set_sleeping(l, false);
			tick(l, &prev);
			continue;
		}
		n = epoll_wait(l->epfd, evs, 64, timeout);
		set_sleeping(l, false);
		now = prev = mono_us(); /* sleeping is not a turn */
		mark(l, now, false);
		/* whatever woke us is judged by the time now, not by the time
		 * we went to sleep (leases expire meanwhile) */
		l->now = now;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait failed: %m");
			return -errno;
		}
		woke = now;
		for (int i = 0; i < n; i++)
			if (evs[i].data.ptr == &tag_control)
				dispatch_control(l, now);
		/* doorbells: only a wake-up; the pollers find the work */
	}
	reap(l);
	return 0;
}
