/* SPDX-License-Identifier: MIT */
/*
 * Fetches: "bring this object back into memory", whoever holds its bytes
 * below (the disk tier now, another node next).  One fetch per object at a
 * time (single flight): every request that needs the object waits on the
 * same one.  A backend starts the transfer and calls fetch_done() when it
 * ends; each waiter's done() then runs exactly once, never from inside the
 * call that queued it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct store;
struct object;
struct fetch;

struct waiter {
	struct waiter *next, *prev;
	struct fetch *fetch;                    /* NULL when not waiting */
	void (*done)(struct waiter *w, int res); /* 0: in memory; or -errno */
};

struct fetch {
	struct object *o;
	struct waiter *waiters, *oldest; /* newest first */
	/* from another node: its waiters wait hundreds of microseconds,
	 * far longer than the loop takes to wake (loop_client_turn()) */
	bool far;
	struct fetch *next_woken; /* a put's waiters, on st->woken until woken */
};

/* What a waiter tells its client about a fetch that ended with res when
 * the error code alone would mislead (a peer's reset is not the client's
 * own connection); NULL otherwise. */
const char *fetch_error_msg(int res);

/* What lies below memory (disk.c registers itself; a remote backend will
 * too).  Every call runs on the loop thread and never blocks. */
struct backend_ops {
	const char *name;
	/* o's bytes are only below: start bringing them into dram; the
	 * backend calls fetch_done() when they are in or will not come */
	int (*fetch)(void *be, struct object *o);
	/* take a clean copy of o (memory-resident): 0 queued, -errno not */
	int (*spill)(void *be, struct object *o);
	/* o is going away: drop its copy and any transfer (the tier below;
	 * others hear of it as an event, store.h) */
	void (*forget)(void *be, struct object *o);
	/* could a copy of o be taken now (healthy, room)? */
	bool (*accepting)(void *be, const struct object *o);
	/* background work, bounded; true if it did something */
	bool (*maintain)(void *be);
	/* its counters, each under its full name ("disk.records") */
	void (*stats)(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u);
	/* start copying every memory-only object below (kvcachectl flush) */
	int (*flush)(void *be);
	/* a miss in the index: find the key elsewhere and bring it here.  0
	 * with *ret the fetch to wait on (one per key however many ask), or
	 * -ENOENT.  On success the backend publishes the object before
	 * fetch_done(), so waiters find it in the index. */
	int (*locate)(void *be, const void *key, size_t len, struct fetch **ret);
	/* keys not in the index: which does another node hold?  Sets
	 * present[i] for those; 0 when answered, or -EINPROGRESS with *ret to
	 * wait on (ask again when it is done).  With settle, answer at once:
	 * what is not known by now counts as absent, so a request waits at
	 * most once. */
	int (*where)(void *be, const char *const *keys, const size_t *lens, size_t n,
		     uint8_t *present, bool settle, struct fetch **ret);
};

struct backend {
	const struct backend_ops *ops; /* NULL: nothing below memory */
	void *be;
};

/* Start (or join) the fetch of o: 0 with *ret set, or -errno (nothing
 * below holds it, or the transfer could not start). */
int store_fetch(struct store *st, struct object *o, struct fetch **ret);
void fetch_wait(struct fetch *f, struct waiter *w);
void fetch_unwait(struct waiter *w); /* idempotent */
/* Tell every waiter of f (a fetch without an object: a directory question)
 * that it is over; the owner frees f afterwards. */
void fetch_wake(struct fetch *f, int res);
/* Only the waiter that waits longest; false if none did. */
bool fetch_wake_oldest(struct fetch *f, int res);

/* A waiter's res that is neither "in memory" nor an error: a place came
 * free for a request that waited for one; it runs again as if new. */
#define FETCH_AGAIN 1
/* A waiter's res: the put it waited for committed, or went, or its wait is
 * over; it runs again and waits for no other put. */
#define FETCH_PUT_LANDED 2
/* The backend is done with o's fetch; res 0: o is in memory. */
void fetch_done(struct store *st, struct object *o, int res);
