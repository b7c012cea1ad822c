/* SPDX-License-Identifier: MIT */
/*
 * Core's side of the shared tier (store.h, docs/shared-tier.rst): when an
 * object leaving memory is copied there, when a put is written through,
 * and how a miss goes on to it after the cluster said no.  The backend
 * (daemon/disk/shared.c) owns the files; core only decides when to ask.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store-private.h"
#include "tier.h"

int store_shared_attach(struct store *st, const struct below_ops *ops, void *be)
{
	int r = store_landing_init(st);

	if (r == 0)
		st->shared = (struct below) { ops, be };
	return r;
}

void store_shared_detach(struct store *st)
{
	st->shared = (struct below) { 0 };
}

/*
 * A write-through the shared tier cannot queue now (its copies in flight
 * hold a quarter of dram, at most 1 GiB) waits, by key, in the order put,
 * and goes as copies end: puts faster than the shared directory takes
 * them used to be copied only when they left memory, so a prefill node
 * that died first lost them from the shared tier.  A key whose object
 * went or was copied meanwhile is passed over (a key put again is copied
 * once, with its newest bytes).  Past THROUGH_MAX
 * waiting, a put is counted (shared_through_dropped) and copied when it
 * leaves memory, as before.
 */
#define THROUGH_MAX 65536

struct through_wait {
	struct through_wait *next;
	size_t len;
	char key[];
};

static bool through_wants(struct store *st, const struct object *o)
{
	const struct below *sh = &st->shared;

	return o && o->where == OBJ_MEMORY && (o->flags & OBJ_COMMITTED) &&
	       !(o->flags & (OBJ_SHARED | OBJ_SHARING)) && sh->ops->accepting(sh->be, o);
}

static void through_wait(struct store *st, const struct object *o)
{
	struct through_wait *w;

	if (st->n_through >= THROUGH_MAX || !(w = malloc(sizeof(*w) + o->key_len))) {
		st->stats.shared_through_dropped++;
		return;
	}
	w->next = NULL;
	w->len = o->key_len;
	memcpy(w->key, o->key, o->key_len);
	if (st->through_tail)
		st->through_tail->next = w;
	else
		st->through_head = w;
	st->through_tail = w;
	st->n_through++;
	st->stats.shared_through_waited++;
}

static void through_pop(struct store *st)
{
	struct through_wait *w = st->through_head;

	st->through_head = w->next;
	if (!st->through_head)
		st->through_tail = NULL;
	st->n_through--;
	free(w);
}

void shared_through(struct store *st, struct object *o)
{
	const struct below *sh = &st->shared;

	if (!sh->ops || !st->cfg->shared_write_through || !through_wants(st, o))
		return;
	/* behind those waiting: in the order put */
	if (st->through_head || tier_shared_copy(st, o) == -EBUSY)
		through_wait(st, o);
}

bool shared_through_more(struct store *st)
{
	bool did = false;

	if (!st->through_ready || !st->shared.ops)
		return false;
	st->through_ready = false;
	while (st->through_head) {
		struct through_wait *w = st->through_head;
		struct object *o = store_find(st, w->key, w->len);

		if (through_wants(st, o) && tier_shared_copy(st, o) == -EBUSY)
			break; /* the next copy to end makes room */
		through_pop(st);
		did = true;
	}
	return did;
}

void shared_through_done(struct store *st)
{
	while (st->through_head)
		through_pop(st);
}

bool store_shared_copied(struct store *st, struct object *o, bool ok)
{
	st->through_ready = true;
	o->flags &= ~OBJ_SHARING;
	if (ok)
		o->flags |= OBJ_SHARED;
	if (!store_below_unhold(st, o))
		return false;
	if (!o->views)
		object_place(st, o, true); /* it was the next to go */
	store_emit_space_freed(st);
	return true;
}

int shared_locate(struct store *st, const void *key, size_t len, struct fetch **ret)
{
	const struct below *sh = &st->shared;
	struct object *o;
	struct fetch *f;
	int r;

	if (!sh->ops || !sh->ops->locate)
		return -ENOENT;
	r = store_land_begin(st, key, len, true, &o, &f);
	if (r < 0)
		return r;
	if (r == 0) {
		o->flags |= OBJ_SHARED; /* asked: a miss there ends it */
		if (sh->ops->locate(sh->be, o) < 0) {
			store_land_abandon(st, o); /* nobody waits yet */
			return -ENOENT;
		}
	}
	*ret = f;
	return 0;
}

void store_land_detach(struct store *st, struct object *o, int res)
{
	store_landing_remove(st, o);
	fetch_done(st, o, res);
}

int shared_where(struct store *st, const char *const *keys, const size_t *lens, size_t n,
		 uint8_t *present, bool settle, struct fetch **ret)
{
	const struct below *sh = &st->shared;

	if (!sh->ops || !sh->ops->where)
		return 0;
	return sh->ops->where(sh->be, keys, lens, n, present, settle, ret);
}
