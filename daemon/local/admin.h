/* SPDX-License-Identifier: MIT */
/*
 * What a session is asked about the daemon rather than an object (status,
 * stats, the cluster view, listings, evictions, removals by prefix, pushes)
 * and the figures /metrics exports: built on the store's and the
 * cluster-admin calls alone (admin.c).  A session's reply, which these
 * fill, is defined here.
 */
#pragma once

#include "kvcache.pb-c.h"
#include "buffer.h"
#include "session.h"

/* A response being built, and what goes with it. */
struct reply {
	Kvc__Response resp;
	Kvc__Extent extent;
	Kvc__ExistsResp exists;
	char msg[STORE_MSG_MAX];
	void *free1, *free2; /* scratch released after sending */
	int fds[2];          /* sent with the response */
	size_t n_fds;
};

int admin_status(struct session *s, struct reply *rep);
int admin_cluster(struct session *s, struct reply *rep);
int admin_stats(struct session *s, struct reply *rep);
/* A bounded slice of the index per request (a cursor goes on). */
int admin_list(struct session *s, const Kvc__ListReq *lq, struct reply *rep);
int admin_evict(struct session *s, const Kvc__EvictReq *eq, struct reply *rep);
int admin_remove_prefix(struct session *s, const Kvc__RemoveReq *rq, struct reply *rep);
