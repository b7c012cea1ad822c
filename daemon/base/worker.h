/* SPDX-License-Identifier: MIT */
/*
 * Workers: helper threads that run work the loop hands them, and hand each
 * piece back to the loop when it is done.
 *
 * A piece of work is a struct work embedded in the caller's own struct:
 * run() runs on one of the worker's threads, then done() runs on the
 * loop's thread (in the order the pieces finished), with whatever run()
 * left in it.  Work without a done() belongs to run() from the moment it
 * starts (it may free it).  Submitting never blocks and takes no lock
 * (handoff.h: the loop once waited milliseconds for a helper's queue lock
 * held by a preempted helper); each thread has its own queue and pieces
 * go to them in turn.  Pieces given to one thread run in the order given.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "loop.h"

struct worker;

struct work {
	struct work *next;             /* the worker's */
	void (*run)(struct work *w);   /* on a worker thread */
	void (*done)(struct work *w);  /* on the loop afterwards; NULL: none */
};

/* n_threads threads named kvc-<name>, scheduled as sched says (loop.h), whose
 * done() calls run on loop's turns (NULL: no loop, and no work may have a
 * done()).  0 or -errno. */
int worker_new(struct loop *loop, const char *name, unsigned n_threads, enum loop_helper sched,
	       struct worker **ret);
/* What was submitted still runs; then the threads end, and the done() of
 * what finished runs here (the loop's thread, which no longer turns).
 * NULL-safe. */
void worker_free(struct worker *w);
/* after(data) runs on the loop after each batch of done() calls (one
 * turn's): work done() queues for later can go out together. */
void worker_set_after(struct worker *wk, void (*after)(void *data), void *data);
/* Queue w from any thread: 0, or -ENODEV (no worker: w is not run). */
int worker_submit(struct worker *wk, struct work *w);
/* The done() of what finished, run now (on the loop's thread, when it does
 * not turn: tests, fuzzers); true if any ran. */
bool worker_run_done(struct worker *wk);
/* Submitted and not yet done (its done() not yet run). */
size_t worker_pending(const struct worker *wk);

/*
 * Workers whose threads share one queue and choose from it: the cluster's
 * data threads, where a peer that stopped answering may hold only so many
 * threads, and jobs for one peer run together on one connection.  What to
 * take and how to run it, the owner says; the queue, the threads, their
 * sleep and the way back to the loop are the worker's as above.
 * Submitting still never blocks: the loop pushes onto a lock-free stack,
 * and only the worker's threads take its lock.
 */
struct worker_choice {
	/* each thread, as it starts (NULL: nothing) */
	void (*thread_start)(void *data);
	/* under the worker's lock: the pieces this thread runs next, from the
	 * queue (head, oldest first, linked by next), at most max, into
	 * run[] in queue order; how many (0: none may run now).  The worker
	 * takes them out of the queue.  *hold: whatever ran() gives back. */
	unsigned (*take)(void *data, struct work *head, struct work **run, unsigned max,
			 void **hold);
	/* no lock: run them; each goes back with worker_hand_back() as it ends */
	void (*run)(void *data, struct work **run, unsigned k);
	/* under the lock, after run(): give back what take() held (NULL:
	 * nothing) */
	void (*ran)(void *data, void *hold);
};

#define WORKER_TAKE_MAX 16 /* pieces run together, at most */

/* Like worker_new(), with one queue the threads choose from as ch says
 * (data: its first argument). */
int worker_new_shared(struct loop *loop, const char *name, unsigned n_threads,
		      enum loop_helper sched, const struct worker_choice *ch, void *data,
		      struct worker **ret);
/* On a thread of a shared worker, in ch->run(): w has ended. */
void worker_hand_back(struct worker *wk, struct work *w);
/* Queue the chain first..last (linked by next) at once: its threads find
 * them together. */
int worker_submit_chain(struct worker *wk, struct work *first, struct work *last, size_t n);
/* Like worker_free(), but what finished and was not yet done goes to
 * drop() instead of done() (the owner is going too). */
void worker_free_dropping(struct worker *wk, void (*drop)(struct work *w));
