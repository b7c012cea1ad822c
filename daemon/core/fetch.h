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
	/* optional: f's bytes have a place and a progress word now
	 * (f->stream); the fetch goes on */
	void (*landing)(struct waiter *w, const struct fetch *f);
};

/* Where a far fetch's bytes land, and the progress word that counts them
 * in (shm-layout.h's SHM_SEG_PROGRESS_OFF): a waiter may read behind them. */
struct fetch_stream {
	bool on;
	uint32_t segment;
	uint64_t offset, len;
	uint32_t slot;    /* the word's place in the segment's header */
	uint64_t word0;   /* its value with nothing in yet */
};

struct fetch {
	struct object *o;
	struct waiter *waiters, *oldest; /* newest first */
	/* from another node: its waiters wait hundreds of microseconds,
	 * far longer than the loop takes to wake (loop_client_turn()) */
	bool far;
	struct fetch *next_woken; /* a put's waiters, on st->woken until woken */
	struct fetch_stream stream; /* once the backend says (fetch_landing()) */
};

/* What a waiter tells its client about a fetch that ended with res when
 * the error code alone would mislead (a peer's reset is not the client's
 * own connection); NULL otherwise. */
const char *fetch_error_msg(int res);

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
/* The backend placed f's bytes and counts them in a progress word: tell the
 * waiters that read behind them (a later one reads f->stream). */
void fetch_landing(struct fetch *f, const struct fetch_stream *s);

/* A waiter's res that is neither "in memory" nor an error: a place came
 * free for a request that waited for one; it runs again as if new. */
#define FETCH_AGAIN 1
/* A waiter's res: the put it waited for committed, or went, or its wait is
 * over; it runs again and waits for no other put. */
#define FETCH_PUT_LANDED 2
/* The backend is done with o's fetch; res 0: o is in memory. */
void fetch_done(struct store *st, struct object *o, int res);
