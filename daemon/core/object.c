/* SPDX-License-Identifier: MIT */
/*
 * Objects (object.h): made, published, hit, dropped and freed, and kept on
 * the list of their tier that their state calls for, which is all eviction
 * ever looks at (tier.c takes its victims from the lists' tails).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "tier.h"
#include "values.h"

/* ---- lists, per tier ---- */

/* o in front of at (nearer the head), or last when at is NULL */
static void ol_link_before(struct olist *l, struct object *o, struct object *at)
{
	struct object *prev = at ? at->lru_prev : l->tail;

	o->lru_next = at;
	o->lru_prev = prev;
	if (prev)
		prev->lru_next = o;
	else
		l->head = o;
	if (at)
		at->lru_prev = o;
	else
		l->tail = o;
	l->n++;
	l->bytes += o->len;
}

static void ol_link(struct olist *l, struct object *o, bool at_tail)
{
	ol_link_before(l, o, at_tail ? NULL : l->head);
}

static void ol_unlink(struct olist *l, struct object *o)
{
	if (l->aged == o)
		l->aged = NULL;
	if (o->lru_prev)
		o->lru_prev->lru_next = o->lru_next;
	else
		l->head = o->lru_next;
	if (o->lru_next)
		o->lru_next->lru_prev = o->lru_prev;
	else
		l->tail = o->lru_prev;
	o->lru_prev = o->lru_next = NULL;
	l->n--;
	l->bytes -= o->len;
}

static bool soft_pinned(const struct store *st, const struct object *o)
{
	return (o->flags & OBJ_SOFT_PIN) && (o->pin_until == 0 || o->pin_until > store_now(st));
}

static enum obj_list object_class(const struct store *st, const struct object *o)
{
	if (!(o->flags & OBJ_COMMITTED))
		return OL_NONE;
	if (o->flags & OBJ_HARD_PIN)
		return OL_PINNED;
	if (o->views || o->fetch)
		return OL_HELD;
	if (o->lease_until > store_now(st))
		return OL_LEASED;
	if (o->n_children)
		return OL_ANC;
	return soft_pinned(st, o) ? OL_SOFT : OL_LRU;
}

void object_unplace(struct store *st, struct object *o)
{
	(void) st;
	if (o->list != OL_NONE) {
		ol_unlink(&o->tier->lists[o->list], o);
		o->list = OL_NONE;
	}
}

void object_place(struct store *st, struct object *o, bool at_tail)
{
	enum obj_list l = object_class(st, o);
	struct object *last;

	at_tail = at_tail && l != OL_LEASED; /* a lease list stays in lease order */
	if (!at_tail)
		o->used_ms = used_stamp(store_now(st));
	/* the common case of a hit: already the most recent of its list */
	if (l == o->list && l != OL_NONE && !at_tail && o->tier->lists[l].head == o)
		return;
	object_unplace(st, o);
	if (l == OL_NONE)
		return;
	/* behind the least recent: used no later than it */
	last = o->tier->lists[l].tail;
	if (at_tail)
		o->used_ms = last ? last->used_ms : used_stamp(store_now(st));
	ol_link(&o->tier->lists[l], o, at_tail);
	o->list = (uint8_t) l;
}

/* ---- objects ---- */

struct object *object_new(const void *key, size_t key_len)
{
	struct object *o = calloc(1, sizeof(*o) + key_len + 1);

	if (!o)
		return NULL;
	memcpy(o->key, key, key_len);
	o->key[key_len] = '\0';
	o->key_len = (uint32_t) key_len;
	o->hash = index_hash(key, key_len);
	return o;
}

void object_free(struct store *st, struct object *o)
{
	if (!o)
		return;
	catalog_forget(st, o);
	if (o->block)
		shm_alloc_free(&o->tier->alloc, o->block);
	free(o->parent_key);
	free(o);
}

/* o lost its place in a prefix chain; its parent may have become a leaf,
 * which goes back to the least recent end of its list (it is old). */
