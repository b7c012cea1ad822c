/* SPDX-License-Identifier: MIT */
/*
 * kvcache._kvcache: the CPython binding of libkvcache.  docs/python.rst has
 * the rules it keeps (GIL, exports, pointers, fork).
 */
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvcache/kvcache.h"

/* A range of the caller's own memory it told us about: raw integer
 * addresses are only accepted inside one of these. */
struct mem_range {
	uintptr_t base;
	size_t len;
};

/* Async operations in flight: our user_data is the slot, the caller's
 * user_data and the Buffer kept alive live here. */
#define ASYNC_SLOTS 256

struct async_slot {
	bool used;
	uint64_t user_data;
	PyObject *buffer; /* strong reference, or NULL */
};

typedef struct {
	PyObject_HEAD
	struct kvc_client *c;
	/* 1 while open plus one per call in progress without the GIL: the
	 * last one out disconnects (all changed with the GIL held) */
	Py_ssize_t users;
	bool closing;
	unsigned fork_gen;
	/* Views, Reservations and Buffers alive: close() is refused */
	Py_ssize_t exports;
	struct mem_range *ranges; /* sorted by base, disjoint */
	size_t n_ranges, cap_ranges;
	struct async_slot slots[ASYNC_SLOTS];
	size_t slots_used;
	char *socket;
	bool reconnecting;   /* a connect in progress without the GIL */
	uint64_t reconnects; /* connections made again after the daemon went */
} ClientObject;

/* What View, Reservation and Buffer share: daemon memory [data, +len)
 * exported through the buffer protocol, with a count of the exports alive,
 * and the Client it belongs to (kept alive by the reference). */
typedef struct {
	PyObject_HEAD
	ClientObject *client;
	void *data;
	size_t len;
	Py_ssize_t exports;
	bool readonly;
	bool done; /* released, committed, aborted or freed */
} ExporterObject;

typedef struct {
	ExporterObject e;
	struct kvc_view v;
} ViewObject;

typedef struct {
	ExporterObject e;
	struct kvc_buf b;
} ReservationObject;

typedef struct {
	ExporterObject e;
	struct kvc_buffer b;
	Py_ssize_t in_flight; /* operations that name it */
} BufferObject;

extern PyTypeObject Client_Type, View_Type, Reservation_Type, Buffer_Type;
extern unsigned kvcpy_fork_gen;

/* Enter a call on the client (GIL held): -1 with an exception set when it
 * is closed or belongs to the parent of a fork.  client_leave() after the
 * call, with the GIL held again. */
int client_enter(ClientObject *self);
void client_leave(ClientObject *self);

/* Is [p, p + len) inside memory registered with register_memory()? */
bool client_range_ok(ClientObject *self, uintptr_t p, size_t len);

/* Raise OSError(-r) with libkvcache's words and the daemon's message;
 * returns NULL. */
PyObject *raise_kvc(int r);

PyObject *view_new(ClientObject *client, const struct kvc_view *v);
PyObject *reservation_new(ClientObject *client, const struct kvc_buf *b);
PyObject *buffer_new(ClientObject *client, const struct kvc_buffer *b);
/* The registered buffer behind o, or NULL with TypeError/ValueError set. */
BufferObject *buffer_check(ClientObject *client, PyObject *o);
