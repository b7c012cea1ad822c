/* SPDX-License-Identifier: MIT */
/*
 * The node's links to its masters (link.c).  node_owner(), node_lookup()
 * and node_lookup_many() are declared in node-private.h.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"

struct config;
struct link;
struct node;

/* Connect (again), or start the name lookup that comes first. */
void link_connect(struct link *k);
/* The link is broken: down, retried every RETRY_MS. */
void link_down(struct link *k, const char *why);
/* A link that follows etcd's master view: read the view again now and
 * then (ETCD_VIEW_CHECK), and go down when it names another leader (one
 * that was stopped keeps its connections open until heartbeats tell). */
usec_t link_check_view(struct link *k); /* when to look again; 0: never */
/* The frames read: all (with all), or up to one lookup's answer a turn
 * (k->more: the rest next turn).  0, or -errno: the link is beyond repair. */
int link_frames(struct link *k, bool all);
int link_heartbeat(struct link *k);
/* A directory update (UPD_*) for k's master, queued; sent by link_flush(). */
void link_update(struct link *k, uint8_t publish, const char *key, size_t key_len, uint64_t len,
		 uint64_t ver);
/* Send what is queued, a bounded number a turn; true if any. */
bool link_flush(struct link *k);
/* A slice of k's re-publish; true if any. */
bool link_resync_some(struct node *n, struct link *k);
/* How many bytes of updates a link queues at most. */
size_t link_queue_max(const struct config *cfg);
/* Fuzzing: fd (taken) as k's connection to its master, its Hello sent:
 * every frame that can be read from it handled, then the link down as if
 * the master had gone. */
void link_feed(struct link *k, int fd);
/* Its socket, queue and what it keeps go (teardown). */
void link_done(struct link *k);
