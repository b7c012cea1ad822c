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
};

/* Connections that have not said Hello (and proved the secret) in time
 * are closed. */
void serve_expire(struct node *n, usec_t now);
/* Every serving connection goes (teardown). */
void serve_close_all(struct node *n);
