/* SPDX-License-Identifier: MIT */
/*
 * What the local side asks of the cluster beyond core's lookups: who holds
 * a key (kvcachectl where), a copy pushed to another node (push_to), and
 * the cluster as this node sees it (kvcachectl cluster).  The node fills
 * the table; main.c hands it to the server; without --master there is
 * none.  Every call runs on the loop and never blocks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fetch;

/* What the cluster tells kvcachectl cluster (all strings owned by the
 * node, valid until the next call into it). */
#define CLUSTER_VIEW_MAX 64

struct cluster_member {
	const char *id, *address, *state, *transport;
	const char *version; /* its kvcached's ("" when not known) */
	uint64_t capacity, used, objects;
};

struct cluster_view {
	const char *self;
	const char *masters[8];
	unsigned n_masters;
	unsigned masters_up;
	struct cluster_member members[CLUSTER_VIEW_MAX];
	unsigned n_members;
};

struct cluster_admin {
	void *be;
	/* the other nodes holding key, as "id,id,..." in buf (empty: none);
	 * 0, or -EINPROGRESS with *ret to wait on (ask again when it is
	 * done); with settle, answer at once with what is known */
	int (*holders)(void *be, const char *key, size_t len, char *buf, size_t cap, bool settle,
		       struct fetch **ret);
	/* copy key (committed here) to the node named target, in the
	 * background: 0 started; -EHOSTUNREACH (no such node up), -EINVAL
	 * (this node), -ENOENT, -EAGAIN (not in memory), or -errno */
	int (*push)(void *be, const char *key, size_t len, const char *target);
	/* the cluster as this node sees it; -errno */
	int (*describe)(void *be, struct cluster_view *ret);
	/* before a describe that shows the members' loads: 0 when what this
	 * node knows is fresh, or -EINPROGRESS with *ret to wait on (the
	 * masters are asked now; describe when it is done, without asking
	 * again).  NULL: describe at once */
	int (*refresh)(void *be, struct fetch **ret);
};
