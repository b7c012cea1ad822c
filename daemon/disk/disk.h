/* SPDX-License-Identifier: MIT */
/*
 * The disk tier: record files below memory, attached to the store as the
 * tier below (below.h) and to the loop as a poller.  main.c makes and
 * frees it; core reaches it only through the table it attaches.
 */
#pragma once

#include "store.h"

struct disk;

/* Set up the tier in --disk-dir and start recovering what it holds: 0
 * with *ret the tier (NULL without --disk-dir); on failure *ret, if set,
 * is still to be freed.  disk_free() waits for the I/O in flight and
 * detaches the tier from the store (NULL: nothing to do). */
int disk_new(struct store *st, struct disk **ret);
void disk_free(struct disk *k);
