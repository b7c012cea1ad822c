/* SPDX-License-Identifier: MIT */
/*
 * The cluster's data threads and their connections (xfer.c): jobs that
 * move bytes with blocking calls (net/blocking.h), off the loop, each
 * ended back on the loop.  What a job is, its ops say (struct xjob_ops):
 * fetches (rfetch.c), sends and received pushes (serve.c), pushes
 * (push.c).
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "worker.h"
#include "peer.pb-c.h"
#include "peer-wire.h"

struct node;
struct xjob;
struct loop_source;

#define MAX_STREAMS 16       /* --data-streams */
#define PIPE_MAX 16          /* jobs run together on one connection, at most */
#define PEER_BUSY_MAX 64     /* peers with fetch threads at work, tracked */

/*
 * What a data thread's job is, and who hears of its end: a fetch, a send
 * to an asker, a push, a pushed object received.  The data threads know
 * nothing else of them.
 */
struct xjob_ops {
	unsigned queue; /* 0: this node's fetches and pushes out; 1: serving */
	/* the peer it works for (its threads are limited per peer), or NULL */
	const char *(*peer)(const struct xjob *j);
	/* may next, queued right behind first, run with it (one connection,
	 * asked ahead)?  NULL: never */
	bool (*joins)(const struct node *n, const struct xjob *first, const struct xjob *next);
	/* data thread: run jobs[0..k), handing each back as it ends */
	void (*run)(struct node *n, struct xjob **jobs, unsigned k);
	/* loop: it ended, with res */
	void (*done)(struct node *n, struct xjob *j);
	/* teardown: never run, or its end never heard (NULL: nothing to do) */
	void (*drop)(struct xjob *j);
};

struct xjob {
	struct work w;       /* the data threads' (worker.h) */
	const struct xjob_ops *ops;
	int res;
	void *owner;         /* struct rfetch, rpush or pserve */
	struct node *n;
};

/* Data connections kept open between fetches (a fresh TCP connection
 * starts slow and with small buffers): by holder address. */
#define IDLE_MAX 16

struct idle_conn {
	int fd;
	bool rdma; /* the handshake agreed on one-sided reads */
	char addr[PEER_MAX_ID + 1];
};

/* A queue and its threads (a shared worker, worker.h). */
struct xqueue {
	struct node *n;
	unsigned qi;
	struct worker *wk;
};

struct xfer {
	/* two queues, each with its own threads, so that a slow peer being
	 * served never holds up this node's own fetches, nor the reverse:
	 * [0] fetches and pushes out, [1] serving (sends, pushed receives).
	 * The loop hands jobs over without a lock (worker.h): it was once
	 * seen asleep in pthread_cond_signal(). */
	struct xqueue q[2];
	/* xfer_hold(): jobs kept to go together (loop) */
	bool holding;
	struct work *held, **held_tail;
	size_t n_held;
	/* data threads only (the loop never takes it): */
	pthread_mutex_t lock;
	struct idle_conn idle[IDLE_MAX]; /* under lock */
	unsigned n_idle;
	/* threads of queue 0 at work for each peer (under queue 0's worker's
	 * lock; a slot whose count is 0 is free): at most per_peer at once,
	 * so the queue's one thread more is always there for the others (a
	 * holder that stopped answering held every thread until its
	 * deadline) */
	struct {
		char addr[PEER_MAX_ID + 1];
		unsigned busy;
	} pbusy[PEER_BUSY_MAX];
	unsigned per_peer;
	/* when each holder last answered a fetch (under lock; the oldest
	 * entry goes for a new holder): a fetch queued behind one that keeps
	 * sending is not out of time (fetch_deadline()) */
	struct {
		char addr[PEER_MAX_ID + 1];
		usec_t at;
	} moved[PEER_BUSY_MAX];
	bool corrupt; /* tests: flip the first byte of what is served */
	bool cut;     /* tests: KVCACHE_TEST_CUT_PEER_SEND=1 (config.h) */
	bool no_eager; /* tests: KVCACHE_TEST_NO_EAGER_PUSH=1, pushes wait for PushReady */
	char bogus_rdma; /* tests: 'r' damaged rkeys, 'a' a damaged worker address */
	struct {
		/* object bytes by transport: fetched or pushed here (in),
		 * served or pushed from here (out) */
		uint64_t remote_bytes_in, remote_bytes_out;
		uint64_t tcp_bytes_in, tcp_bytes_out, rdma_bytes_in, rdma_bytes_out;
		uint64_t rdma_fallbacks; /* RDMA peers whose handshake or endpoint failed: tcp */
	} c;
};

/* Loop: a job for the data threads of its queue (never waits). */
void xfer_queue(struct node *n, struct xjob *j);
/* Loop: the fetches and pushes queued from here until xfer_release() go to the data
 * threads together (fuzzers want the same run every time). */
void xfer_hold(struct node *n);
void xfer_release(struct node *n);
/* Data thread: j ended (j->res): its ops' done runs on the loop. */
void xfer_hand_back(struct node *n, struct xjob *j);
/* A data connection to address kept from before, or -1 (*rdma: whether
 * its handshake agreed on one-sided transfers). */
int xfer_idle_take(struct xfer *x, const char *address, bool *rdma);
/* fd to address is fine: kept for the next job (or closed, if the pool is
 * full). */
void xfer_idle_put(struct xfer *x, const char *address, int fd, bool rdma);
/* A new data connection to the node at address, shaken hands with when
 * there is a secret or RDMA here: 0 with *ret_fd, or -errno. */
int xfer_open_conn(struct node *n, const char *address, usec_t deadline, int *ret_fd,
		   bool *rdma);
/* One frame of message m; one frame of at most cap payload bytes, of the
 * type expected, decoded into *ret. */
int xfer_send_msg(int fd, uint8_t type, const ProtobufCMessage *m, usec_t deadline);
int xfer_recv_frame(int fd, uint8_t type, uint8_t *buf, size_t cap, usec_t deadline,
		    ProtobufCMessage **ret);
/* An RDMA read (get) or write of len bytes in steps, paced. */
struct blk_pace;
int xfer_rdma(struct node *n, bool get, const char *peer, uint32_t rid, uint64_t roff,
	      uint32_t lid, uint64_t loff, uint64_t len, const struct blk_pace *pace);
/* Loop: run the ends of the jobs the data threads handed back; false if
 * there were none (the loop's poller; fuzzers call it too). */
bool xfer_poll(void *u);
/* Data thread: when the holder at address last answered a fetch here (0:
 * not lately); that it answered now (returns now). */
usec_t xfer_moved(struct xfer *x, const char *address);
usec_t xfer_note_moved(struct xfer *x, const char *address);
/* The data threads and their queues (n->xfer); all of it goes, the jobs
 * not run or not collected dropped (xfer_done, after which no job's
 * done runs). */
int xfer_init(struct node *n);
void xfer_done(struct node *n);
/* Loop: an object's bytes moved in or out, and by which transport. */
void xfer_count_bytes(struct node *n, bool in, bool rdma, uint64_t len);
