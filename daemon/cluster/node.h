/* SPDX-License-Identifier: MIT */
/*
 * kvcached as a member of a cluster (--master): joins every master,
 * heartbeats, and publishes what it holds to the directory in batches,
 * through the store's remote backend.  Without --master nothing here runs.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster-admin.h"
#include "config.h"
#include "store.h"

struct node;

/* 0 with *ret NULL when cfg names no master; -EINVAL with err filled in
 * for a configuration that cannot work (etcd://, no secret on a public
 * address, bad addresses). */
int node_new(struct store *st, const struct config *cfg, struct node **ret, char *err,
	       size_t err_len);
void node_free(struct node *n);
/* What the local side may ask of the cluster, for the node's lifetime
 * (NULL without a node). */
const struct cluster_admin *node_admin(struct node *n);
/* Fuzzing: serve fd (taken) as a peer's data connection: what can be read
 * from it now, to the end, then hang it up as if the peer had gone. */
void node_feed(struct node *n, int fd);
/* Fuzzing: fd (taken) as the node's link to its first master, what a
 * master sends after the node's Hello: every frame handled (a Drop's walk
 * to its end), then the link down as if the master had gone. */
void node_feed_link(struct node *n, int fd);
/* Fuzzing: fetch keys[i] (lens[i] bytes) from the node serving at address
 * (the directory skipped), all asked for at once, calling tick(u) while
 * they run; got[i]: that key arrived whole and is held here now. */
void node_fetch_all(struct node *n, const char *const *keys, const uint64_t *lens, size_t k,
		    const char *address, void (*tick)(void *u), void *u, bool *got);
