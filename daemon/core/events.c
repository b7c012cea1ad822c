/* SPDX-License-Identifier: MIT */
/*
 * The store's clock and its events: the time requests are judged against,
 * and the listeners told what happens to objects (store.h).  Below every
 * other file of core, which all read the one and emit the other.
 */
#include <stddef.h>

#include "store-private.h"

usec_t store_now(const struct store *st)
{
	return loop_now(st->loop);
}

void store_add_listener(struct store *st, struct store_listener *l,
			const struct store_events *events, void *data)
{
	struct store_listener **at = &st->listeners;

	while (*at)
		at = &(*at)->next;
	*l = (struct store_listener) { .events = events, .data = data };
	*at = l;
}

void store_remove_listener(struct store *st, struct store_listener *l)
{
	for (struct store_listener **at = &st->listeners; *at; at = &(*at)->next)
		if (*at == l) {
			*at = l->next;
			l->next = NULL;
			return;
		}
}

/* Each listener's handler of an event, if its table is new enough to have
 * that slot (a table is never shorter than its version says). */
#define EMIT_V(st, v, slot, ...)                                                    \
	for (struct store_listener *l_ = (st)->listeners; l_; l_ = l_->next)        \
		if (l_->events->version >= (v) && l_->events->slot)                 \
			l_->events->slot(__VA_ARGS__)
#define EMIT(st, slot, ...) EMIT_V(st, 1, slot, l_->data, __VA_ARGS__)

void store_emit_published(struct store *st, struct object *o)
{
	EMIT(st, published, o);
}

void store_emit_forgotten(struct store *st, struct object *o)
{
	EMIT(st, forgotten, o);
}

void store_emit_pending(struct store *st, const char *key, size_t len, bool on)
{
	EMIT(st, pending, key, len, on);
}

void store_emit_removed(struct store *st, const void *key, size_t len, bool prefix)
{
	EMIT(st, removed, key, len, prefix);
}

void store_emit_space_freed(struct store *st)
{
	EMIT_V(st, 2, space_freed, l_->data);
}
