/* SPDX-License-Identifier: MIT */
/*
 * Following etcd's master view (--master etcd://...): a thread of its own
 * reads /kvcache/<ID>/master_view and watches it, so a new leader is known
 * within an etcd round trip of its election, and the loop takes the newest
 * view with one atomic exchange (view.c).
 */
#pragma once

#include <stdint.h>

#include "net.h"

struct view_follower;

struct master_view {
	int res;                       /* 0, -EHOSTUNREACH (no leader now), or -errno */
	char leader[NET_HOST_MAX + 8]; /* "HOST:PORT" */
	uint64_t term;                 /* the view's create revision */
	struct net_sockaddr sa;        /* the leader's address, resolved */
};

/* Follow key on the etcd at endpoints: 0 or -errno (-EINVAL: endpoints
 * that do not parse). */
int view_follow(const char *endpoints, const char *key, struct view_follower **ret);
/* Stop following (within an etcd call's bound).  NULL-safe. */
void view_unfollow(struct view_follower *f);
/* Loop: the newest view read since the last call (the caller frees it),
 * or NULL. */
struct master_view *view_take(struct view_follower *f);
