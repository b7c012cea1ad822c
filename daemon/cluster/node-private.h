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
#include "rfetch.h"
#include "serve.h"
#include "store.h"

#define MAX_MASTERS 8
#define DEFAULT_PEER_PORT 50052
#define DEFAULT_MASTER_PORT 50051
#define RETRY_MS 500 /* (ms) */
#define RETRY (RETRY_MS * USEC_PER_MSEC)
#define ETCD_RETRY (50 * USEC_PER_MSEC) /* an etcd link waits for the view this often */
#define ETCD_CALL (1 * USEC_PER_SEC)    /* each call to etcd */
#define ETCD_ELECTION_RETRY (100 * USEC_PER_MSEC) /* while the view names no leader */
#define ETCD_VIEW_CHECK (500 * USEC_PER_MSEC) /* a joined link reads the view again */
#define LINK_MAX_OUT (64u << 20)
#define QUEUE_MAX (256u << 20)      /* directory updates queued on one link */
#define BATCH_BYTES (1u << 20)      /* keys per frame, about */
#define FLUSH_ENTRIES 1024          /* directory updates sent per loop turn */
#define RESYNC_BUCKETS 4096         /* index buckets walked per turn, */
#define RESYNC_OBJECTS 1024         /* or about this many objects */

enum link_state { L_DOWN, L_CONNECTING, L_HELLO, L_JOINING, L_UP };

/* A queued directory update: op, len, key_len, key bytes. */
/* kinds of directory update */
enum { UPD_WITHDRAW, UPD_PUBLISH, UPD_PENDING, UPD_REPLACE };

struct upd_hdr {
	uint8_t publish; /* UPD_* */
	uint16_t key_len;
	uint64_t len;
	uint64_t ver;
} __attribute__((packed));

/* A removal by prefix (empty: all) from a master, walked through this
 * node's objects a slice a turn (node.c drops_some()). */
#define MAX_DROP_WALKS 8
struct drop_walk {
	char prefix[PEER_MAX_KEY];
	size_t len;
	uint64_t ver, cursor;
};

struct resolve_req;

