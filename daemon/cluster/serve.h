/* SPDX-License-Identifier: MIT */
/*
 * Serving other nodes (serve.c): their data connections, fetches and
 * pushes.  remote_accept(), remote_feed() and remote_hs_deadline() are
 * declared with the rest of the remote backend (node-private.h).
 */
#pragma once

#include <stdint.h>

struct node;

/* Connections that have not said Hello (and proved the secret) in time
 * are closed. */
void serve_expire(struct node *n, uint64_t now);
/* Every serving connection goes (teardown). */
void serve_close_all(struct node *n);
