/* SPDX-License-Identifier: MIT */
/*
 * The event loop: one thread that runs registered sources and knows nothing
 * of sessions, channels, disks or tiers.
 *
 *   io        a control fd (socket, signalfd): in the set the loop sleeps
 *             on, and looked at every 100 us while the loop is awake (one
 *             epoll_wait() that returns at once); the callback runs on the
 *             loop thread.
 *   doorbell  a wake-only fd (eventfd) in the set the loop sleeps on; never
 *             read, never dereferenced: it only ends a sleep.
 *   poller    polled every turn (rings, completion queues): true if it did
 *             work.  Told before the loop sleeps and after it wakes, so it
 *             can ask its peers to ring (need-wakeup flags).
 *   idle      maintenance, run when the pollers found nothing (and every 16
 *             busy turns); must bound its own work; true if it did some.
 *   timer     a callback at a time, armed and disarmed at will; a sleeping
 *             loop wakes for it.
 *
 * Spin, then sleep: after the last work the loop keeps polling for an
 * adaptive window (--poll-us), because waking a sleeping CPU costs tens of
 * microseconds on these machines while a spinning poller answers in well
 * under one.  loop_source_free() is safe inside any callback: the source is
 * unhooked at once and freed after the turn, so an event already fetched
 * for it is dropped, never dispatched.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "clock.h"

struct loop;
struct loop_source;

typedef void (*loop_io_fn)(struct loop_source *s, int fd, uint32_t revents, void *userdata);
typedef bool (*loop_poll_fn)(void *userdata);
typedef void (*loop_sleep_fn)(void *userdata, bool sleeping);
typedef void (*loop_timer_fn)(struct loop_source *s, void *userdata);

/* poll_us: the spin window after the last work (0 = always sleep). */
int loop_new(uint32_t poll_us, struct loop **ret);
struct loop *loop_free(struct loop *l); /* NULL-safe; frees every source */

int loop_add_io(struct loop *l, int fd, uint32_t events, loop_io_fn fn, void *userdata,
		struct loop_source **ret);
int loop_set_io_events(struct loop_source *s, uint32_t events);
int loop_add_doorbell(struct loop *l, int fd, struct loop_source **ret);
int loop_add_poller(struct loop *l, loop_poll_fn poll, loop_sleep_fn sleep, void *userdata,
		    struct loop_source **ret);
int loop_add_idle(struct loop *l, loop_poll_fn fn, void *userdata, struct loop_source **ret);
int loop_add_timer(struct loop *l, loop_timer_fn fn, void *userdata, struct loop_source **ret);
/* Run the timer once at `at` (mono_us()); 0 disarms it. */
void loop_timer_arm(struct loop_source *s, usec_t at);
/* Run it no later than at: an earlier arming stands.  For a timer that
 * several deadlines share; its callback computes the next one itself. */
void loop_timer_arm_by(struct loop_source *s, usec_t at);
/* Run fn(data) on the loop's thread at its next turn, after the calls
 * posted before it: from any thread, never blocking (malloc aside).  0, or
 * -ENOMEM (not run).  Calls not run when the loop is freed are dropped. */
int loop_post(struct loop *l, void (*fn)(void *data), void *data);
/* The calls posted so far, run now: on the loop's thread once it turns no
 * more (a teardown that waited for the threads that post). */
void loop_run_posted(struct loop *l);
/* Unhook now (an io source leaves its epoll set), free after this turn.
 * The caller may close the fd right after.  NULL-safe. */
void loop_source_free(struct loop_source *s);

int loop_run(struct loop *l);
/* What this turn did for a local client on its shared-memory channel (who:
 * the channel); the control socket is not the fast path and never counts.
 * The loop spins for its --poll-us window after a turn that answered one or
 * took a request it answered (the client may ask again within
 * microseconds), never after a peer's or a helper thread's work; a request
 * that must wait far longer than a wake-up takes (a transfer from another
 * node) ends the window if it was that client's. */
enum loop_client {
	LOOP_CLIENT_ANSWERED,
	LOOP_CLIENT_ASKED,  /* took a request and answered it */
	LOOP_CLIENT_WAITS,  /* took a request that waits */
};
void loop_client_turn(struct loop *l, enum loop_client what, const void *who);
void loop_quit(struct loop *l);

/* How a helper thread is scheduled. */
enum loop_helper {
	LOOP_HELPER_NORMAL, /* as any thread: work someone waits on */
	/* SCHED_BATCH: waking it never preempts the loop, for bulk work
	 * nobody waits on closely (on a machine with few cores the loop's
	 * turns were seen stretched by milliseconds by helpers it had just
	 * woken) */
	LOOP_HELPER_BATCH,
	/* nice 19: work done ahead that clients would otherwise do themselves
	 * (faulting memory in).  A thread that wakes takes the CPU from it,
	 * where a batch thread keeps it until its slice ends, yet it moves on
	 * where others keep the CPUs busy (as SCHED_IDLE it waits for an idle
	 * CPU, and clients meet the untouched pages first) */
	LOOP_HELPER_LOW,
	/* SCHED_IDLE: only CPU time nothing else wants, for work that is
	 * worth doing only then (checksums taken ahead) */
	LOOP_HELPER_IDLE,
};

/* Called first by each helper thread (disk worker, data threads,
 * prefault...): names it for ps/top/perf ("kvc-" + name, at most 15
 * characters in all) and sets how it is scheduled. */
void loop_helper_thread(const char *name, enum loop_helper how);

/* A helper that takes the address space's lock step after step (munmap,
 * MADV_POPULATE_WRITE) pauses between steps with this: a thread that takes
 * the lock again at once keeps a woken waiter out, and the kernel hands the
 * lock over only after the waiter has waited about 4 ms.  The waiter is
 * the loop's mmap() or brk(): it waited 4-16 ms that way. */
void loop_mm_pause(void);

/* Called first by a program that runs a loop: malloc set up so that the
 * loop never waits in brk() or mmap() for it (loop.c). */
void loop_tune_malloc(void);

/* The clock (mono_us(), clock.h), read at the start of the current turn
 * and again after every sleep: what requests are judged against. */
usec_t loop_now(const struct loop *l);
/* The longest turn so far (wall clock, preemption included). */
uint64_t loop_longest_turn_us(const struct loop *l);
/* The longest turn in which the loop thread was not preempted (wall
 * clock: its own work, and any blocking it did). */
uint64_t loop_longest_busy_us(const struct loop *l);
/* How many times the loop thread slept while working (checked once per
 * 100 us of work): waits outside its own wait for events, which the loop
 * is built never to make. */
uint64_t loop_blocked(const struct loop *l);
/*
 * The client the loop just answered asked from CPU cpu (-1: unknown).
 * When the loop's clients keep asking from the CPU the loop runs on, the
 * loop moves to another CPU it may run on (at most ten times a second).
 */
void loop_client_cpu(struct loop *l, int cpu);
/* How many times it moved so. */
uint64_t loop_steps_aside(const struct loop *l);
/* Microseconds the loop spent spinning for clients with nothing to do
 * (wall clock, preemption included): the CPU --poll-us costs. */
uint64_t loop_spin_us(const struct loop *l);

/* While busy(data) says the CPUs are wanted by helper threads (transfers in
 * flight), the loop spins for a client at most --poll-us, however far its
 * window has stretched; NULL: no such limit. */
void loop_set_spin_cap(struct loop *l, bool (*busy)(void *data), void *data);
