/* SPDX-License-Identifier: MIT */
/* What node.c (membership, directory) and the files moving objects between
 * nodes (rfetch.c fetching, serve.c serving, push.c pushing, xfer.c their
 * data threads, dircache.c the directory's answers) share. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster-admin.h"
#include "loop.h"
#include "net.h"
#include "peer-auth.h"
#include "peer-conn.h"
#include "rdma.h"
#include "dircache.h"
#include "fetch.h"
#include "presum.h"
#include "link.h"
#include "rfetch.h"
#include "serve.h"
#include "store.h"

#define DEFAULT_PEER_PORT 50052

/* A removal by prefix (empty: all) from a master, walked through this
 * node's objects a slice a turn (node.c drops_some()). */
#define MAX_DROP_WALKS 8
struct drop_walk {
	char prefix[PEER_MAX_KEY];
	size_t len;
	uint64_t ver, cursor;
};

/* Transfers with one peer, by the address it serves at (kvcachectl stats:
 * peer.<address>.<figure>). */
#define MAX_PEER_STATS 64

struct peer_stat {
	char addr[PEER_MAX_ID + 1];
	uint64_t fetches, fetch_bytes, fetch_errors;
	uint64_t pushes, push_bytes, push_errors;
	usec_t sick_until; /* a fetch from it timed out: others' first until then */
	bool probing;        /* a fetch from it is under way meanwhile (rf->probe) */
};

struct peer_stats {
	struct peer_stat s[MAX_PEER_STATS];
	unsigned n;
	char name[PEER_MAX_ID + 32]; /* the figure being emitted */
};

/* push.c's counters */
struct pusher {
	struct {
		uint64_t pushes, push_errors;
		uint64_t pushes_ahead; /* sent before the one ahead was answered (atomic) */
	} c;
};

struct xfer;
struct dcache;
struct lquery;
struct rfetch;
struct pserve;
struct presum;
struct members;

struct node {
	struct store *st;
	struct store_listener listener; /* the directory hears of the store's events */
	struct cluster_admin admin;     /* node_admin() */
	const struct config *cfg;
	struct loop *loop;
	char id[PEER_MAX_ID + 1];
	char address[PEER_MAX_ID + 1];
	uint64_t generation;
	int listen_fd, spare_fd; /* spare_fd: kept for accept_next() */
	struct loop_source *listen_src, *timer, *poller;
	struct links links;            /* to the masters (link.c) */
	uint32_t ttl_s;
	usec_t timeout;                /* --remote-timeout-ms */
	unsigned streams;              /* --data-streams: transfers at once, each way */
	struct peer_secret secret;     /* len 0: none */
	struct rdma *rdma;             /* one-sided transfers with RDMA peers, or NULL */
	char transport[96];            /* what Join says: "tcp", "rdma/<device>" */
	/* each file's own state, counters included: link.c the links,
	 * rfetch.c the fetches, dircache.c the directory's answers, serve.c
	 * the serving connections, xfer.c the data threads, push.c its
	 * counters, peers.c the per-peer figures */
	struct rfetcher fetches;
	struct dircache dc;
	struct peer_server srv;
	struct xfer *xfer;
	struct presum *presum;         /* checksums taken ahead (presum.c) */
	struct members *members;       /* membership through etcd (members.c), or NULL */
	struct holder h;               /* views of objects being pushed */
	struct {
		uint64_t removals_sent;  /* clients' removals told to the masters */
		uint64_t removals_unsent; /* ... that found no master to tell */
		uint64_t copies_dropped; /* copies a master said were older than a removal or put */
	} c;                           /* node.c's own; each file counts its own */
	struct pusher push;            /* push.c's */
	struct peer_stats pstats;      /* peers.c's */
	struct drop_walk drops[MAX_DROP_WALKS];
	unsigned n_drops;
	/* kvcachectl cluster waiting for the masters' member lists, asked
	 * for at once (be_refresh()) */
	struct {
		struct fetch f;
		bool waiting;
		usec_t deadline;
	} loads;
};

/* The figures of the peer at addr (a new entry the first time; NULL when
 * the table is full). */
struct peer_stat *node_peer_stat(struct node *n, const char *addr);

/* node.c */
struct link *node_owner(struct node *n, const void *key, size_t len);
/* Ask k's master who holds key; the answer goes to remote_located(). */
int node_lookup(struct link *k, const void *key, size_t len, uint32_t *ret_seq);
int node_lookup_many(struct link *k, ProtobufCBinaryData *keys, size_t n, uint32_t *ret_seq);



/* the remote backend: rfetch.c (setup, locate, located, expire, fetch_all),
 * dircache.c (holders, where), serve.c (accept, feed, hs_deadline), push.c
 * (push) */
int remote_init(struct node *n);
void remote_done(struct node *n);
int remote_locate(void *be, const void *key, size_t len, struct fetch **ret);
int remote_holders(void *be, const char *key, size_t len, char *buf, size_t cap, bool settle,
		   struct fetch **ret);
/* When the oldest connection yet to prove itself is closed (n->srv.hs_head). */
usec_t remote_hs_deadline(const struct node *n);
int remote_where(void *be, const char *const *keys, const size_t *lens, size_t n,
		 uint8_t *present, bool settle, struct fetch **ret);
void remote_located(struct node *n, struct link *k, uint32_t seq,
		    const Kvc__Peer__LookupResp *r);
/* k went down: what it was asked misses now, cleanly. */
void remote_link_lost(struct node *n, struct link *k);
void remote_expire(struct node *n, usec_t now);
void remote_accept(struct node *n, int fd);
/* A peer connection refused at accept: counted, and logged once in 10 s. */
void remote_refused(struct node *n, const char *why);
void remote_feed(struct node *n, int fd);
void remote_fetch_all(struct node *n, const char *const *keys, const uint64_t *lens, size_t k,
		      const char *address, void (*tick)(void *u), void *u, bool *got);
/* Copy key (held here, in memory) to the node named target; 0 started. */
int remote_push(void *be, const char *key, size_t len, const char *target);


