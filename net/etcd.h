/* SPDX-License-Identifier: MIT */
/*
 * A small client of etcd's v3 API through its JSON gateway over HTTP
 * (etcd 3.4 and later: POST /v3/kv/range and the like, keys and values in
 * base64).  Blocking calls, each bounded by the timeout the client was
 * made with, for threads that may wait (never a loop).  Endpoints are
 * tried in turn, the last one that answered first.  Each returns 0 or
 * -errno: -ETIMEDOUT or -ECONNREFUSED when no endpoint answered in time,
 * -EIO when one answered with something else than etcd's JSON, -ENOENT
 * for a key or lease that is not there.  One client is one thread's.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"

#define ETCD_MAX_ENDPOINTS 8

struct etcd;

/* endpoints: "HOST:PORT" (or "http://HOST:PORT") separated by ';' or ','
 * (Mooncake's etcd_endpoints, kvcache's etcd://...). */
int etcd_new(const char *endpoints, usec_t timeout, struct etcd **ret);
void etcd_free(struct etcd *e); /* NULL-safe */
/* The endpoint that answered last ("HOST:PORT"). */
const char *etcd_endpoint(const struct etcd *e);

/* A lease of ttl_s seconds: its ID. */
int etcd_lease_grant(struct etcd *e, unsigned ttl_s, int64_t *ret_id);
/* Renewed: *ret_ttl the seconds it has now; -ENOENT when it had ended. */
int etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ret_ttl);
int etcd_lease_revoke(struct etcd *e, int64_t id);

/* key = value, bound to lease (0: none), only if key does not exist:
 * 0 with *ret_rev its create revision, or -EEXIST with *ret_rev the
 * existing key's create revision. */
int etcd_create(struct etcd *e, const char *key, const char *value, int64_t lease,
		int64_t *ret_rev);
/* key = value, bound to lease (0: none). */
int etcd_put(struct etcd *e, const char *key, const char *value, int64_t lease);
/* key's value into buf (at most cap - 1 bytes and a NUL; -ENOSPC if it is
 * longer), with its create revision (ret_rev may be NULL). */
int etcd_get(struct etcd *e, const char *key, char *buf, size_t cap, int64_t *ret_rev);
/* The same, with *ret_at the revision it was read at (to watch from),
 * also when the key is not there (-ENOENT). */
int etcd_get_at(struct etcd *e, const char *key, char *buf, size_t cap, int64_t *ret_rev,
		int64_t *ret_at);
int etcd_delete(struct etcd *e, const char *key);
/* Every key under prefix, sorted, at most max: fn(u, key, value) each
 * (keys and values NUL-terminated); the count, with *ret_rev the revision
 * it was read at (may be NULL). */
int etcd_list(struct etcd *e, const char *prefix, size_t max,
	      void (*fn)(void *u, const char *key, const char *value), void *u, int64_t *ret_rev);
/* Wait at most `wait` for a change under prefix after revision rev (a key
 * put or deleted): 0 once one came, -ETIMEDOUT if none did. */
int etcd_wait_change(struct etcd *e, const char *prefix, int64_t rev, usec_t wait);

/* Fuzzing: data as every answer etcd's gateway may send, and as a watch's
 * stream. */
int etcd_fuzz_answer(const uint8_t *data, size_t len);
/* Wait for key to be deleted (or to be there no more) at most `wait`:
 * 0 once it is gone, -ETIMEDOUT if it still is.  A watch from the
 * revision after `rev` (0: now). */
int etcd_wait_gone(struct etcd *e, const char *key, int64_t rev, usec_t wait);
