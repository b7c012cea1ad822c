/* SPDX-License-Identifier: MIT */
/*
 * The thread that faults the memory tiers in at start (--prefault), off
 * core: core has no threads.  Its progress is the store's
 * prefaulted_bytes (store_prefaulted()).
 */
#pragma once

#include "store.h"

struct prefault;

/* Start faulting st's memory tiers in (nothing with --prefault off, or
 * when a thread cannot be had: only slower).  0 with *ret (or NULL). */
int prefault_start(struct store *st, struct prefault **ret);
/* Stop it (where it got to) and free it; NULL: nothing. */
void prefault_stop(struct prefault *pf);
