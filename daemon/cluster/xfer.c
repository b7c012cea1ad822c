/* SPDX-License-Identifier: MIT */
/*
 * The data threads every transfer between nodes runs on (xfer.h): two
 * queues with their own threads (this node's fetches and pushes; serving
 * others), a per-peer limit so one peer never holds every thread, runs of
 * jobs that may share a connection, the pool of kept data connections
 * and their handshake.  The loop queues jobs and collects their ends
 * without ever waiting: handoff.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blocking.h"
#include "handoff.h"
#include "log.h"
#include "worker.h"
#include "node-private.h"
#include "xfer.h"

#define LOG_TOPIC "remote"

#define PEER_SCAN_MAX 512    /* jobs a fetch thread looks past for another peer's */

/* A data thread polls for bytes it waits for this many times --poll-us
 * before it sleeps (blk_set_poll_window(); why: net/blocking.c). */
#define POLL_WINDOW_X 10 /* --poll-us 100: 1 ms */

/* One-sided transfers show no progress until they end: they go in steps
 * of this, each bounded like a chunk. */
#define RDMA_STEP (8u << 20)

/* An RDMA read (get) or write of len bytes in steps, paced: 0 or -errno. */
int xfer_rdma(struct node *n, bool get, const char *peer, uint32_t rid, uint64_t roff,
		      uint32_t lid, uint64_t loff, uint64_t len, const struct blk_pace *pace)
{
	int r = 0;

	for (uint64_t off = 0; r == 0 && off < len; off += RDMA_STEP) {
		uint64_t k = len - off < RDMA_STEP ? len - off : RDMA_STEP;

		r = get ? rdma_get(n->rdma, peer, rid, roff + off, lid, loff + off, k, blk_pace_next(pace))
			: rdma_put(n->rdma, peer, rid, roff + off, lid, loff + off, k, blk_pace_next(pace));
	}
	return r;
}

int xfer_idle_take(struct xfer *x, const char *address, bool *rdma)
{
	int fd = -1;

	pthread_mutex_lock(&x->lock);
	for (unsigned i = 0; i < x->n_idle; i++)
		if (!strcmp(x->idle[i].addr, address)) {
			fd = x->idle[i].fd;
			*rdma = x->idle[i].rdma;
			x->idle[i] = x->idle[--x->n_idle];
			break;
		}
	pthread_mutex_unlock(&x->lock);
	return fd;
}

void xfer_idle_put(struct xfer *x, const char *address, int fd, bool rdma)
{
	pthread_mutex_lock(&x->lock);
	if (x->n_idle == IDLE_MAX) {
		close(x->idle[0].fd);
		x->idle[0] = x->idle[--x->n_idle];
	}
	x->idle[x->n_idle].fd = fd;
	x->idle[x->n_idle].rdma = rdma;
	snprintf(x->idle[x->n_idle].addr, sizeof(x->idle[0].addr), "%s", address);
	x->n_idle++;
	pthread_mutex_unlock(&x->lock);
}

static int handshake(struct node *n, int fd, usec_t deadline, const char *address, bool *rdma);

/* A new data connection to the holder at address, shaken hands with
 * when there is a secret or RDMA here: 0 with *ret_fd, or -errno. */
