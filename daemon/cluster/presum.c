/* SPDX-License-Identifier: MIT */
/*
 * Checksums taken ahead: a thread at idle priority hashes the objects this
 * node stores (XXH3-64, net/checksum.h) soon after their commit, so that a
 * node fetching one later gets the kept checksum with the bytes and the
 * sender hashes nothing.  On a machine whose CPUs are the link, the
 * sender's hash was a fifth of a 16 MiB fetch (fetched a second time,
 * with the checksum known, 16 MiB values moved 18-21% faster).
 *
 * The loop queues each object it publishes (a bounded ring; an object
 * that does not fit is hashed as it is sent, as before) and hands a few at
 * a time to the thread, each with a view so that its bytes cannot move or
 * be freed while they are read.  That view does not refuse a removal
 * (object_readers()): the object goes, and its bytes when the hash is
 * done.  Being hashed is no use of the object, so it goes back where its
 * last use puts it.  The thread runs under SCHED_IDLE: it takes only CPU
 * time nobody else wants, and on a busy node objects simply wait, or are
 * hashed as they are sent.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checksum.h"
#include "worker.h"
#include "log.h"
#include "presum.h"

#define LOG_TOPIC "presum"

#define RING 4096                  /* objects waiting */
/* Handed to the thread at once: IN_FLIGHT objects, of at most an eighth
 * of the dram tier or IN_FLIGHT_BYTES together (one object at least).
 * That is what a thread at idle priority keeps from eviction while others
 * have the CPU. */
#define IN_FLIGHT 2
#define IN_FLIGHT_BYTES (32u << 20)

struct sum_job {
	struct work work;          /* on the thread, then back on the loop */
	struct presum *p;
	struct sum_job *next;      /* p->free_jobs */
	struct object *o;          /* NULL once it went meanwhile */
	const uint8_t *bytes;
	uint64_t len;
	uint64_t sum;
	uint32_t used;             /* o->used_ms when it was handed over */
	bool failed;
};

struct presum {
	struct store *st;
	struct loop *loop;
	struct store_listener listener;
	uint64_t min_len;
	struct object *ring[RING]; /* NULL: went while it waited */
	unsigned head, count;      /* oldest at head */
	struct sum_job jobs[IN_FLIGHT], *free_jobs;
	unsigned in_flight;
	uint64_t in_flight_bytes;
	struct worker *wk;         /* one thread, at idle priority */
	bool stop;
	uint64_t summed, summed_bytes, skipped;
	bool off;                  /* tests: KVCACHE_TEST_NO_SUMS_AHEAD=1 */
	unsigned delay_ms;         /* tests: KVCACHE_TEST_SUMS_AHEAD_DELAY_MS (the thread's) */
};

/* The thread: one object's hash. */
static void sum_run(struct work *w)
{
	struct sum_job *j = (struct sum_job *) w;
	struct presum *p = j->p;
	struct csum *h = csum_new();

	if (p->delay_ms) { /* the first one only */
		usleep(p->delay_ms * (useconds_t) USEC_PER_MSEC);
		p->delay_ms = 0;
	}
	j->failed = !h;
	if (h) {
		csum_update(h, j->bytes, j->len);
		j->sum = csum_digest(h);
		csum_free(h);
	}
}

static void sum_done(struct work *w);

static bool wanted(const struct object *o)
{
	return (o->flags & OBJ_COMMITTED) && o->where == OBJ_MEMORY && o->block &&
	       !(o->flags & (OBJ_SUMMED | OBJ_SUMMING | OBJ_DEAD));
}

/* Loop: hand objects to the thread while there is room. */
static void pump(struct presum *p)
{
	struct store *st = p->st;
	uint64_t cap = store_tier_capacity(store_tier(st, 0)) / 8;

	if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
		return;
	if (cap > IN_FLIGHT_BYTES)
		cap = IN_FLIGHT_BYTES;
	while (p->count && p->free_jobs) {
		struct object *o = p->ring[p->head];
		struct sum_job *j;

		if (o && wanted(o) && p->in_flight && p->in_flight_bytes + o->len > cap)
			break; /* its turn comes when one in flight is done */
		p->ring[p->head] = NULL;
		p->head = (p->head + 1) % RING;
		p->count--;
		if (!o)
			continue;
		o->flags &= ~OBJ_SUM_QUEUED;
		if (!wanted(o))
			continue;
		j = p->free_jobs;
		p->free_jobs = j->next;
		*j = (struct sum_job) {
			.work = { .run = sum_run, .done = sum_done },
			.p = p,
			.o = o,
			.bytes = store_object_ptr(o),
			.len = o->len,
			.used = store_sum_hold(st, o),
		};
		p->in_flight++;
		p->in_flight_bytes += o->len;
		worker_submit(p->wk, &j->work); /* oldest first: its one thread keeps the order */
	}
}

