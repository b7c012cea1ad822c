/* SPDX-License-Identifier: MIT */
/*
 * Checksums taken ahead: a thread at idle priority hashes the objects this
 * node stores (XXH3-64, net/checksum.h) soon after their commit, so that a
 * node fetching one later gets the kept checksum with the bytes and the
 * sender hashes nothing.  On a machine whose CPUs are the link, the
 * sender's hash was a fifth of a 16 MiB fetch (fetched a second time,
 * with the checksum known, 16 MiB values moved 18-21% faster).
 *
 * The loop queues each object it publishes (a ring with a place for as
 * many such objects as the memory tier holds, so that a burst of puts
 * does not overflow it; an object that does not fit is hashed as it is
 * sent) and hands them to the thread a batch at a time (one hand-off each
 * way for up to JOB_MAX objects: one an object kept the thread at a few
 * hundred MB/s on 64 KiB objects, and a prefill's burst of per-layer
 * objects overflowed a ring of 4096), each with a view so that its bytes
 * cannot move or be freed while they are read.  That view does not
 * refuse a removal (object_readers()): the object goes, and its bytes
 * when the hash is done.  Being hashed is no use of the object, so it
 * goes back where its last use puts it.  The thread runs under
 * SCHED_IDLE: it takes only CPU time nobody else wants, and on a busy
 * node objects simply wait, or are hashed as they are sent.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blocking.h"
#include "worker.h"
#include "log.h"
#include "presum.h"

#define LOG_TOPIC "presum"

/* Places for objects waiting: one for each object of at least min_len
 * the memory tier can hold, at least RING_MIN and at most RING_MAX (8
 * MiB of pointers, touched only as far as they are used). */
#define RING_MIN 4096u
#define RING_MAX (1u << 20)
/* Handed to the thread at once: IN_FLIGHT jobs of at most JOB_MAX objects
 * each, of at most an eighth of the dram tier or IN_FLIGHT_BYTES together
 * (one object at least).  That is what a thread at idle priority keeps
 * from eviction while others have the CPU. */
#define IN_FLIGHT 2
#define JOB_MAX 64
#define IN_FLIGHT_BYTES (32u << 20)

struct sum_item {
	struct object *o;
	const uint8_t *bytes;
	uint64_t len;
	uint64_t sum;
	uint32_t used;             /* o->used_ms when it was handed over */
	bool failed;
};

struct sum_job {
	struct work work;          /* on the thread, then back on the loop */
	struct presum *p;
	struct sum_job *next;      /* p->free_jobs */
	unsigned n;
	uint64_t bytes;
	struct sum_item items[JOB_MAX];
};

struct presum {
	struct store *st;
	struct loop *loop;
	struct store_listener listener;
	uint64_t min_len;
	struct object **ring;      /* ring_size places; NULL: went while it waited */
	unsigned ring_size;
	unsigned head, count;      /* oldest at head */
	struct sum_job jobs[IN_FLIGHT], *free_jobs;
	unsigned in_flight;        /* objects */
	uint64_t in_flight_bytes;
	struct worker *wk;         /* one thread, at idle priority */
	bool stop;
	uint64_t summed, summed_bytes, skipped;
	bool off;                  /* tests: KVCACHE_TEST_NO_SUMS_AHEAD=1 */
	unsigned delay_ms;         /* tests: KVCACHE_TEST_SUMS_AHEAD_DELAY_MS (the thread's) */
};

/* The thread: a job's hashes. */
static void sum_run(struct work *w)
{
	struct sum_job *j = (struct sum_job *) w;
	struct presum *p = j->p;

	if (p->delay_ms) { /* the first job only */
		usleep(p->delay_ms * (useconds_t) USEC_PER_MSEC);
		p->delay_ms = 0;
	}
	for (unsigned i = 0; i < j->n; i++) {
		struct sum_item *it = &j->items[i];

		it->failed = blk_sum(it->bytes, it->len, &it->sum) < 0;
	}
}

static void sum_done(struct work *w);

