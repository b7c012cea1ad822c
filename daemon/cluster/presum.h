/* SPDX-License-Identifier: MIT */
/*
 * Checksums taken ahead (presum.c): a thread at idle priority hashes the
 * objects a store publishes in memory, of at least min_len bytes, soon
 * after their commit.  A node's sends then carry the checksum without
 * hashing; and a crash under systemd's file-descriptor store keeps the
 * objects whose checksum is known (docs/warm-restart.rst).
 */
#pragma once

#include <stdint.h>

#include "config.h"
#include "store.h"

struct presum;

/* Objects of at least this many bytes have their checksum taken ahead
 * (smaller ones a node hashes as it sends them, in cache). */
#define PRESUM_MIN (64u << 10)

/* It listens to st's events from now on: 0 with *ret, or -errno. */
int presum_new(struct store *st, const struct config *cfg, uint64_t min_len,
	       struct presum **ret);
/* What is in flight ends and is given back; NULL: nothing. */
void presum_free(struct presum *p);
/* o needs no checksum taken ahead (a push hashes it as it sends it). */
void presum_forget(struct presum *p, struct object *o);
void presum_stats(const struct presum *p, void (*emit)(void *u, const char *name, uint64_t v),
		  void *u);
