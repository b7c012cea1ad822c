/* SPDX-License-Identifier: MIT */
/* Holders: handle tables of reservations, views and buffers (holder.h). */
#include <errno.h>
#include <stdlib.h>

#include "tier.h"
#include "holder.h"

void holder_init(struct holder *h, struct store *st, const struct holder_ops *ops)
{
	*h = (struct holder) { .st = st, .ops = ops };
}

int holder_alloc(struct holder *h, uint8_t kind, void *ptr, uint64_t *ret_handle)
{
	struct slot *sl;
	uint32_t i;

	if (h->free_slot) {
		i = h->free_slot - 1;
		h->free_slot = h->slots[i].next_free;
	} else {
		if (h->n_slots == HOLDER_MAX_SLOTS)
			return -EMFILE;
		if (h->n_slots < 16 || (h->n_slots & (h->n_slots - 1)) == 0) {
			uint32_t cap = h->n_slots < 16 ? 16 : h->n_slots * 2;
			struct slot *n = realloc(h->slots, cap * sizeof(*n));

			if (!n)
				return -ENOMEM;
			h->slots = n;
		}
		i = h->n_slots++;
		h->slots[i] = (struct slot) { .gen = 1 };
	}
	sl = &h->slots[i];
	sl->kind = kind;
	sl->obj = ptr;
	sl->replace = 0;
	sl->next_free = 0;
	h->used_slots++;
	*ret_handle = (uint64_t) sl->gen << 32 | (i + 1);
	return 0;
}

struct slot *holder_get(struct holder *h, uint64_t handle, uint8_t kind, uint32_t *ret_i)
{
	uint32_t i = (uint32_t) handle - 1, gen = (uint32_t) (handle >> 32);

	if ((uint32_t) handle == 0 || i >= h->n_slots)
		return NULL;
	if (h->slots[i].kind != kind || h->slots[i].gen != gen)
		return NULL;
	*ret_i = i;
	return &h->slots[i];
}

void holder_put(struct holder *h, uint32_t i)
{
	struct slot *sl = &h->slots[i];

	sl->kind = SLOT_FREE;
	sl->obj = NULL;
	sl->gen++;
	if (sl->gen == 0)
		sl->gen = 1;
	sl->next_free = h->free_slot;
	h->free_slot = i + 1;
	h->used_slots--;
}

void holder_release(struct holder *h, uint32_t i)
{
	struct slot *sl = &h->slots[i];
	struct object *o = sl->obj;

	switch (sl->kind) {
	case SLOT_RESERVE:
		store_put_abandoned(h->st, o); /* gone: who waited for it misses */
		object_free(h->st, o);
		break;
	case SLOT_VIEW:
		o->views--;
		if (o->views == 0 && (o->flags & OBJ_DEAD))
			object_free(h->st, o);
		else if (o->views == 0)
			object_place(h->st, o, false);
		break;
	case SLOT_BUFFER:
		if (h->ops && h->ops->release_buffer)
			h->ops->release_buffer(h, sl->buf);
		break;
	default:
		break;
	}
	holder_put(h, i);
}

void holder_done(struct holder *h, uint64_t *ret_reservations, uint64_t *ret_views)
{
	uint64_t res = 0, views = 0;

	for (uint32_t i = 0; i < h->n_slots; i++) {
		if (h->slots[i].kind == SLOT_RESERVE)
			res++;
		else if (h->slots[i].kind == SLOT_VIEW)
			views++;
		if (h->slots[i].kind != SLOT_FREE)
			holder_release(h, i);
	}
	free(h->slots);
	h->slots = NULL;
	h->n_slots = h->free_slot = h->used_slots = 0;
	*ret_reservations = res;
	*ret_views = views;
}
