/* SPDX-License-Identifier: MIT */
/*
 * What the directory said lately about keys this node does not hold
 * (dircache.c): exists and prefix lookups are answered from it, asking a
 * master once per request for what it does not know; a fetch that follows
 * one takes the holders' addresses from it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "fetch.h"
#include "peer.pb-c.h"
#include "peer-wire.h"

struct node;
struct dcache;
struct lquery;
struct lpart;

#define DC_MASTERS 8 /* (link.h's MAX_MASTERS) */

/* The node's answers and questions (its dc; only dircache.c touches it,
 * but for pend_poll, which rfetch.c's timer runs). */
struct dircache {
	struct dcache *slots;     /* the answers */
	struct lquery *queries;   /* questions out */
	unsigned n_queries;
	/* their parts each master has not answered yet, oldest first (a
	 * master answers in the order asked: an answer is the first one's) */
	struct lpart *asked[DC_MASTERS], *asked_tail[DC_MASTERS];
	struct fetch query_room;  /* requests waiting for a place in queries */
	bool room_turn;           /* one of them runs again now */
	struct fetch pend_poll;   /* lookups of keys another node is storing */
	usec_t pend_poll_at;      /* when they ask again */
	struct {
		uint64_t lookup_waited; /* exists/prefix lookups that waited to ask */
		uint64_t pending_waits; /* lookups that waited for another node's put */
	} c;
};

#define DC_PENDING (20 * USEC_PER_MSEC) /* "being stored elsewhere": asked again this often */

int dircache_init(struct node *n);
/* k went down: one of the questions it had out is answered empty (a
 * clean miss, not a wait for the deadline); false when none is left. */
struct link;
bool queries_link_lost(struct node *n, const struct link *k);
/* Every question out and every answer kept goes (no waiter is left). */
void dircache_done(struct node *n);
/* A fresh answer naming holders: their addresses appended to addr (at most
 * max in all; *n_addr counts them) and the value's length; false when
 * there is none. */
bool dc_addresses(struct node *n, const char *key, size_t len, uint64_t h,
		  char (*addr)[PEER_MAX_ID + 1], unsigned max, unsigned *n_addr, uint64_t *ret_len);
/* The answer about key: present elsewhere (held by ids, at addrs: either
 * may be NULL) with the value's length, or not. */
void dc_put(struct node *n, const char *key, size_t len, bool present, const char *ids,
	    const char *addrs, uint64_t vlen);
/* A master's answer: true if it answered a question of this file's. */
bool query_answered(struct node *n, const struct link *k, uint32_t seq,
		    const Kvc__Peer__LookupResp *resp);
/* Questions out of time: what they did not learn is absent. */
void queries_expire(struct node *n, usec_t now);