struct link {
	struct node *n;
	unsigned index;
	struct net_addr addr;
	/* a master given by name: resolved on a thread of its own (DNS may
	 * keep getaddrinfo() for seconds), the last answer kept */
	struct resolve_req *rq;
	struct net_sockaddr sa;
	bool have_sa;
	char name[NET_HOST_MAX + 8];
	/* --master etcd://ENDPOINTS[/CLUSTER_ID]: the leader is the one in
	 * etcd's master view, read on the same thread before each connect;
	 * a leader of an older term than the view's is refused */
	char etcd[NET_HOST_MAX + 8];    /* the endpoints; empty: a plain address */
	char view_key[NET_HOST_MAX];
	char leader[NET_HOST_MAX + 8];  /* the view's address, the last one read */
	uint64_t view_term, term;
	usec_t view_check_at;
	char shown[2 * NET_HOST_MAX + 48]; /* kvcachectl cluster: the name and the leader */
	enum link_state state;
	struct pconn pc;
	struct loop_source *src;
	usec_t retry_at, hb_at, heard;
	uint32_t seq;
	bool warned;
	uint32_t features;           /* the master's HelloAck */
	uint8_t nonce[PEER_NONCE_SIZE];
	/* directory updates not yet sent */
	uint8_t *q;
	size_t q_len, q_cap, q_max;
	bool more;                   /* frames read and not yet handled (link_frames()) */
	/* re-publishing what this node holds */
	bool resync;
	uint64_t cursor;
	Kvc__Peer__Members *members; /* the last answer */
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
	struct link links[MAX_MASTERS];
	unsigned n_links;
	/* what the links hand on: a master's answer to a lookup, a Drop */
	void (*lookup_answered)(struct node *n, struct link *k, uint32_t seq,
				const Kvc__Peer__LookupResp *r);
	void (*dropped)(struct node *n, const Kvc__Peer__Drop *d);
	uint32_t ttl_s;
	usec_t timeout;                /* --remote-timeout-ms */
	unsigned streams;              /* --data-streams: transfers at once, each way */
	struct peer_secret secret;     /* len 0: none */
	struct rdma *rdma;             /* one-sided transfers with RDMA peers, or NULL */
	char transport[96];            /* what Join says: "tcp", "rdma/<device>" */
	struct peer_arena answers; /* a lookup's answer, decoded (link.c on_frame) */
	/* each file's own state: rfetch.c the fetches, dircache.c the
	 * directory's answers, serve.c the serving connections, xfer.c the
	 * data threads */
	struct rfetcher fetches;
	struct dircache dc;
	struct peer_server srv;
	struct xfer *xfer;
	struct presum *presum;         /* checksums taken ahead (presum.c) */
	struct members *members;       /* membership through etcd (members.c), or NULL */
	struct holder h;               /* views of objects being pushed */
	struct {
		uint64_t remote_hits, remote_misses, remote_bytes_in, remote_bytes_out;
		uint64_t remote_errors, remote_corrupt, served, serve_errors;
		uint64_t served_summed; /* sent with a checksum known before */
		uint64_t fetch_waited;  /* fetches that waited for a place in flight */
		uint64_t fetch_ahead;   /* asked before the one ahead was answered (atomic) */
		uint64_t lookup_waited; /* exists/prefix lookups that waited to ask */
		uint64_t pending_waits; /* lookups that waited for another node's put */
		uint64_t sick_skips;    /* fetches not sent to a holder known sick */
		uint64_t hs_timeouts;   /* peer connections closed without a handshake */
		uint64_t refused;       /* peer connections refused at accept (all in use) */
		uint64_t pushes, push_errors, pushes_received;
		uint64_t pushes_eager, pushes_refused; /* received */
		uint64_t pushes_ahead; /* sent before the one ahead was answered (atomic) */
		uint64_t master_drops; /* links to a master that went down */
		uint64_t directory_overflows; /* updates that found a link's queue full */
		uint64_t rdma_fallbacks; /* RDMA peers whose handshake or endpoint failed: tcp */
		uint64_t removals_sent;  /* clients' removals told to the masters */
		uint64_t removals_unsent; /* ... that found no master to tell */
		uint64_t copies_dropped; /* copies a master said were older than a removal or put */
		uint64_t peer_version_refused; /* masters and peers of another protocol major */
		/* object bytes by transport: fetched or pushed here (in), served
		 * or pushed from here (out) */
		uint64_t tcp_bytes_in, tcp_bytes_out, rdma_bytes_in, rdma_bytes_out;
	} c;
	struct drop_walk drops[MAX_DROP_WALKS];
	unsigned n_drops;
	struct peer_stat peer_stats[MAX_PEER_STATS];
	unsigned n_peer_stats;
	char stat_name[PEER_MAX_ID + 32];
};

/* The figures of the peer at addr (a new entry the first time; NULL when
 * the table is full). */
struct peer_stat *node_peer_stat(struct node *n, const char *addr);

/* node.c */
struct link *node_owner(struct node *n, const void *key, size_t len);
/* Ask k's master who holds key; the answer goes to remote_located(). */
int node_lookup(struct link *k, const void *key, size_t len, uint32_t *ret_seq);
int node_lookup_many(struct link *k, ProtobufCBinaryData *keys, size_t n, uint32_t *ret_seq);

/* presum.c: objects of at least PRESUM_MIN bytes have their checksum
 * taken in the background after their commit (smaller ones the loop
 * hashes as it sends them, in cache) */
#define PRESUM_MIN (64u << 10)
int presum_init(struct node *n);
void presum_done(struct node *n);
void presum_add(struct node *n, struct object *o);
void presum_forget(struct node *n, struct object *o);
void presum_stats(struct node *n, void (*emit)(void *u, const char *name, uint64_t v), void *u);

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


