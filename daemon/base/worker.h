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

struct loop;
struct worker;

/* How its threads are scheduled: as any thread; as batch work (a helper
 * the loop wakes for bulk work); or on CPU time nobody else wants. */
enum worker_sched {
	WORKER_NORMAL,
	WORKER_BATCH,
	WORKER_IDLE,
};

struct work {
	struct work *next;             /* the worker's */
	void (*run)(struct work *w);   /* on a worker thread */
	void (*done)(struct work *w);  /* on the loop afterwards; NULL: none */
};

/* n_threads threads named kvc-<name>, scheduled as sched says, whose
 * done() calls run on loop's turns (NULL: no loop, and no work may have a
 * done()).  0 or -errno. */
int worker_new(struct loop *loop, const char *name, unsigned n_threads, enum worker_sched sched,
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
