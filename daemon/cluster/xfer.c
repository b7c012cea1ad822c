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
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blocking.h"
#include "handoff.h"
#include "log.h"
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

static int handshake(struct node *n, int fd, uint64_t deadline, const char *address, bool *rdma);

/* A new data connection to the holder at address, shaken hands with
 * when there is a secret or RDMA here: 0 with *ret_fd, or -errno. */
int xfer_open_conn(struct node *n, const char *address, uint64_t deadline, int *ret_fd,
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
int xfer_recv_frame(int fd, uint8_t type, uint8_t *buf, size_t cap, uint64_t deadline,
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

int xfer_send_msg(int fd, uint8_t type, const ProtobufCMessage *m, uint64_t deadline)
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
static int rdma_learn(struct node *n, int fd, uint64_t deadline, const char *address, bool *rdma)
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
		__atomic_fetch_add(&n->c.rdma_fallbacks, 1, __ATOMIC_RELAXED);
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
static int handshake(struct node *n, int fd, uint64_t deadline, const char *address, bool *rdma)
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
	hello.major = PEER_MAJOR;
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
static uint64_t *moved_at(struct xfer *x, const char *address)
{
	unsigned oldest = 0;

	for (unsigned i = 0; i < PEER_BUSY_MAX; i++) {
		if (!strcmp(x->moved[i].addr, address))
			return &x->moved[i].ms;
		if (x->moved[i].ms < x->moved[oldest].ms)
			oldest = i;
	}
	snprintf(x->moved[oldest].addr, sizeof(x->moved[oldest].addr), "%s", address);
	x->moved[oldest].ms = 0;
	return &x->moved[oldest].ms;
}

/* The holder at address answered: now. */
uint64_t xfer_note_moved(struct xfer *x, const char *address)
{
	uint64_t now = mono_ms();

	pthread_mutex_lock(&x->lock);
	*moved_at(x, address) = now;
	pthread_mutex_unlock(&x->lock);
	return now;
}

uint64_t xfer_moved(struct xfer *x, const char *address)
{
	uint64_t v;

	pthread_mutex_lock(&x->lock);
	v = *moved_at(x, address);
	pthread_mutex_unlock(&x->lock);
	return v;
}

/* Of the `same` jobs like jobs[0] at the head of queue qi, this thread's
 * share (the queue's other threads take the rest), at most PIPE_MAX in
 * all, into jobs behind jobs[0]; how many in all.  Under x->lock. */
static unsigned take_share(struct node *n, unsigned qi, struct xjob **jobs, unsigned same)
{
	struct xfer *x = n->xfer;
	unsigned streams = n->streams ? n->streams : 2, k = 1;
	unsigned share = (same + 1 + streams - 1) / streams;

	while (k < share && k < PIPE_MAX) {
		jobs[k++] = x->q[qi].head;
		x->q[qi].head = x->q[qi].head->next;
	}
	if (!x->q[qi].head)
		x->q[qi].tail = &x->q[qi].head;
	return k;
}

/* Data thread: j (taken from queue qi) and the jobs right behind it that
 * may run with it, its share of them (the queue's other threads take the
 * rest), into jobs; how many.  Under x->lock. */
static unsigned take_batch(struct node *n, unsigned qi, struct xjob *j, struct xjob **jobs)
{
	struct xfer *x = n->xfer;
	unsigned same = 0;

	jobs[0] = j;
	if (!j->ops->joins)
		return 1;
	for (struct xjob *q = x->q[qi].head;
	     q && q->ops == j->ops && j->ops->joins(n, j, q) && same < 4 * PIPE_MAX; q = q->next)
		same++;
	return same ? take_share(n, qi, jobs, same) : 1;
}

/* The peer a job of queue 0 works for (NULL: none). */
static const char *job_peer(const struct xjob *j)
{
	return j->ops->peer ? j->ops->peer(j) : NULL;
}

/* The count of threads at work for peer (NULL: no peer, or the table is
 * full: not limited).  Under x->lock. */
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

/* The first job of queue qi this thread may run: one for a peer with
 * fewer than per_peer threads at work (queue 1, serving, is not limited),
 * out of the queue, with *ret_busy its peer's count and *ret_head whether
 * it was first; NULL when there is none.  Under x->lock. */
static struct xjob *take_next(struct xfer *x, unsigned qi, unsigned **ret_busy, bool *ret_head)
{
	struct xjob **pp = &x->q[qi].head, *j;
	unsigned scanned = 0;

	*ret_busy = NULL;
	for (; *pp && scanned < PEER_SCAN_MAX; pp = &(*pp)->next, scanned++) {
		unsigned *b = qi == 0 ? peer_busy(x, job_peer(*pp)) : NULL;

		if (b && *b >= x->per_peer)
			continue;
		j = *pp;
		*pp = j->next;
		if (x->q[qi].tail == &j->next)
			x->q[qi].tail = pp;
		*ret_busy = b;
		*ret_head = scanned == 0;
		return j;
	}
	return NULL;
}

static void *data_main(void *arg)
{
	const struct thread_arg *ta = arg;
	struct node *n = ta->n;
	struct xfer *x = n->xfer;
	unsigned qi = ta->q;

	loop_helper_thread(qi ? "serve" : "fetch", false);
	blk_set_poll_window(POLL_WINDOW_X * (uint64_t) n->cfg->poll_us);
	for (;;) {
		uint32_t seq = handoff_bell_seq(&x->q[qi].wake);
		/* read before the queue: a job queued before the stop is run */
		bool stopping = __atomic_load_n(&x->stop, __ATOMIC_ACQUIRE);
		struct xjob *in, *j, *run[PIPE_MAX];
		unsigned k = 1, *busy = NULL;
		bool more, head = false, any;

		pthread_mutex_lock(&x->lock);
		in = handoff_take_fifo(&x->q[qi].incoming, next);
		if (in) {
			*x->q[qi].tail = in;
			while (in->next)
				in = in->next;
			x->q[qi].tail = &in->next;
		}
		j = take_next(x, qi, &busy, &head);
		if (j && head)
			k = take_batch(n, qi, j, run);
		else if (j)
			run[0] = j;
		if (busy)
			(*busy)++;
		more = x->q[qi].head != NULL;
		any = more;
		pthread_mutex_unlock(&x->lock);
		if (!j) {
			/* nothing, or only jobs for peers at their limit: a
			 * thread that ends its job rings */
			if (stopping && !any)
				break;
			handoff_bell_wait(&x->q[qi].wake, seq, 0);
			continue;
		}
		if (more) /* the next job for another thread of this queue */
			handoff_bell_ring(&x->q[qi].wake);
		j->ops->run(n, run, k); /* each handed back as it ends */
		if (busy) {
			/* its peer may take a thread again: the jobs left wait
			 * for one */
			pthread_mutex_lock(&x->lock);
			(*busy)--;
			more = x->q[qi].head != NULL;
			pthread_mutex_unlock(&x->lock);
			if (more)
				handoff_bell_ring(&x->q[qi].wake);
		}
	}
	return NULL;
}

/* Loop: never waits. */
void xfer_queue(struct node *n, struct xjob *j)
{
	struct xfer *x = n->xfer;
	unsigned qi = j->ops->queue;

	if (handoff_push(&x->q[qi].incoming, j, next))
		handoff_bell_ring(&x->q[qi].wake);
}

/* An object's bytes moved in or out, and by which transport. */
void xfer_count_bytes(struct node *n, bool in, bool rdma, uint64_t len)
{
	if (in) {
		n->c.remote_bytes_in += len;
		*(rdma ? &n->c.rdma_bytes_in : &n->c.tcp_bytes_in) += len;
	} else {
		n->c.remote_bytes_out += len;
		*(rdma ? &n->c.rdma_bytes_out : &n->c.tcp_bytes_out) += len;
	}
}

void xfer_hand_back(struct node *n, struct xjob *j)
{
	handoff_push_wake(&n->xfer->done, j, next, n->xfer->bell);
}

bool xfer_poll(void *u)
{
	struct node *n = u;
	struct xfer *x = n->xfer;
	struct xjob *list = handoff_collect(&x->done, x->bell);

	if (!list)
		return false;
	while (list) {
		struct xjob *j = list;

		list = j->next;
		j->ops->done(n, j);
	}
	return true;
}

int xfer_init(struct node *n)
{
	struct xfer *x = calloc(1, sizeof(*x));
	const struct test_hooks *t = &n->cfg->test;
	int r;

	if (!x)
		return -ENOMEM;
	n->xfer = x;
	pthread_mutex_init(&x->lock, NULL);
	for (unsigned i = 0; i < 2; i++)
		x->q[i].tail = &x->q[i].head;
	x->corrupt = t->corrupt_peer_send;
	if (x->corrupt)
		log_warn("KVCACHE_TEST_CORRUPT_PEER_SEND: every object served is sent damaged");
	x->no_eager = t->no_eager_push;
	if (t->bogus_rdma) {
		x->bogus_rdma = t->bogus_rdma;
		log_warn("KVCACHE_TEST_BOGUS_RDMA: peers are told a damaged %s",
			 t->bogus_rdma == 'r' ? "rkey" : "address");
	}
	x->bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (x->bell < 0)
		return -errno;
	r = loop_add_doorbell(n->loop, x->bell, &x->bell_src);
	if (r < 0)
		return r;
	r = loop_add_poller(n->loop, xfer_poll, NULL, n, &n->xfer_poller);
	if (r < 0)
		return r;
	x->per_peer = n->streams ? n->streams : 2;
	/* a thread per stream and queue, and one more fetching for the
	 * peers another one is not holding up */
	for (unsigned streams = n->streams ? n->streams : 2; x->n_th < 2 * streams + 1; x->n_th++) {
		x->args[x->n_th] = (struct thread_arg) { n, x->n_th < 2 * streams ? x->n_th % 2 : 0 };
		r = -pthread_create(&x->th[x->n_th], NULL, data_main, &x->args[x->n_th]);
		if (r < 0)
			return r;
	}
	return 0;
}

void xfer_done(struct node *n)
{
	struct xfer *x = n->xfer;

	if (!x)
		return;
	__atomic_store_n(&x->stop, true, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < x->n_th; i++) /* one sleeper each */
		handoff_bell_ring(&x->q[i % 2].wake);
	for (unsigned i = 0; i < x->n_th; i++)
		pthread_join(x->th[i], NULL);
	for (unsigned i = 0; i < x->n_idle; i++)
		close(x->idle[i].fd);
	/* jobs never started or never collected: their owners go */
	for (unsigned i = 0; i < 2; i++) {
		struct xjob *in = handoff_take(&x->q[i].incoming);

		if (in) { /* the threads run everything queued; for form's sake */
			*x->q[i].tail = in;
			while (in->next)
				in = in->next;
			x->q[i].tail = &in->next;
		}
		while (x->q[i].head) {
			struct xjob *j = x->q[i].head;

			x->q[i].head = j->next;
			if (j->ops->drop)
				j->ops->drop(j); /* a push's view goes with the holder */
		}
	}
	while (x->done) {
		struct xjob *j = x->done;

		x->done = j->next;
		if (j->ops->drop)
			j->ops->drop(j);
	}
	loop_source_free(n->xfer_poller);
	n->xfer_poller = NULL;
	loop_source_free(x->bell_src);
	if (x->bell >= 0)
		close(x->bell);
	pthread_mutex_destroy(&x->lock);
	free(x);
	n->xfer = NULL;
}
