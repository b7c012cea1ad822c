/* SPDX-License-Identifier: MIT */
/*
 * Puts in flight: a put reserved or announced (kvc_announce) whose key a
 * lookup may wait for until it commits or --lookup-wait-ms passes; the
 * cluster's lookups are told it is pending.  Below the holders (whose
 * reservations end here when given up) and the store's operations.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"

#define ANNOUNCED_MAX 65536

static struct object *lookup(struct store *st, const void *key, size_t len)
{
	return index_find(&st->index, key, len, index_hash(key, len));
}

/* A put of key begins here, or one that began ends without landing: the
 * cluster's lookups of it wait for it, or no more. */
void put_tell_pending(struct store *st, const void *key, size_t len, bool on)
{
	store_emit_pending(st, key, len, on);
}

/* Is a put of key still on its way here (reserved or announced)? */
bool put_still_coming(struct store *st, const void *key, size_t len)
{
	uint64_t h = index_hash(key, len);

	return (st->reserving.buckets && index_find(&st->reserving, key, len, h)) ||
	       (st->announced.buckets && index_find(&st->announced, key, len, h)) ||
	       index_find(&st->index, key, len, h);
}

/* The put of key failed for good: who waits for it (announced) misses now
 * rather than at the deadline. */
void put_announced_failed(struct store *st, const void *key, size_t len)
{
	struct object *a;

	if (!st->announced.buckets || !st->announced.n_objects)
		return;
	a = index_find(&st->announced, key, len, index_hash(key, len));
	if (a)
		put_announced_over(st, a, true);
}

/*
 * Puts in flight.  PD disaggregation through the pool asks for a prefill's
 * blocks as soon as the prefill answers, while its store may still be
 * copying: a lookup of a key reserved and not yet committed waits (at most
 * --lookup-wait-ms, the caller's deadline) instead of missing.  The waiters
 * hang on a fetch of the reserved object; when the put commits or goes, the
 * fetch moves to st->woken and the loop runs them again between requests.
 */
int store_put_in_flight(struct store *st, const void *key, size_t len, const struct holder *asker,
			struct fetch **ret)
{
	uint64_t hash = index_hash(key, len);
	struct object *o = NULL;

	if (st->reserving.buckets && st->reserving.n_objects)
		o = index_find(&st->reserving, key, len, hash);
	if (o && o->reserver == asker)
		o = NULL; /* its own put: the asker would wait for itself */
	if (!o && st->announced.buckets && st->announced.n_objects)
		o = index_find(&st->announced, key, len, hash);
	if (!o)
		return -ENOENT;
	if (!o->fetch) {
		o->fetch = calloc(1, sizeof(*o->fetch));
		if (!o->fetch)
			return -ENOMEM;
		o->fetch->o = o;
	}
	st->stats.lookup_waits++;
	*ret = o->fetch;
	return 0;
}

/* What waits on o goes to st->woken. */
static void wake_later(struct store *st, struct object *o)
{
	struct fetch *f = o->fetch;

	if (!f)
		return;
	o->fetch = NULL;
	f->o = NULL;
	f->next_woken = st->woken;
	st->woken = f;
}

int store_announce(struct store *st, const void *key, size_t len)
{
	struct object *o;

	if (!st->cfg->lookup_wait_ms || lookup(st, key, len))
		return 0;
	if (!st->announced.buckets && index_init(&st->announced) < 0)
		return -ENOMEM;
	if (index_find(&st->announced, key, len, index_hash(key, len)))
		return 0;
	if (st->announced.n_objects >= ANNOUNCED_MAX)
		return -ENOSPC;
	o = object_new(key, len);
	if (!o)
		return -ENOMEM;
	o->flags = OBJ_IN_FLIGHT | OBJ_ANNOUNCED;
	o->where = OBJ_RESERVED;
	o->lease_until = store_now(st) + st->cfg->lookup_wait_ms * USEC_PER_MSEC; /* until then */
	index_insert(&st->announced, o);
	o->lru_prev = st->announced_tail;
	o->lru_next = NULL;
	if (st->announced_tail)
		st->announced_tail->lru_next = o;
	else
		st->announced_head = o;
	st->announced_tail = o;
	if (!(st->reserving.buckets && index_find(&st->reserving, key, len, o->hash)))
		put_tell_pending(st, key, len, true);
	return 0;
}

/* An announcement is over: its put committed, or its time is up (tell:
 * the cluster's lookups stop waiting, unless a put of it is on its way). */
void put_announced_over(struct store *st, struct object *a, bool tell)
{
	if (a->lru_prev)
		a->lru_prev->lru_next = a->lru_next;
	else
		st->announced_head = a->lru_next;
	if (a->lru_next)
		a->lru_next->lru_prev = a->lru_prev;
	else
		st->announced_tail = a->lru_prev;
	index_unlink(&st->announced, a);
	wake_later(st, a);
	if (tell && !put_still_coming(st, a->key, a->key_len))
		put_tell_pending(st, a->key, a->key_len, false);
	object_free(st, a);
}

unsigned store_expire_announced(struct store *st)
{
	unsigned n = 0;

	while (st->announced_head && st->announced_head->lease_until <= store_now(st)) {
		put_announced_over(st, st->announced_head, true);
		n++;
	}
	return n;
}

void store_announced_done(struct store *st)
{
	while (st->announced_head)
		put_announced_over(st, st->announced_head, false);
	store_wake_puts(st);
	if (st->announced.buckets)
		index_done(&st->announced);
}

void store_put_landed(struct store *st, struct object *o)
{
	if (!(o->flags & OBJ_IN_FLIGHT))
		return;
	index_unlink(&st->reserving, o);
	o->flags &= ~OBJ_IN_FLIGHT;
	o->reserver = NULL; /* spill, from now on */
	wake_later(st, o);
}

void store_put_abandoned(struct store *st, struct object *o)
{
	bool was = (o->flags & OBJ_IN_FLIGHT) != 0;

	store_put_landed(st, o);
	if (was && st->remote.ops && !put_still_coming(st, o->key, o->key_len))
		put_tell_pending(st, o->key, o->key_len, false);
}

unsigned store_wake_puts(struct store *st)
{
	unsigned n = 0;

	while (st->woken) {
		struct fetch *f = st->woken;

		st->woken = f->next_woken;
		fetch_wake(f, FETCH_PUT_LANDED); /* each runs its request again */
		free(f);
		n++;
	}
	return n;
}
