/* SPDX-License-Identifier: MIT */
/*
 * The disk tier: record files below memory, registered with the store as
 * its backend (fetch.h) and with the loop as a poller.  main.c starts and
 * stops it; core reaches it through the backend table it attaches.
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
