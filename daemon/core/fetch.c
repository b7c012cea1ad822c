/* SPDX-License-Identifier: MIT */
/* Fetches and their waiters (fetch.h). */
#include <errno.h>
#include <stdlib.h>

#include "tier.h"
#include "fetch.h"

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

void fetch_wait(struct fetch *f, struct waiter *w)
{
	w->fetch = f;
	w->prev = NULL;
	w->next = f->waiters;
	if (w->next)
		w->next->prev = w;
	else
		f->oldest = w;
	f->waiters = w;
}

void fetch_unwait(struct waiter *w)
{
	if (!w->fetch)
		return;
	if (w->prev)
		w->prev->next = w->next;
	else
		w->fetch->waiters = w->next;
	if (w->next)
		w->next->prev = w->prev;
	else
		w->fetch->oldest = w->prev;
	w->fetch = NULL;
	w->next = w->prev = NULL;
}

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

void fetch_wake(struct fetch *f, int res)
{
	while (f->waiters) {
		struct waiter *w = f->waiters;

		fetch_unwait(w);
		w->done(w, res);
	}
}

bool fetch_wake_oldest(struct fetch *f, int res)
{
	struct waiter *w = f->oldest;

	if (!w)
		return false;
	fetch_unwait(w);
	w->done(w, res);
	return true;
}

const char *fetch_error_msg(int res)
{
	switch (res) {
	case -ECONNRESET:
		return "the node holding it went away during the transfer";
	case -ETIMEDOUT:
		return "the node holding it did not answer within --remote-timeout-ms";
	default:
		return NULL;
	}
}
