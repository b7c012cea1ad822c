/* SPDX-License-Identifier: MIT */
/*
 * Core's side of the shared tier (store.h, docs/shared-tier.rst): when an
 * object leaving memory is copied there, when a put is written through,
 * and how a miss goes on to it after the cluster said no.  The backend
 * (daemon/disk/shared.c) owns the files; core only decides when to ask.
 */
#include <errno.h>

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

void shared_through(struct store *st, struct object *o)
{
	const struct below *sh = &st->shared;

	if (sh->ops && st->cfg->shared_write_through &&
	    !(o->flags & (OBJ_SHARED | OBJ_SHARING)) && sh->ops->accepting(sh->be, o))
		tier_shared_copy(st, o);
}

bool store_shared_copied(struct store *st, struct object *o, bool ok)
{
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
