/* SPDX-License-Identifier: MIT */
/*
 * A holder: the handle table of whoever holds reservations, views and
 * registered buffers in the store.  A local client's session embeds one;
 * a peer connection will embed another.  holder_done() gives back
 * everything it holds, so a client that hangs up and a peer declared dead
 * are the same event.
 *
 * A handle is generation << 32 | (slot index + 1): a stale, foreign or
 * forged handle fails its lookup (-ESTALE for the caller).
 */
#pragma once

#include <stdint.h>

#define HOLDER_MAX_SLOTS (1u << 16) /* outstanding reservations + views + buffers */

struct store;
struct object;
struct holder;

enum slot_kind {
	SLOT_FREE,
	SLOT_RESERVE,
	SLOT_VIEW,
	SLOT_BUFFER,
};

struct slot {
	uint32_t gen;
	uint32_t next_free; /* index + 1 of the next free slot, 0 = none */
	uint8_t kind;
	uint8_t replace;    /* reservation made with WIRE_PUT_REPLACE */
	union {
		struct object *obj;
		void *buf;      /* the owner's (holder_ops.release_buffer) */
	};
};

struct holder_ops {
	/* a SLOT_BUFFER slot is given back (NULL: the holder has none) */
	void (*release_buffer)(struct holder *h, void *buf);
};

struct holder {
	struct store *st;
	const struct holder_ops *ops;
	struct slot *slots;
	uint32_t n_slots, free_slot, used_slots;
};

void holder_init(struct holder *h, struct store *st, const struct holder_ops *ops);
/* 0, or -EMFILE when HOLDER_MAX_SLOTS are in use, -ENOMEM. */
int holder_alloc(struct holder *h, uint8_t kind, void *ptr, uint64_t *ret_handle);
/* The slot a handle names if it is of that kind, else NULL. */
struct slot *holder_get(struct holder *h, uint64_t handle, uint8_t kind, uint32_t *ret_i);
/* Free slot i without touching what it held (it changed hands). */
void holder_put(struct holder *h, uint32_t i);
/* Give back what slot i holds, then the slot. */
void holder_release(struct holder *h, uint32_t i);
/* Give back everything; counts the reservations and views it held. */
void holder_done(struct holder *h, uint64_t *ret_reservations, uint64_t *ret_views);