int xfer_open_conn(struct node *n, const char *address, usec_t deadline, int *ret_fd,
		     bool *rdma)
{
	struct net_addr a;
	int fd, r;

	*rdma = false;
	if (net_addr_parse(address, 0, &a) < 0)
		return -EINVAL;
	r = net_connect_start(&a, &fd);
	if (r < 0)
		return r;
	r = blk_wait(fd, POLLOUT, deadline);
	if (r == 0)
		r = net_connect_result(fd);
	if (r == 0) {
		net_tune(fd, 1);
		net_congestion(fd, n->cfg->tcp_congestion); /* checked at start */
		r = blk_set_blocking(fd, true);
	}
	if (r == 0 && (n->secret.len || n->rdma))
		r = handshake(n, fd, deadline, address, rdma);
	if (r < 0) {
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

/* One frame of at most cap payload bytes, of the type expected. */
int xfer_recv_frame(int fd, uint8_t type, uint8_t *buf, size_t cap, usec_t deadline,
		      ProtobufCMessage **ret)
{
	uint8_t hdr[PEER_HDR_SIZE];
	struct peer_hdr h;
	int r = blk_recv(fd, hdr, sizeof(hdr), deadline);

	if (r == 0)
		r = peer_hdr_decode(hdr, cap, &h);
	if (r == 0 && h.type != type)
		r = -EPROTO;
	if (r == 0)
		r = blk_recv(fd, buf, h.len, deadline);
	if (r == 0)
		r = peer_msg_decode(h.type, buf, h.len, ret);
	return r;
}

int xfer_send_msg(int fd, uint8_t type, const ProtobufCMessage *m, usec_t deadline)
{
	uint8_t *frame;
	size_t len;
	int r = peer_frame_pack(type, 1, m, &frame, &len);

	if (r < 0)
		return r;
	r = blk_send(fd, frame, len, deadline);
	free(frame);
	return r;
}

/* The holder's pool as its RdmaInfo frame tells it, for one-sided reads:
 * *rdma stays false (plain tcp on this connection) if this node's UCX does
 * not take it. */
static int rdma_learn(struct node *n, int fd, usec_t deadline, const char *address, bool *rdma)
{
	struct rdma_region regs[PEER_MAX_REGIONS];
	Kvc__Peer__RdmaInfo *ri;
	ProtobufCMessage *m;
	uint8_t *buf = malloc(64u << 10);
	int r = buf ? xfer_recv_frame(fd, PEER_RDMA_INFO, buf, 64u << 10, deadline, &m) : -ENOMEM;

	free(buf);
	if (r < 0)
		return r;
	ri = (Kvc__Peer__RdmaInfo *) m;
	for (size_t i = 0; i < ri->n_regions; i++)
		regs[i] = (struct rdma_region) { ri->regions[i]->id, ri->regions[i]->addr,
						 ri->regions[i]->size, ri->regions[i]->rkey.data,
						 ri->regions[i]->rkey.len };
	r = rdma_peer_set(n->rdma, address, ri->worker.data, ri->worker.len, regs,
			  (unsigned) ri->n_regions);
	protobuf_c_message_free_unpacked(m, NULL);
	if (r < 0) {
		__atomic_fetch_add(&n->xfer->c.rdma_fallbacks, 1, __ATOMIC_RELAXED);
		log_warn_ratelimited("%s: its RDMA description was refused (%s); tcp with it",
				     address, strerror(-r));
		return 0;
	}
	*rdma = true;
	return 0;
}

/* On a new data connection, with a secret or with RDMA here: Hello, the
 * holder's proof and ours (with a secret), then the holder's pool when
 * both have RDMA. */
static int handshake(struct node *n, int fd, usec_t deadline, const char *address, bool *rdma)
{
	Kvc__Peer__Hello hello = KVC__PEER__HELLO__INIT;
	Kvc__Peer__Auth au = KVC__PEER__AUTH__INIT;
	Kvc__Peer__HelloAck *ack;
	ProtobufCMessage *m;
	uint8_t nonce[PEER_NONCE_SIZE], proof[PEER_PROOF_SIZE], buf[1024];
	bool secret = n->secret.len, both_rdma;
	int r;

	*rdma = false;
	peer_nonce(nonce);
	hello.major = peer_major;
	hello.minor = PEER_MINOR;
	hello.features = PEER_FEAT_TCP | (n->rdma ? PEER_FEAT_RDMA : 0);
	hello.node_id = n->id;
	hello.role = PEER_ROLE_NODE;
	if (secret)
		hello.nonce = (ProtobufCBinaryData) { .len = sizeof(nonce), .data = nonce };
	r = xfer_send_msg(fd, PEER_HELLO, &hello.base, deadline);
	if (r == 0)
		r = xfer_recv_frame(fd, PEER_HELLO_ACK, buf, sizeof(buf), deadline, &m);
	if (r < 0)
		return r;
	ack = (Kvc__Peer__HelloAck *) m;
	if (ack->error || (secret && (ack->nonce.len != PEER_NONCE_SIZE ||
				      !peer_proof_ok(&n->secret, nonce, sizeof(nonce),
						     ack->proof.data, ack->proof.len)))) {
		protobuf_c_message_free_unpacked(m, NULL);
		return -EACCES;
	}
	both_rdma = n->rdma && (ack->features & PEER_FEAT_RDMA);
	if (secret)
		peer_proof(&n->secret, ack->nonce.data, ack->nonce.len, proof);
	protobuf_c_message_free_unpacked(m, NULL);
	if (secret) {
		au.proof = (ProtobufCBinaryData) { .len = sizeof(proof), .data = proof };
		r = xfer_send_msg(fd, PEER_AUTH, &au.base, deadline);
	}
	if (r == 0 && both_rdma)
		r = rdma_learn(n, fd, deadline, address, rdma);
	return r;
}

/* When the holder at address last answered a fetch here (0: not lately).
 * Under x->lock. */
static usec_t *moved_at(struct xfer *x, const char *address)
{
	unsigned oldest = 0;

	for (unsigned i = 0; i < PEER_BUSY_MAX; i++) {
		if (!strcmp(x->moved[i].addr, address))
			return &x->moved[i].at;
		if (x->moved[i].at < x->moved[oldest].at)
			oldest = i;
	}
	snprintf(x->moved[oldest].addr, sizeof(x->moved[oldest].addr), "%s", address);
	x->moved[oldest].at = 0;
	return &x->moved[oldest].at;
}

/* The holder at address answered: now. */
usec_t xfer_note_moved(struct xfer *x, const char *address)
{
	usec_t now = mono_us();

	pthread_mutex_lock(&x->lock);
	*moved_at(x, address) = now;
	pthread_mutex_unlock(&x->lock);
	return now;
}

usec_t xfer_moved(struct xfer *x, const char *address)
{
	uint64_t v;

	pthread_mutex_lock(&x->lock);
	v = *moved_at(x, address);
	pthread_mutex_unlock(&x->lock);
	return v;
}

/* The peer a job of queue 0 works for (NULL: none). */
static const char *job_peer(const struct xjob *j)
{
	return j->ops->peer ? j->ops->peer(j) : NULL;
}

/* The count of threads at work for peer (NULL: no peer, or the table is
 * full: not limited).  Under the fetch worker's lock. */
static unsigned *peer_busy(struct xfer *x, const char *peer)
{
	unsigned *free_slot = NULL;

	if (!peer)
		return NULL;
	for (unsigned i = 0; i < PEER_BUSY_MAX; i++) {
		if (!x->pbusy[i].busy) {
			if (!free_slot) {
				free_slot = &x->pbusy[i].busy;
				snprintf(x->pbusy[i].addr, sizeof(x->pbusy[i].addr), "%s", peer);
			}
			continue;
		}
		if (!strcmp(x->pbusy[i].addr, peer))
			return &x->pbusy[i].busy;
	}
	return free_slot;
}

_Static_assert(PIPE_MAX <= WORKER_TAKE_MAX, "a run of jobs fits what a worker takes");

static struct xjob *job_of(struct work *w)
{
	return (struct xjob *) ((char *) w - offsetof(struct xjob, w));
}

/* Of the jobs right behind j that may run with it (one connection, asked
 * ahead), this thread's share (the queue's other threads take the rest),
 * with j at most max in all, into run[1..); how many in all. */
static unsigned take_batch(struct node *n, struct xjob *j, struct work **run, unsigned max)
{
	unsigned streams = n->streams ? n->streams : 2, same = 0, share, k = 1;
	struct work *q;

	run[0] = &j->w;
	if (!j->ops->joins)
		return 1;
	for (q = j->w.next; q && job_of(q)->ops == j->ops && j->ops->joins(n, j, job_of(q)) &&
			    same < 4 * PIPE_MAX;
	     q = q->next)
		same++;
	share = (same + 1 + streams - 1) / streams;
	for (q = j->w.next; k < share && k < max && k < PIPE_MAX; q = q->next)
		run[k++] = q;
	return k;
}

/* A data thread's next jobs: the first one for a peer with fewer than
 * per_peer threads at work (serving is not limited), with the ones right
 * behind it that may share its connection when it is first in the queue;
 * *hold: its peer's count, taken.  Under the worker's lock. */
static unsigned xfer_take(void *data, struct work *head, struct work **run, unsigned max,
			  void **hold)
{
	struct xqueue *xq = data;
	struct xfer *x = xq->n->xfer;
	unsigned scanned = 0;

	for (struct work *w = head; w && scanned < PEER_SCAN_MAX; w = w->next, scanned++) {
		struct xjob *j = job_of(w);
		unsigned *b = xq->qi == 0 ? peer_busy(x, job_peer(j)) : NULL;

		if (b && *b >= x->per_peer)
			continue;
		if (b)
			(*b)++;
		*hold = b;
		if (scanned == 0)
			return take_batch(xq->n, j, run, max);
		run[0] = w;
		return 1;
	}
	return 0;
}

/* Its peer may take a thread again.  Under the worker's lock. */
static void xfer_ran(void *data, void *hold)
{
	(void) data;
	(*(unsigned *) hold)--;
}

static void xfer_run(void *data, struct work **run, unsigned k)
{
	struct xqueue *xq = data;
	struct xjob *jobs[WORKER_TAKE_MAX];

	for (unsigned i = 0; i < k; i++)
		jobs[i] = job_of(run[i]);
	jobs[0]->ops->run(xq->n, jobs, k); /* each handed back as it ends */
}

static void xfer_thread_start(void *data)
{
	struct xqueue *xq = data;

	blk_set_poll_window(POLL_WINDOW_X * (uint64_t) xq->n->cfg->poll_us);
}

static const struct worker_choice xfer_choice = {
	.thread_start = xfer_thread_start,
	.take = xfer_take,
	.run = xfer_run,
	.ran = xfer_ran,
};

static void xjob_done(struct work *w)
{
	struct xjob *j = job_of(w);

	j->ops->done(j->n, j);
}

static void xjob_drop(struct work *w)
{
	struct xjob *j = job_of(w);

	if (j->ops->drop)
		j->ops->drop(j); /* a push's view goes with the holder */
}

/* Transfers queued or at work: the loop's spin for a client is held to
 * --poll-us meanwhile (loop_set_spin_cap()). */
static bool xfer_busy(void *data)
{
	struct xfer *x = data;

	return worker_pending(x->q[0].wk) || worker_pending(x->q[1].wk);
}

/* Loop: never waits. */
void xfer_queue(struct node *n, struct xjob *j)
{
	struct xfer *x = n->xfer;

	j->n = n;
	j->w.run = NULL; /* the worker's choice runs it */
	j->w.done = xjob_done;
	j->w.next = NULL;
	if (x->holding && j->ops->queue == 0) {
		*x->held_tail = &j->w;
		x->held_tail = &j->w.next;
		x->n_held++;
		return;
	}
	worker_submit(x->q[j->ops->queue].wk, &j->w);
}

void xfer_hold(struct node *n)
{
	struct xfer *x = n->xfer;

	x->holding = true;
	x->held = NULL;
	x->held_tail = &x->held;
	x->n_held = 0;
}

void xfer_release(struct node *n)
{
	struct xfer *x = n->xfer;
	struct work *last = x->held;

	x->holding = false;
	for (size_t i = 1; i < x->n_held; i++)
		last = last->next;
	if (x->n_held)
		worker_submit_chain(x->q[0].wk, x->held, last, x->n_held);
	x->held = NULL;
}

/* An object's bytes moved in or out, and by which transport. */
void xfer_count_bytes(struct node *n, bool in, bool rdma, uint64_t len)
{
	if (in) {
		n->xfer->c.remote_bytes_in += len;
		*(rdma ? &n->xfer->c.rdma_bytes_in : &n->xfer->c.tcp_bytes_in) += len;
	} else {
		n->xfer->c.remote_bytes_out += len;
		*(rdma ? &n->xfer->c.rdma_bytes_out : &n->xfer->c.tcp_bytes_out) += len;
	}
}

void xfer_hand_back(struct node *n, struct xjob *j)
{
	worker_hand_back(n->xfer->q[j->ops->queue].wk, &j->w);
}

bool xfer_poll(void *u)
{
	struct node *n = u;
	struct xfer *x = n->xfer;
	bool a = worker_run_done(x->q[0].wk), b = worker_run_done(x->q[1].wk);

	return a || b;
}

int xfer_init(struct node *n)
{
	struct xfer *x = calloc(1, sizeof(*x));
	const struct test_hooks *t = &n->cfg->test;
	unsigned streams = n->streams ? n->streams : 2;
	int r;

	if (!x)
		return -ENOMEM;
	n->xfer = x;
	pthread_mutex_init(&x->lock, NULL);
	x->corrupt = t->corrupt_peer_send;
	if (x->corrupt)
		log_warn("KVCACHE_TEST_CORRUPT_PEER_SEND: every object served is sent damaged");
	x->cut = t->cut_peer_send;
	if (x->cut)
		log_warn("KVCACHE_TEST_CUT_PEER_SEND: a second answer on a connection is cut short");
	x->no_eager = t->no_eager_push;
	if (t->bogus_rdma) {
		x->bogus_rdma = t->bogus_rdma;
		log_warn("KVCACHE_TEST_BOGUS_RDMA: peers are told a damaged %s",
			 t->bogus_rdma == 'r' ? "rkey" : "address");
	}
	x->per_peer = streams;
	for (unsigned i = 0; i < 2; i++)
		x->q[i] = (struct xqueue) { .n = n, .qi = i };
	/* a thread per stream and queue, and one more fetching for the
	 * peers another one is not holding up */
	r = worker_new_shared(n->loop, "fetch", streams + 1, LOOP_HELPER_NORMAL, &xfer_choice, &x->q[0],
			      &x->q[0].wk);
	if (r == 0)
		r = worker_new_shared(n->loop, "serve", streams, LOOP_HELPER_NORMAL, &xfer_choice,
				      &x->q[1], &x->q[1].wk);
	if (r == 0)
		loop_set_spin_cap(n->loop, xfer_busy, x);
	return r;
}

void xfer_done(struct node *n)
{
	struct xfer *x = n->xfer;

	if (!x)
		return;
	loop_set_spin_cap(n->loop, NULL, NULL);
	/* the threads run what was queued; jobs whose end was not heard go */
	for (unsigned i = 0; i < 2; i++)
		worker_free_dropping(x->q[i].wk, xjob_drop);
	for (unsigned i = 0; i < x->n_idle; i++)
		close(x->idle[i].fd);
	pthread_mutex_destroy(&x->lock);
	free(x);
	n->xfer = NULL;
}
