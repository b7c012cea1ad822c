/* SPDX-License-Identifier: MIT */
/* Fetches and their waiters (fetch.h). */
#include <errno.h>
#include <stdlib.h>

#include "tier.h"
#include "fetch.h"

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

void fetch_landing(struct fetch *f, const struct fetch_stream *s)
{
	f->stream = *s;
	for (struct waiter *w = f->waiters; w; w = w->next)
		if (w->landing)
			w->landing(w, f); /* posts news only: never ends a wait */
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
