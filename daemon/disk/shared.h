/* SPDX-License-Identifier: MIT */
/*
 * The shared tier (shared.c, docs/shared-tier.rst): record files in a
 * directory several nodes mount, attached to the store with
 * store_shared_attach().  main.c makes and frees it; core reaches it only
 * through the table it attaches.
 */
#pragma once

#include "store.h"

struct shared;

/* The tier in --shared-dir (*ret NULL without one): 0, or -errno.  It
 * starts off and turns itself on once a helper thread has found the
 * directory there (the loop never waits for it).  shared_free() waits for
 * the calls in flight (a hung filesystem: for as long as it hangs) and
 * detaches the tier; NULL-safe. */
int shared_new(struct store *st, struct shared **ret);
void shared_free(struct shared *sh);

/* A record read whole (len bytes) from key's file, before its value is
 * trusted: 0 with *ret its header (its value follows at
 * disk_record_payload_off() and fits), -EPROTONOSUPPORT (a newer format's,
 * skipped) or -EBADMSG (torn, damaged, compressed, or another key's).  The
 * value's checksum is checked as it is copied out. */
struct disk_record_hdr;
int shared_record_parse(const void *buf, size_t len, const void *key, uint32_t key_len,
			struct disk_record_hdr *ret);