static void unlink_child(struct store *st, struct object *o)
{
	struct object *p = o->parent;

	if (!p)
		return;
	if (o->prev_sibling)
		o->prev_sibling->next_sibling = o->next_sibling;
	else
		p->first_child = o->next_sibling;
	if (o->next_sibling)
		o->next_sibling->prev_sibling = o->prev_sibling;
	o->prev_sibling = o->next_sibling = NULL;
	o->parent = NULL;
	if (--p->n_children == 0 && p->list == OL_ANC)
		object_place(st, p, true);
}

void object_publish(struct store *st, struct object *o)
{
	struct object *p = NULL;

	o->flags |= OBJ_COMMITTED;
	o->where = OBJ_MEMORY;
	o->committed = store_now(st);
	index_insert(&st->index, o);
	o->tier->objects++;
	if (o->parent_key) {
		p = index_find(&st->index, o->parent_key, o->parent_len,
			       index_hash(o->parent_key, o->parent_len));
		free(o->parent_key);
		o->parent_key = NULL;
	}
	if (p && p != o) {
		o->parent = p;
		o->next_sibling = p->first_child;
		if (o->next_sibling)
			o->next_sibling->prev_sibling = o;
		p->first_child = o;
		if (p->n_children++ == 0 && p->list != OL_NONE)
			object_place(st, p, false);
	}
	object_place(st, o, false);
	if (!o->cat)
		catalog_note(st, o);
	object_announce(st, o);
}

void object_announce(struct store *st, struct object *o)
{
	store_emit_published(st, o);
}

static void unqueue_promotion(struct store *st, struct object *o)
{
	if (!(o->flags & OBJ_PROMOTE))
		return;
	for (size_t i = 0; i < st->n_promote; i++)
		if (st->promote_q[i] == o) {
			st->promote_q[i] = st->promote_q[--st->n_promote];
			break;
		}
	o->flags &= ~OBJ_PROMOTE;
}

void object_drop(struct store *st, struct object *o)
{
	if (st->below.ops)
		st->below.ops->forget(st->below.be, o);
	store_emit_forgotten(st, o);
	fetch_done(st, o, -ENOENT); /* whoever waited for it: it is gone */
	index_unlink(&st->index, o);
	object_unplace(st, o);
	catalog_forget(st, o);
	o->tier->objects--;
	unqueue_promotion(st, o);
	/* children lose their prefix; the parent loses a child */
	while (o->first_child)
		unlink_child(st, o->first_child);
	unlink_child(st, o);
	o->flags &= ~OBJ_COMMITTED;
	o->flags |= OBJ_DEAD;
	if (o->views == 0)
		object_free(st, o);
}


/* Promotion candidates wait here; bounded, so dropping one stays cheap. */
#define PROMOTE_QUEUE_MAX 1024

void object_hit(struct store *st, struct object *o, bool lease, bool counts)
{
	if (lease && st->cfg->lease_ttl_ms)
		o->lease_until = store_now(st) + st->cfg->lease_ttl_ms * USEC_PER_MSEC;
	/* most recently used: the head of its list */
	object_place(st, o, false);
	if (lease && o->tier && o->where == OBJ_MEMORY) {
		/* leased bytes stay under --max-leased-ratio: the oldest go
		 * (a few a hit, so a lowered bound is reached over a few) */
		struct tier *t = o->tier;
		uint64_t most = (uint64_t) (st->cfg->max_leased_ratio * (double) t->alloc.size);

		for (unsigned k = 0; k < 4 && t->lists[OL_LEASED].bytes > most &&
				     t->lists[OL_LEASED].tail != o;
		     k++)
			object_break_lease(st, t);
	}
	if (!counts)
		return;
	/* looked for fastest first: a miss in every tier above this one */
	for (struct tier *t = st->fastest; t && t != o->tier; t = t->below)
		t->st.misses++;
	o->tier->st.hits++;
	if (o->where != OBJ_MEMORY)
		return; /* promotion is for memory tiers */
	o->hits++;
	if (o->tier != st->fastest && o->hits >= st->cfg->promotion_hits &&
	    !(o->flags & OBJ_PROMOTE) && o->len <= st->fastest->alloc.size / 4 &&
	    st->n_promote < PROMOTE_QUEUE_MAX) {
		if (st->n_promote == st->cap_promote) {
			size_t cap = st->cap_promote ? st->cap_promote * 2 : 64;
			struct object **q = realloc(st->promote_q, cap * sizeof(*q));

			if (!q)
				return; /* promotion is an optimisation */
			st->promote_q = q;
			st->cap_promote = cap;
		}
		st->promote_q[st->n_promote++] = o;
		o->flags |= OBJ_PROMOTE;
	}
}

