/* SPDX-License-Identifier: MIT */
/*
 * Membership through etcd (members.c): this node's key under
 * /kvcache/<ID>/nodes/, alive on a lease, and the list of the others.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "peer-wire.h"

struct node;

#define MEMBERS_MAX 256

struct member {
	char id[PEER_MAX_ID + 1];
	char address[PEER_MAX_ID + 1];
	char transport[96];
	char version[32];
};

struct member_list {
	size_t n;
	struct member m[MEMBERS_MAX];
};

/* spec: "etcd://HOST:PORT[,HOST:PORT...][/CLUSTER_ID]"; the key's lease
 * lasts ttl_s.  0 or -errno (with err). */
int members_start(struct node *n, const char *spec, unsigned ttl_s, char *err, size_t err_len);
/* Leave (the key goes at once) and stop.  NULL-safe. */
void members_stop(struct node *n);
/* Loop: the newest list read (NULL before the first, or without etcd). */
const struct member_list *members_view(struct node *n);
void members_stats(struct node *n, void (*emit)(void *u, const char *name, uint64_t v), void *u);
