/* SPDX-License-Identifier: MIT */
/*
 * The master role (kvcache-master): membership and the directory of which
 * node holds which key.  Data never passes through it.  Both are soft
 * state: a master that restarts comes back empty and the nodes re-join and
 * re-publish.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "net.h"
#include "peer-auth.h"

struct loop;
struct master;

struct master_config {
	struct net_addr listen;
	uint32_t client_ttl_s;                 /* a node silent this long is dropped */
	uint64_t default_kv_lease_ttl_ms;      /* handed to nodes that join; 0: unset */
	double eviction_high_watermark_ratio;  /* 0: unset */
	double eviction_ratio;                 /* 0: unset */
	const struct peer_secret *secret;      /* NULL: none; every connection proves it */
	bool standby;                          /* serves no node until master_set_role() */
};

int master_new(struct loop *l, const struct master_config *cfg, struct master **ret);
void master_free(struct master *m);
/* Lead (term: the election's, stamped on every HelloAck), or stand by: a
 * standby refuses nodes, and a leader that steps down lets go of every
 * node and forgets the directory (the next leader's is rebuilt from the
 * nodes, as after a restart). */
void master_set_role(struct master *m, bool leading, uint64_t term);
bool master_leading(const struct master *m);
/* The port it listens on (the one asked for, or the kernel's for 0). */
uint16_t master_port(const struct master *m);
/* The master's figures for /metrics: nodes (state "up", "suspect",
 * "down"), directory entries, connections, and counters of joins, drops
 * and refused connections. */
typedef void (*master_export_fn)(void *u, const char *name, const char *state, bool counter,
				 uint64_t value);
void master_export(const struct master *m, master_export_fn fn, void *u);
/* Fuzzing: take fd as an accepted connection, handle what can be read from
 * it now, then hang it up as if the peer had gone. */
void master_feed(struct master *m, int fd);
