/* SPDX-License-Identifier: MIT */
/*
 * Serving other nodes (serve.c): their data connections, fetches and
 * pushes.  remote_accept(), remote_feed() and remote_hs_deadline() are
 * declared with the rest of the remote backend (node-private.h).
 */
#pragma once

#include <stdint.h>

#include "clock.h"

struct node;
struct pserve;

/* The connections of other nodes to this one's peer port (the node's
 * srv; only serve.c touches it). */
struct peer_server {
	struct pserve *serving;
	unsigned n_serving;
	/* connections whose peer has not proved itself yet, oldest first
	 * (each has HANDSHAKE_MS; a new one past HS_PER_SOURCE from its
	 * address, or past HANDSHAKE_MAX in all, pushes the oldest out) */
	struct pserve *hs_head, *hs_tail;
	unsigned n_hs;
	usec_t hs_logged, refused_logged;
	struct {
		uint64_t served, serve_errors;
		uint64_t served_summed;   /* sent with a checksum known before */
		uint64_t hs_timeouts;     /* connections closed without a handshake */
		uint64_t refused;         /* connections refused at accept (all in use) */
		uint64_t pushes_received, pushes_eager, pushes_refused;
		uint64_t pushes_inline;   /* eager ones the loop took in itself */
		uint64_t push_turns;      /* turns in which it took in any (their PushDones go together) */
		uint64_t remote_corrupt;  /* pushes received damaged */
		uint64_t version_refused; /* peers of another protocol major */
	} c;
};

/* Connections that have not said Hello (and proved the secret) in time
 * are closed. */
void serve_expire(struct node *n, usec_t now);
/* Every serving connection goes (teardown). */
void serve_close_all(struct node *n);
