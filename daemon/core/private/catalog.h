/* SPDX-License-Identifier: MIT */
/*
 * The catalog (catalog.c): where each committed object of the memory tiers
 * is, written into a memfd of the daemon's own as objects come and go, so
 * that the next run can take the memory tiers over with their contents
 * (a hand-over to a new kvcached, or systemd's file-descriptor store).  See
 * docs/warm-restart.rst.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "catalog-layout.h"
#include "shmem.h"

struct object;
struct store;

struct catalog {
	int fd;            /* -1: no catalog (a store in a test, or no room) */
	uint8_t *base;
	uint64_t size;
	struct shm_alloc alloc;
	bool sealed;       /* the next run owns it now: nothing more is written */
	uint64_t full;     /* objects not written: no room */
};

/* A new catalog of size bytes, or the previous run's (fd: taken), for
 * this run's generation.  0 or -errno. */
int catalog_new(struct catalog *c, uint64_t size, uint64_t generation);
int catalog_adopt(struct catalog *c, int fd, uint64_t generation, const char **why);
void catalog_done(struct catalog *c);
/* o changed place (committed in memory, moved, or gone from memory):
 * its entry follows. */
void catalog_note(struct store *st, struct object *o);
/* o goes: its entry too. */
void catalog_forget(struct store *st, struct object *o);
/* Rewrite o's entry in place (its checksum became known). */
void catalog_rewrite(struct store *st, struct object *o);

/* The entries a previous run left, in catalog order: fn(u, entry, its
 * place in the catalog) for each whole one (magic, check and bounds). */
void catalog_scan(struct catalog *c, void (*fn)(void *u, const struct catalog_entry *e,
						uint64_t at), void *u);
/* An entry scanned is kept (its place taken in ascending order, cursor
 * as shm_alloc_take's) or cleared. */
int catalog_keep(struct catalog *c, uint64_t at, struct shm_block **cursor,
		 struct shm_block **ret);
void catalog_clear(struct catalog *c, uint64_t at);
