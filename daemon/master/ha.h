/* SPDX-License-Identifier: MIT */
/*
 * Several masters, one leader (kvcache-master --enable_ha): the leader is
 * elected on etcd and publishes where nodes reach it; the others stand by
 * and take over when its lease ends.  docs/cluster.rst says how, and what
 * it costs.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct loop;
struct master;
struct ha;

struct ha_config {
	const char *endpoints;  /* etcd's: "HOST:PORT;HOST:PORT" */
	const char *cluster_id; /* the view is /kvcache/<cluster_id>/master_view */
	const char *address;    /* where nodes reach this master: "HOST:PORT" */
	unsigned lease_ttl_s;   /* the leader's lease */
};

/* Campaign for m, on a thread of its own: m serves nodes while it leads
 * (master_set_role()).  0 or -errno. */
int ha_start(struct loop *l, struct master *m, const struct ha_config *cfg, struct ha **ret);
/* Stop; a leader lets go of its lease, so a standby takes over at once.
 * NULL-safe. */
void ha_stop(struct ha *h);
