/* SPDX-License-Identifier: MIT */
/*
 * Other nodes, as core sees them: where a key this node does not hold can
 * be found, and bringing it here.  The cluster's node registers itself
 * (st->remote); what else the local side asks of the cluster is not
 * core's (daemon/cluster-admin.h), nor are the events the directory
 * hears of (store_add_listener()).  Every call runs on the loop thread
 * and never blocks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fetch;

/* The version of struct remote_ops a backend was built against. */
#define REMOTE_OPS_VERSION 1

struct remote_ops {
	uint32_t version;
	const char *name;
	/* a miss in the index: find the key elsewhere and bring it here.  0
	 * with *ret the fetch to wait on (one per key however many ask), or
	 * -ENOENT.  On success the backend publishes the object before
	 * fetch_done(), so waiters find it in the index. */
	int (*locate)(void *be, const void *key, size_t len, struct fetch **ret);
	/* keys not in the index: which does another node hold?  Sets
	 * present[i] for those; 0 when answered, or -EINPROGRESS with *ret to
	 * wait on (ask again when it is done).  With settle, answer at once:
	 * what is not known by now counts as absent, so a request waits at
	 * most once. */
	int (*where)(void *be, const char *const *keys, const size_t *lens, size_t n,
		     uint8_t *present, bool settle, struct fetch **ret);
	/* its counters, each under its full name ("remote.hits") */
	void (*stats)(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u);
};

struct remote {
	const struct remote_ops *ops; /* NULL: a single node */
	void *be;
};