static bool wanted(const struct object *o)
{
	return (o->flags & OBJ_COMMITTED) && o->where == OBJ_MEMORY && o->block &&
	       !(o->flags & (OBJ_SUMMED | OBJ_SUMMING | OBJ_DEAD));
}

/* Loop: the objects at the ring's head that fit into job j, at most
 * JOB_MAX and cap bytes in flight with those already handed over (one
 * object at least when nothing is); how many. */
static unsigned fill(struct presum *p, struct sum_job *j, uint64_t cap)
{
	struct store *st = p->st;

	j->n = 0;
	j->bytes = 0;
	while (p->count && j->n < JOB_MAX) {
		struct object *o = p->ring[p->head];
		struct sum_item *it;

		if (o && wanted(o) && (p->in_flight || j->n) &&
		    p->in_flight_bytes + j->bytes + o->len > cap)
			break; /* its turn comes when one in flight is done */
		p->ring[p->head] = NULL;
		p->head = (p->head + 1) % p->ring_size;
		p->count--;
		if (!o)
			continue;
		o->flags &= ~OBJ_SUM_QUEUED;
		if (!wanted(o))
			continue;
		it = &j->items[j->n++];
		*it = (struct sum_item) {
			.o = o,
			.bytes = store_object_ptr(o),
			.len = o->len,
			.used = store_sum_hold(st, o),
		};
		j->bytes += o->len;
	}
	return j->n;
}

/* Loop: hand objects to the thread while there is room. */
static void pump(struct presum *p)
{
	uint64_t cap = store_tier_capacity(store_tier(p->st, 0)) / 8;

	if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
		return;
	if (cap > IN_FLIGHT_BYTES)
		cap = IN_FLIGHT_BYTES;
	while (p->count && p->free_jobs) {
		struct sum_job *j = p->free_jobs;

		if (!fill(p, j, cap))
			break;
		p->free_jobs = j->next;
		p->in_flight += j->n;
		p->in_flight_bytes += j->bytes;
		worker_submit(p->wk, &j->work); /* oldest first: its one thread keeps the order */
	}
}

/* Loop: a job's hashes ended. */
static void sum_done(struct work *w)
{
	struct sum_job *j = (struct sum_job *) w;
	struct presum *p = j->p;

	for (unsigned i = 0; i < j->n; i++) {
		struct sum_item *it = &j->items[i];

		if (!it->failed && !(it->o->flags & OBJ_DEAD)) {
			p->summed++;
			p->summed_bytes += it->len;
		}
		store_sum_release(p->st, it->o, !it->failed, it->sum, it->used);
	}
	p->in_flight -= j->n;
	p->in_flight_bytes -= j->bytes;
	j->next = p->free_jobs;
	p->free_jobs = j;
	pump(p);
}

static void on_published(void *data, struct object *o)
{
	struct presum *p = data;

	if (p->off || o->len < p->min_len || !wanted(o) || (o->flags & OBJ_SUM_QUEUED))
		return;
	if (p->count == p->ring_size) {
		p->skipped++; /* hashed as it is sent, if it ever is */
		return;
	}
	o->sum_slot = (p->head + p->count) % p->ring_size;
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
	if (o->sum_slot < p->ring_size && p->ring[o->sum_slot] == o)
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
	uint64_t places;
	int r;

	*ret = NULL;
	if (!p)
		return -ENOMEM;
	p->st = st;
	p->loop = store_loop(st);
	p->min_len = min_len;
	places = store_tier_capacity(store_tier(st, 0)) / (min_len ? min_len : 1);
	p->ring_size = places < RING_MIN ? RING_MIN : places > RING_MAX ? RING_MAX : (unsigned) places;
	p->ring = calloc(p->ring_size, sizeof(*p->ring));
	if (!p->ring) {
		free(p);
		return -ENOMEM;
	}
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
		p->jobs[i].work = (struct work) { .run = sum_run, .done = sum_done };
		p->jobs[i].p = p;
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
		struct object *o = p->ring[(p->head + i) % p->ring_size];

		if (o)
			o->flags &= ~OBJ_SUM_QUEUED;
	}
	free(p->ring);
	free(p);
}
