/* SPDX-License-Identifier: MIT */
/* An in-process node for the fuzzers of its peer-facing sides: a 4 MiB
 * dram tier on 4 KiB pages, a master that is not there (127.0.0.1:1), a
 * peer port on loopback; errors only in the log. */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "node.h"
#include "store.h"

/* The settings; a harness may change them before fuzz_node_start(). */
static inline void fuzz_node_config(struct config *cfg)
{
	config_init(cfg);
	cfg->dram_size = 4 << 20;
	cfg->hugepages = SHM_HUGEPAGES_OFF;
	cfg->prefault = SHM_HUGEPAGES_OFF;
	snprintf(cfg->master_server_address, sizeof(cfg->master_server_address), "127.0.0.1:1");
	snprintf(cfg->listen, sizeof(cfg->listen), "127.0.0.1:0");
	snprintf(cfg->node_id, sizeof(cfg->node_id), "fuzz");
	log_configure("error");
}

/* The store (*st, on a loop that never runs) and the node over it. */
static inline struct node *fuzz_node_start(struct store **st, struct config *cfg)
{
	struct loop *loop;
	struct node *n;
	char err[256];

	if (loop_new(0, &loop) < 0 || store_new(cfg, loop, -1, st) < 0)
		abort();
	if (node_new(*st, cfg, &n, err, sizeof(err)) < 0) {
		fprintf(stderr, "node_new: %s\n", err);
		abort();
	}
	return n;
}
