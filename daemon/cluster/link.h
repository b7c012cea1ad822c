/* SPDX-License-Identifier: MIT */
/*
 * The node's links to its masters (link.c).  node_owner(), node_lookup()
 * and node_lookup_many() are declared in node-private.h.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "net.h"
#include "peer-conn.h"
#include "peer-wire.h"

struct config;
struct node;

#define MAX_MASTERS 8
#define DEFAULT_MASTER_PORT 50051
#define RETRY_MS 500 /* (ms) */
#define RETRY (RETRY_MS * USEC_PER_MSEC)
#define ETCD_RETRY (50 * USEC_PER_MSEC) /* an etcd link waits for the view this often */
#define ETCD_ELECTION_RETRY (100 * USEC_PER_MSEC) /* while the view names no leader */
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
	 * etcd's master view, which a thread of the link's follows (view.h);
	 * a leader of an older term than the view's is refused */
	char etcd[NET_HOST_MAX + 8];    /* the endpoints; empty: a plain address */
	char view_key[NET_HOST_MAX];
	struct view_follower *vf;
	int view_res;                   /* the last view's: 0, -EHOSTUNREACH (none), -errno */
	char leader[NET_HOST_MAX + 8];  /* the view's address, the last one read */
	uint64_t view_term, term;
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
	/* link_flush()'s frame arrays, FLUSH_ENTRIES each, made on first use
	 * and kept: zeroing ~100 KB in every turn that sent one update cost
	 * the loop 5% of its time while a node took pushes */
	struct flush_arrays *fa;
	bool more;                   /* frames read and not yet handled (link_frames()) */
	/* re-publishing what this node holds */
	bool resync;
	uint64_t cursor;
	Kvc__Peer__Members *members; /* the last answer */
	bool loads_asked;            /* a heartbeat out for kvcachectl cluster */
};

/* The links of one node, and what they hand on: a master's answer to a
 * lookup, a Drop, a link lost with lookups out (the node's callbacks, so
 * the links call nothing above them by name). */
struct links {
	struct link l[MAX_MASTERS];
	unsigned n;
	void (*lookup_answered)(struct node *n, struct link *k, uint32_t seq,
				const Kvc__Peer__LookupResp *r);
	void (*dropped)(struct node *n, const Kvc__Peer__Drop *d);
	void (*lost)(struct node *n, struct link *k);
	void (*heard)(struct node *n, struct link *k); /* a member list came */
	struct peer_arena answers; /* a lookup's answer, decoded (on_frame) */
	struct {
		uint64_t master_drops;        /* links to a master that went down */
		uint64_t directory_overflows; /* updates that found a link's queue full */
		uint64_t version_refused;     /* masters of another protocol major */
	} c;
};


/* Connect (again), or start the name lookup that comes first. */
void link_connect(struct link *k);
/* The link is broken: down, retried every RETRY_MS. */
void link_down(struct link *k, const char *why);
/* A link that follows etcd's master view: take its follower's newest
 * word; connect at once to a new leader, and leave one the view no longer
 * names (one that was stopped keeps its connections open until heartbeats
 * tell). */
usec_t link_check_view(struct link *k); /* when to look again; 0: never */
/* The frames read: all (with all), or up to one lookup's answer a turn
 * (k->more: the rest next turn).  0, or -errno: the link is beyond repair. */
int link_frames(struct link *k, bool all);
int link_heartbeat(struct link *k);
/* A directory update (UPD_*) for k's master, queued; sent by link_flush(). */
void link_update(struct link *k, uint8_t publish, const char *key, size_t key_len, uint64_t len,
		 uint64_t ver);
/* Send what is queued, a bounded number a turn; true if any. */
bool link_flush(struct link *k);
/* A slice of k's re-publish; true if any. */
bool link_resync_some(struct node *n, struct link *k);
/* How many bytes of updates a link queues at most. */
size_t link_queue_max(const struct config *cfg);
/* Fuzzing: fd (taken) as k's connection to its master, its Hello sent:
 * every frame that can be read from it handled, then the link down as if
 * the master had gone. */
void link_feed(struct link *k, int fd);
/* Its socket, queue and what it keeps go (teardown). */
void link_done(struct link *k);