/* Loop: a hash ended. */
static void sum_done(struct work *w)
{
	struct sum_job *j = (struct sum_job *) w;
	struct presum *p = j->p;
	struct store *st = p->st;
	struct object *o = j->o;

	p->in_flight--;
	p->in_flight_bytes -= j->len;
	if (!j->failed && !(o->flags & OBJ_DEAD)) {
		p->summed++;
		p->summed_bytes += j->len;
	}
	store_sum_release(st, o, !j->failed, j->sum, j->used);
	j->next = p->free_jobs;
	p->free_jobs = j;
	pump(p);
}

static void on_published(void *data, struct object *o)
{
	struct presum *p = data;

	if (p->off || o->len < p->min_len || !wanted(o) || (o->flags & OBJ_SUM_QUEUED))
		return;
	if (p->count == RING) {
		p->skipped++; /* hashed as it is sent, if it ever is */
		return;
	}
	o->sum_slot = (p->head + p->count) % RING;
	p->ring[o->sum_slot] = o;
	p->count++;
	o->flags |= OBJ_SUM_QUEUED;
	pump(p);
}

/* o needs no checksum taken ahead (it is going away, or a push hashes it
 * as it sends it): out of the ring.  A hash in flight keeps its view, and
 * the bytes, until it ends. */
void presum_forget(struct presum *p, struct object *o)
{
	if (!p || !(o->flags & OBJ_SUM_QUEUED))
		return;
	o->flags &= ~OBJ_SUM_QUEUED;
	if (o->sum_slot < RING && p->ring[o->sum_slot] == o)
		p->ring[o->sum_slot] = NULL; /* its place stays: pump() steps over it */
}

static void on_forgotten(void *data, struct object *o)
{
	presum_forget(data, o);
}

static const struct store_events presum_events = {
	.version = STORE_EVENTS_VERSION,
	.published = on_published,
	.forgotten = on_forgotten,
};

void presum_stats(const struct presum *p, void (*emit)(void *u, const char *name, uint64_t v),
		  void *u)
{
	emit(u, "sums_ahead", p->summed);
	emit(u, "sums_ahead_bytes", p->summed_bytes);
	emit(u, "sums_ahead_waiting", p->count + p->in_flight);
	emit(u, "sums_ahead_skipped", p->skipped);
}

int presum_new(struct store *st, const struct config *cfg, uint64_t min_len,
	       struct presum **ret)
{
	const struct test_hooks *t = &cfg->test;
	struct presum *p = calloc(1, sizeof(*p));
	int r;

	*ret = NULL;
	if (!p)
		return -ENOMEM;
	p->st = st;
	p->loop = store_loop(st);
	p->min_len = min_len;
	store_add_listener(st, &p->listener, &presum_events, p);
	*ret = p;
	if (t->no_sums_ahead) {
		p->off = true;
		log_warn("KVCACHE_TEST_NO_SUMS_AHEAD: checksums are taken only as objects are sent");
		return 0;
	}
	if (t->sums_ahead_delay_ms) {
		p->delay_ms = t->sums_ahead_delay_ms;
		log_warn("KVCACHE_TEST_SUMS_AHEAD_DELAY_MS: the first checksum taken ahead waits %u ms",
			 p->delay_ms);
	}
	for (unsigned i = 0; i < IN_FLIGHT; i++) {
		p->jobs[i].next = p->free_jobs;
		p->free_jobs = &p->jobs[i];
	}
	r = worker_new(p->loop, "sum", 1, LOOP_HELPER_IDLE, &p->wk);
	if (r < 0) {
		presum_free(p);
		*ret = NULL;
	}
	return r;
}

/* The thread finishes what it was given; the views it held are let go
 * (objects that went meanwhile are freed). */
void presum_free(struct presum *p)
{
	if (!p)
		return;
	store_remove_listener(p->st, &p->listener);
	/* nothing more is handed over; what was ends and is given back */
	__atomic_store_n(&p->stop, true, __ATOMIC_RELEASE);
	worker_free(p->wk);
	for (unsigned i = 0; i < p->count; i++) {
		struct object *o = p->ring[(p->head + i) % RING];

		if (o)
			o->flags &= ~OBJ_SUM_QUEUED;
	}
	free(p);
}
