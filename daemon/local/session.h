/* SPDX-License-Identifier: MIT */
/*
 * One client connection: its control socket (session.c), what it holds
 * (reservations, views and buffers, in its holder), its channels.
 */
#pragma once

#include <sys/types.h>

#include "server.h"
#include "wire.h"

struct session {
	struct loop_source *src;  /* its socket in the loop */
	struct session *next, *prev;
	struct server *sv;
	int fd;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[32];
	bool welcomed, refused, closing;
	uint32_t events;

	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off;
	int out_fds[WIRE_MAX_FDS]; /* not yet sent with the first out byte */
	size_t n_out_fds;

	struct holder h;          /* its reservations, views and buffers */

	struct channel *channels[SESSION_MAX_CHANNELS];
	unsigned n_channels;
	/* an acquire on the socket waiting for its object to come back from
	 * disk, or a buffer being mapped: the session reads nothing more
	 * until it is answered */
	struct {
		struct waiter w;        /* on the fetch */
		uint32_t op;            /* OP_ACQUIRE, OP_WHERE or OP_BUFFER_ALLOC */
		bool active;
		uint32_t seq;
		uint8_t key[WIRE_MAX_KEY];
		uint32_t key_len;
	} parked;
	uint64_t buffer_bytes;
	struct buffer_job *buffer_job; /* a buffer being mapped (buffer.c) */
	struct copy_job *copies;  /* its copies in flight (copier.c) */
};

/* Sessions (session.c). */
int session_new(struct server *sv, int fd);
void session_free(struct session *s);
void session_event(struct session *s, uint32_t events);