const char *object_protected(const struct store *st, const struct object *o, bool soft_ok)
{
	if (o->views)
		return "viewed";
	if (o->fetch)
		return "loading";
	if (o->flags & OBJ_HARD_PIN)
		return "hard-pinned";
	if (o->lease_until > store_now(st))
		return "leased";
	if (!soft_ok && soft_pinned(st, o))
		return "soft-pinned";
	return NULL;
}

/* a no later than b, on the 2^32 ms clock of used_stamp() */
static bool used_by(uint32_t a, uint32_t b)
{
	return (int32_t) (a - b) <= 0;
}

/*
 * o back on its list after a hold that was no use (a lease that ran out, a
 * checksum taken in the background): by its last use, `used`, when that
 * is near the least recent end (behind the least recent object of the
 * list, or just in front of the last object put back this way: they come
 * back in the order they were used); else at the front, as if used now.
 * Every expired lease used to go to the front: a pool that churns faster
 * than a lease lasts then evicted what had been stored a moment ago before
 * what was read seconds earlier.
 */
void object_place_used(struct store *st, struct object *o, uint32_t used)
{
	enum obj_list l = object_class(st, o);
	struct olist *ol;
	struct object *a;

	if (l == OL_NONE || l == OL_HELD || l == OL_LEASED) {
		object_place(st, o, false);
		return;
	}
	ol = &o->tier->lists[l];
	a = ol->aged;
	if (a && a != o && used_by(a->used_ms, used) &&
	    (!a->lru_prev || used_by(used, a->lru_prev->used_ms))) {
		object_unplace(st, o);
		ol_link_before(ol, o, a);
		o->list = (uint8_t) l;
	} else if (ol->tail && ol->tail != o && used_by(used, ol->tail->used_ms)) {
		object_place(st, o, true);
	} else {
		object_place(st, o, false); /* counts as used now */
		return;
	}
	o->used_ms = used;
	ol->aged = o;
}

struct object *object_break_lease(struct store *st, struct tier *t)
{
	struct object *o = t->lists[OL_LEASED].tail;

	if (!o)
		return NULL;
	o->lease_until = 0;
	object_place_used(st, o, o->used_ms);
	st->stats.leases_broken++;
	return o;
}

/* fetch.h: o's fetch is over; o goes back on its list, its waiters run */
void fetch_done(struct store *st, struct object *o, int res)
{
	struct fetch *f = o->fetch;

	if (!f)
		return;
	o->fetch = NULL;
	if (o->where == OBJ_FETCHING)
		o->where = OBJ_BELOW; /* it did not come: still only below */
	if (o->flags & OBJ_COMMITTED)
		object_place(st, o, false);
	/* each waiter leaves the list before its done() runs, which may
	 * start a new fetch of o, or free its owner (and unwait others) */
	while (f->waiters) {
		struct waiter *w = f->waiters;

		fetch_unwait(w);
		w->done(w, res);
	}
	free(f);
}

int store_fetch(struct store *st, struct object *o, struct fetch **ret)
{
	struct fetch *f;
	int r;

	if (o->fetch) { /* single flight */
		*ret = o->fetch;
		return 0;
	}
	if (!st->below.ops || !st->below.ops->fetch)
		return -EIO;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->o = o;
	o->fetch = f;
	r = st->below.ops->fetch(st->below.be, o);
	if (r < 0) {
		o->fetch = NULL;
		free(f);
		return r;
	}
	o->where = OBJ_FETCHING;
	object_place(st, o, false); /* held while it comes back */
	*ret = f;
	return 0;
}
