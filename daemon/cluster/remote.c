/* SPDX-License-Identifier: MIT */
/*
 * Fetching a key this node does not hold from a node that does (the
 * remote backend's locate), and the data threads every transfer between
 * nodes runs on (xfer.h; serving others is serve.c, pushing push.c).
 *
 * The loop does the bookkeeping only: the directory lookup (a frame to the
 * master), the dram block the bytes will land in, the view that keeps a
 * served object in place.  The bytes move on data threads with blocking
 * (poll-bounded) socket calls, straight into or out of the shared-memory
 * block, and each transfer's end is handed back to the loop.  A fetch
 * verifies the sender's XXH3 checksum before anyone sees the object
 * (-EBADMSG otherwise), and every step is bounded by --remote-timeout-ms.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "blocking.h"
#include "dircache.h"
#include "checksum.h"
#include "handoff.h"
#include "node-private.h"
#include "serve.h"
#include "tier.h"
#include "xfer.h"

#define LOG_TOPIC "remote"

#define MAX_RFETCHES 256   /* fetches in flight; more wait for a place, */
#define MAX_BACKLOG 8192   /* this many; more are misses */
#define MAX_HOLDERS_TRIED 4
#define PEER_SCAN_MAX 512    /* jobs a fetch thread looks past for another peer's */

/* (defined with the completions, below) */
static const struct xjob_ops fetch_ops;

struct rfetch {
	struct rfetch *next, *prev; /* in n->rfetches, or next in n->backlog */
	struct node *n;
	struct object *o;        /* placeholder: not in the index; o->fetch set */
	uint32_t seq;
	bool transferring;
	uint64_t deadline;
	char addr[MAX_HOLDERS_TRIED][PEER_MAX_ID + 1];
	unsigned n_addr;
	unsigned tried;          /* the holder the data thread asked last */
	struct peer_stat *probe; /* a sick holder this fetch may ask (the one probe) */
	uint8_t *dst;
	bool via_rdma;           /* the bytes came by RDMA */
	bool expired;            /* out of time before it was asked for */
	uint64_t ver;            /* the version of the bytes, as the holder said */
	bool summed;             /* sum: the checksum they were checked against */
	uint64_t sum;
	struct xjob job;
};

/* ---- bounded blocking I/O: net/blocking.h ---- */

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

static int fetch_on(struct rfetch *rf, int fd, bool rdma, const char *address,
		    uint64_t deadline);
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

/* One fetch from one holder, on a data thread: on a kept connection if
 * there is one (once more on a new one if it went stale), else a new one. */
static int fetch_from(struct rfetch *rf, const char *address, uint64_t deadline)
{
	struct xfer *x = rf->n->xfer;
	bool rd = false;
	int fd = xfer_idle_take(x, address, &rd), r;

	if (fd >= 0) {
		r = fetch_on(rf, fd, rd, address, deadline);
		if (r == 0 || r == -ENOENT) {
			xfer_idle_put(x, address, fd, rd);
			return r;
		}
		close(fd);
		if (r != -ECONNRESET && r != -EPIPE)
			return r;
	}
	r = xfer_open_conn(rf->n, address, deadline, &fd, &rd);
	if (r < 0)
		return r;
	r = fetch_on(rf, fd, rd, address, deadline);
	if (r == 0 || r == -ENOENT)
		xfer_idle_put(x, address, fd, rd);
	else
		close(fd);
	return r;
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
		log_warn("%s: its RDMA description was refused (%s); tcp with it", address,
			 strerror(-r));
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

/* The object the holder said is at resp's place: read it by RDMA into
 * rf->dst, check it, and tell the holder it may let it go. */
static int fetch_rdma(struct rfetch *rf, int fd, const Kvc__Peer__FetchResp *resp,
		      const char *address, uint64_t deadline)
{
	struct node *n = rf->n;
	struct object *o = rf->o;
	Kvc__Peer__FetchDone done = KVC__PEER__FETCH_DONE__INIT;
	uint64_t loff = (uint64_t) (rf->dst - (uint8_t *) n->st->tiers[0].seg.base);
	struct blk_pace pace = blk_pace(n->timeout_ms, deadline, o->len);
	int r = xfer_rdma(n, true, address, resp->region, resp->offset, 0, loff, o->len, &pace);

	if (r == 0)
		r = blk_sum(rf->dst, o->len, &rf->sum);
	if (r == 0 && rf->sum != resp->checksum)
		r = -EBADMSG;
	done.error = r;
	/* a read that succeeded stands even if this does not go out: the
	 * holder lets the view go when the connection drops */
	xfer_send_msg(fd, PEER_FETCH_DONE, &done.base, mono_ms() + n->timeout_ms);
	if (r == -ECONNRESET || r == -ETIMEDOUT || r == -EINVAL) {
		/* the endpoint is gone or the place was wrong: the next
		 * connection shakes hands afresh; this one is not kept */
		rdma_peer_drop(n->rdma, address);
		return r == -EINVAL ? -EPROTO : r;
	}
	if (r == 0)
		rf->via_rdma = true;
	return r;
}

/* The Fetch that asks for rf (its key points into rf's object). */
static Kvc__Peer__Fetch fetch_msg(const struct rfetch *rf, bool rdma)
{
	Kvc__Peer__Fetch q = KVC__PEER__FETCH__INIT;

	q.key.data = (uint8_t *) rf->o->key;
	q.key.len = rf->o->key_len;
	q.len = rf->o->len;
	q.rdma = rdma;
	return q;
}

/* The holder's answer to the Fetch of rf with seq, and the bytes: 0,
 * -ENOENT or -EIO (cleanly, the connection is still usable), or another
 * error (it is not). */
static int fetch_answer(struct rfetch *rf, int fd, uint32_t seq, bool rdma, const char *address,
			uint64_t deadline)
{
	struct object *o = rf->o;
	Kvc__Peer__FetchResp *resp;
	ProtobufCMessage *m;
	struct peer_hdr h;
	uint8_t hdr[PEER_HDR_SIZE], small[256];
	int r = blk_recv(fd, hdr, sizeof(hdr), deadline);

	if (r < 0)
		return r;
	r = peer_hdr_decode(hdr, sizeof(small), &h);
	if (r == 0 && (h.type != PEER_FETCH_RESP || h.seq != seq))
		r = -EPROTO;
	if (r == 0)
		r = blk_recv(fd, small, h.len, deadline);
	if (r == 0)
		r = peer_msg_decode(h.type, small, h.len, &m);
	if (r < 0)
		return r;
	resp = (Kvc__Peer__FetchResp *) m;
	rf->ver = resp->version;
	if (resp->error)
		r = resp->error == -ENOENT ? -ENOENT : -EIO;
	else if (resp->rdma && !rdma)
		r = -EPROTO; /* a place nobody asked for */
	else if (resp->len != o->len) {
		r = -ESTALE; /* replaced since the directory heard of it */
		if (resp->rdma) {
			Kvc__Peer__FetchDone done = KVC__PEER__FETCH_DONE__INIT;

			done.error = -ESTALE;
			if (xfer_send_msg(fd, PEER_FETCH_DONE, &done.base, deadline) < 0)
				r = -ECONNRESET;
		}
	} else if (resp->rdma)
		r = fetch_rdma(rf, fd, resp, address, deadline);
	else {
		struct blk_pace pace = blk_pace(rf->n->timeout_ms, deadline, o->len);

		r = blk_recv_checked(fd, rf->dst, o->len, &pace, &rf->sum);
	}
	if (r == 0)
		rf->summed = true;
	protobuf_c_message_free_unpacked(m, NULL);
	return r;
}

/* The exchange on a connected fd: 0, -ENOENT (cleanly, the connection is
 * still usable), or another error (it is not). */
static int fetch_on(struct rfetch *rf, int fd, bool rdma, const char *address,
		    uint64_t deadline)
{
	Kvc__Peer__Fetch q = fetch_msg(rf, rdma);
	int r = xfer_send_msg(fd, PEER_FETCH, &q.base, deadline);

	if (r == 0)
		r = fetch_answer(rf, fd, 1, rdma, address, deadline);
	return r;
}

static void fetch_result(struct xjob *j)
{
	if (j->res == -ECONNREFUSED || j->res == -EPIPE)
		j->res = -ECONNRESET;
	if (j->res == -ESTALE)
		j->res = -ENOENT;
}

/* rf from its holders in turn, from the one at first on, by deadline. */
static void run_fetch(struct rfetch *rf, struct xjob *j, uint64_t deadline, unsigned first)
{
	j->res = -ENOENT;
	for (unsigned i = first; i < rf->n_addr; i++) {
		rf->tried = i;
		j->res = fetch_from(rf, rf->addr[i], deadline);
		/* wrong bytes, or out of time: no second try */
		if (j->res == 0 || j->res == -EBADMSG || j->res == -ETIMEDOUT)
			break;
	}
	fetch_result(j);
}

/*
 * Fetches from the same holder, asked for at once on one connection: the
 * holder answers each right after the one before, so the link does not
 * stand idle for a round trip and the holder's hand-offs per object (a
 * plain request/response of 1 MiB values moved 22% more with four asked
 * ahead, 64 KiB values 2.2 times as much, on this machine).  Each job is
 * handed back the moment its bytes are checked.  A clean miss (or an
 * error answer: no bytes follow) goes on to the key's other holders; when
 * the connection breaks, the fetches not yet answered start over on their
 * own, except after a timeout: the holder is not answering, and they end
 * -ETIMEDOUT.
 */
#define PIPE_MAX 16

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
static uint64_t note_moved(struct xfer *x, const char *address)
{
	uint64_t now = mono_ms();

	pthread_mutex_lock(&x->lock);
	*moved_at(x, address) = now;
	pthread_mutex_unlock(&x->lock);
	return now;
}

/*
 * A fetch on its data thread is out of time at its request's deadline
 * (--remote-timeout-ms from when it was asked for, however long it
 * waited for a thread), unless its holder answered since: a fetch queued
 * behind others to a holder that keeps sending has --remote-timeout-ms
 * from the last answer.  So a batch of any size from a silent holder ends
 * at its deadline, not one wave of the data threads after another, and a
 * large batch from a holder that is sending is not cut.
 */
static uint64_t fetch_deadline(const struct rfetch *rf, uint64_t moved)
{
	uint64_t d = moved + rf->n->timeout_ms;

	return moved && d > rf->deadline ? d : rf->deadline;
}

/* A fetch out of time before it was asked for: it ends without a word to
 * its holder (which is not thereby sick: it may be the one ahead that is). */
static void fetch_expire(struct xfer *x, struct xjob *j)
{
	((struct rfetch *) j->owner)->expired = true;
	j->res = -ETIMEDOUT;
	handoff_push_wake(&x->done, j, next, x->bell);
}

/* moved: when the holder last answered (0: not lately). */
static void run_fetches(struct node *n, struct xjob **jobs, unsigned k, uint64_t moved)
{
	struct xfer *x = n->xfer;
	char address[PEER_MAX_ID + 1]; /* a copy: each job goes back, and is freed, as it ends */
	struct xjob *again[PIPE_MAX];
	unsigned n_again = 0, done = 0;
	uint8_t *frames = NULL;
	size_t len = 0;
	bool rd = false, kept;
	int fd, r = 0;

	uint64_t timeout_ms = n->timeout_ms, now = mono_ms();
	unsigned live = 0;

	memcpy(address, ((struct rfetch *) jobs[0]->owner)->addr[0], sizeof(address));
	for (unsigned i = 0; i < k; i++)
		if (fetch_deadline(jobs[i]->owner, moved) <= now)
			fetch_expire(x, jobs[i]);
		else
			jobs[live++] = jobs[i];
	k = live;
	if (!k)
		return;
	fd = xfer_idle_take(x, address, &rd);
	for (unsigned i = 0; i < k && r == 0; i++) {
		Kvc__Peer__Fetch q = fetch_msg(jobs[i]->owner, false);
		uint8_t *f, *grown;
		size_t fl;

		r = peer_frame_pack(PEER_FETCH, i + 1, &q.base, &f, &fl);
		if (r < 0)
			break;
		grown = realloc(frames, len + fl);
		if (!grown) {
			free(f);
			r = -ENOMEM;
			break;
		}
		frames = grown;
		memcpy(frames + len, f, fl);
		len += fl;
		free(f);
	}
	/* (never an RDMA connection: a node with RDMA fetches one by one) */
	kept = fd >= 0;
	for (int attempt = 0; r == 0 && attempt < 2; attempt++) {
		if (fd < 0)
			r = xfer_open_conn(n, address, fetch_deadline(jobs[0]->owner, moved), &fd, &rd);
		if (r == 0)
			r = blk_send(fd, frames, len, fetch_deadline(jobs[0]->owner, moved));
		if (r == 0 || !kept || (r != -ECONNRESET && r != -EPIPE))
			break;
		close(fd); /* a kept connection that went stale: once more */
		fd = -1;
		kept = false;
	}
	free(frames);
	if (r == 0) {
		__atomic_fetch_add(&n->c.fetch_ahead, k - 1, __ATOMIC_RELAXED);
		for (; done < k; done++) {
			struct xjob *j = jobs[done];
			struct rfetch *rf = j->owner;

			rf->tried = 0;
			r = fetch_answer(rf, fd, done + 1, false, address,
					 fetch_deadline(rf, moved));
			j->res = r;
			if (r == 0 || r == -ENOENT || r == -EIO)
				moved = note_moved(x, address);
			if (r == -ENOENT || r == -EIO) {
				again[n_again++] = j; /* its other holders, if any */
				r = 0;
				continue;
			}
			if (r < 0)
				break;
			fetch_result(j);
			handoff_push_wake(&x->done, j, next, x->bell);
		}
	}
	if (fd >= 0 && r == 0)
		xfer_idle_put(x, address, fd, rd);
	else if (fd >= 0)
		close(fd);
	if (done < k && (r == -ETIMEDOUT || r == -EBADMSG)) {
		/* no second try for this one; the holder is not answering
		 * the ones behind it in time either after a timeout */
		jobs[done]->res = r;
		handoff_push_wake(&x->done, jobs[done], next, x->bell);
		done++;
		for (; r == -ETIMEDOUT && done < k; done++) {
			jobs[done]->res = -ETIMEDOUT;
			handoff_push_wake(&x->done, jobs[done], next, x->bell);
		}
	}
	for (unsigned i = 0; i < n_again; i++) {
		struct rfetch *rf = again[i]->owner;

		if (rf->n_addr > 1)
			run_fetch(rf, again[i], mono_ms() + timeout_ms, 1);
		else
			fetch_result(again[i]); /* -ENOENT or -EIO, as the holder said */
		handoff_push_wake(&x->done, again[i], next, x->bell);
	}
	for (; done < k; done++) { /* the connection broke: each on its own */
		run_fetch(jobs[done]->owner, jobs[done], mono_ms() + timeout_ms, 0);
		handoff_push_wake(&x->done, jobs[done], next, x->bell);
	}
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

/* ---- fetching ---- */

static void rf_unlink(struct node *n, struct rfetch *rf)
{
	if (rf->prev)
		rf->prev->next = rf->next;
	else
		n->rfetches = rf->next;
	if (rf->next)
		rf->next->prev = rf->prev;
	n->n_rfetches--;
	index_unlink(&n->pending, rf->o);
}

/* A holder that let a fetch time out is passed over this long (the
 * deadline again, at least 1 s): the key's other holders are asked, and
 * when it has none the fetch misses at once instead of holding a data
 * thread for another deadline.  The first fetch after it is a probe. */
#define SICK_MS(n) ((n)->timeout_ms > 1000 ? (n)->timeout_ms : 1000)

/* The fetch ends, or never began: its probe's place is free. */
static void rf_unprobe(struct rfetch *rf)
{
	if (rf->probe)
		rf->probe->probing = false;
	rf->probe = NULL;
}

static void backlog_pump(struct node *n);

/* The fetch is over: on success the object joins the index (a replica the
 * directory learns of) before its waiters run again. */
static void rf_finish(struct node *n, struct rfetch *rf, int res)
{
	struct store *st = n->st;
	struct object *o = rf->o;

	rf_unlink(n, rf);
	rf_unprobe(rf);
	if (rf->n_addr && rf->transferring && !rf->expired) {
		struct peer_stat *ps = node_peer_stat(n, rf->addr[rf->tried]);

		if (ps && res == 0) {
			ps->fetches++;
			ps->fetch_bytes += o->len;
			ps->sick_until = 0;
		} else if (ps && res < 0 && res != -ENOENT) {
			ps->fetch_errors++;
			if (res == -ETIMEDOUT) /* silent for a whole deadline */
				ps->sick_until = loop_now_ms(n->loop) + SICK_MS(n);
		}
	}
	if (res == 0 && index_find(&st->index, o->key, o->key_len, o->hash))
		res = 1; /* stored here meanwhile: waiters find that one */
	if (res == 0) {
		if (rf->summed)
			object_keep_sum(o, rf->sum);
		o->ver = rf->ver;
		store_version_seen(st, rf->ver);
		object_publish(st, o);
		n->c.remote_hits++;
		xfer_count_bytes(n, true, rf->via_rdma, o->len);
		fetch_done(st, o, 0);
	} else {
		if (res < 0) {
			if (res == -ENOENT)
				n->c.remote_misses++;
			else
				n->c.remote_errors++;
			if (res == -EBADMSG) {
				n->c.remote_corrupt++;
				log_warn("%s from %s: checksum mismatch; not served", o->key,
					 rf->addr[0]);
			}
		}
		fetch_done(st, o, res > 0 ? 0 : res);
		object_free(st, o);
	}
	free(rf);
	backlog_pump(n);
}

/* Drop rf's holders known sick, but one of them nobody is probing, which
 * it asks last (its probe); false when none is left. */
static bool rf_healthy(struct node *n, struct rfetch *rf)
{
	uint64_t now = loop_now_ms(n->loop);
	unsigned k = 0, probe = MAX_HOLDERS_TRIED;

	for (unsigned i = 0; i < rf->n_addr; i++) {
		struct peer_stat *ps = node_peer_stat(n, rf->addr[i]);

		if (ps && ps->sick_until > now) {
			if (probe == MAX_HOLDERS_TRIED && (rf->probe == ps || !ps->probing)) {
				ps->probing = true;
				rf->probe = ps;
				probe = i;
			} else
				n->c.sick_skips++;
			continue;
		}
		if (k != i)
			memcpy(rf->addr[k], rf->addr[i], sizeof(rf->addr[0]));
		k++;
	}
	if (probe != MAX_HOLDERS_TRIED) {
		if (k != probe)
			memcpy(rf->addr[k], rf->addr[probe], sizeof(rf->addr[0]));
		k++;
	}
	rf->n_addr = k;
	return k > 0;
}

/* Begin a fetch whose placeholder is made: a place among the fetches in
 * flight, then the transfer at once if an exists or prefix lookup just
 * asked the directory, else a Lookup.  <0: not begun. */
static int rf_begin(struct node *n, struct rfetch *rf)
{
	struct object *o = rf->o;

	if (dc_addresses(n, o->key, o->key_len, o->hash, rf->addr, MAX_HOLDERS_TRIED, &rf->n_addr,
			 &o->len) && rf_healthy(n, rf) &&
	    o->len <= (UINT64_C(1) << 30) &&
	    o->len <= n->st->tiers[0].alloc.size &&
	    tier_alloc(n->st, &n->st->tiers[0], o->len, &o->block) == 0) {
		o->tier = &n->st->tiers[0];
		rf->dst = (uint8_t *) o->tier->seg.base + o->block->offset;
		rf->transferring = true;
	} else {
		rf->n_addr = 0;
		o->len = 0;
		if (node_lookup(node_owner(n, o->key, o->key_len), o->key, o->key_len, &rf->seq) < 0)
			return -ENOENT;
	}
	rf->prev = NULL;
	rf->next = n->rfetches;
	if (rf->next)
		rf->next->prev = rf;
	n->rfetches = rf;
	n->n_rfetches++;
	loop_timer_arm_by(n->timer, rf->deadline);
	if (rf->transferring) {
		rf->job = (struct xjob) { .ops = &fetch_ops, .owner = rf };
		xfer_queue(n, &rf->job);
	}
	return 0;
}

/* A fetch that never began ends (its placeholder is out of the backlog). */
static void backlog_drop(struct node *n, struct rfetch *rf, int res)
{
	rf_unprobe(rf);
	index_unlink(&n->pending, rf->o);
	if (res == -ENOENT)
		n->c.remote_misses++;
	else
		n->c.remote_errors++;
	fetch_done(n->st, rf->o, res);
	object_free(n->st, rf->o);
	free(rf);
}

static struct rfetch *backlog_pop(struct node *n)
{
	struct rfetch *rf = n->backlog;

	n->backlog = rf->next;
	if (!n->backlog)
		n->backlog_tail = NULL;
	n->n_backlog--;
	rf->next = NULL;
	return rf;
}

/* Places among the fetches in flight went free: the oldest waiting begin. */
static void backlog_pump(struct node *n)
{
	while (n->backlog && n->n_rfetches < MAX_RFETCHES) {
		struct rfetch *rf = backlog_pop(n);

		if (rf_begin(n, rf) < 0)
			backlog_drop(n, rf, -ENOENT);
	}
}

int remote_locate(void *be, const void *key, size_t len, struct fetch **ret)
{
	struct node *n = be;
	uint64_t h = index_hash(key, len);
	struct object *o = index_find(&n->pending, key, len, h);
	struct rfetch *rf;
	struct fetch *f;

	if (o) { /* single flight */
		*ret = o->fetch;
		return 0;
	}
	if ((n->n_rfetches >= MAX_RFETCHES || n->backlog) && n->n_backlog >= MAX_BACKLOG)
		return -ENOENT;
	o = object_new(key, len);
	f = calloc(1, sizeof(*f));
	rf = calloc(1, sizeof(*rf));
	if (!o || !f || !rf)
		goto fail;
	f->o = o;
	f->far = true;
	rf->n = n;
	rf->o = o;
	/* from the request: lookup, a place, a thread and the answer all count */
	rf->deadline = loop_now_ms(n->loop) + n->timeout_ms;
	if (n->n_rfetches >= MAX_RFETCHES || n->backlog) {
		/* in the order asked, each bounded like a lookup */
		if (n->backlog_tail)
			n->backlog_tail->next = rf;
		else
			n->backlog = rf;
		n->backlog_tail = rf;
		n->n_backlog++;
		n->c.fetch_waited++;
		loop_timer_arm_by(n->timer, rf->deadline);
	} else if (rf_begin(n, rf) < 0) {
		goto fail;
	}
	o->fetch = f;
	index_insert(&n->pending, o);
	*ret = f;
	return 0;
fail:
	if (rf)
		rf_unprobe(rf);
	free(o);
	free(f);
	free(rf);
	return -ENOENT;
}


void remote_located(struct node *n, uint32_t seq, const Kvc__Peer__LookupResp *resp)
{
	struct store *st = n->st;
	struct rfetch *rf;
	struct object *o;
	struct tier *t = &st->tiers[0];
	const Kvc__Peer__Location *loc = resp->n_locations ? resp->locations[0] : NULL;
	int r;

	if (query_answered(n, seq, resp))
		return;
	for (rf = n->rfetches; rf; rf = rf->next)
		if (!rf->transferring && rf->seq == seq)
			break;
	if (!rf)
		return; /* timed out already */
	o = rf->o;
	if (loc && (loc->key.len != o->key_len || memcmp(loc->key.data, o->key, o->key_len)))
		loc = NULL;
	for (size_t i = 0; loc && i < loc->n_holders && rf->n_addr < MAX_HOLDERS_TRIED; i++)
		if (strcmp(loc->holders[i], n->id) != 0)
			snprintf(rf->addr[rf->n_addr++], sizeof(rf->addr[0]), "%s",
				 loc->addresses[i]);
	if (!rf->n_addr) {
		rf_finish(n, rf, -ENOENT);
		return;
	}
	if (!rf_healthy(n, rf)) {
		rf_finish(n, rf, -EHOSTDOWN); /* its holders are not answering */
		return;
	}
	if (loc->len > t->alloc.size || loc->len > (UINT64_C(1) << 30)) {
		rf_finish(n, rf, -E2BIG);
		return;
	}
	o->len = loc->len;
	o->tier = t;
	r = tier_alloc(st, t, o->len, &o->block);
	if (r < 0) {
		rf_finish(n, rf, r == -EAGAIN ? -ENOSPC : r);
		return;
	}
	rf->dst = (uint8_t *) t->seg.base + o->block->offset;
	rf->transferring = true;
	rf->job = (struct xjob) { .ops = &fetch_ops, .owner = rf };
	xfer_queue(n, &rf->job);
}

void remote_expire(struct node *n, uint64_t now)
{
	queries_expire(n, now);
	serve_expire(n, now);
	if (n->pend_poll.waiters && now >= n->pend_poll_at) {
		/* those waiting now ask again (one that waits again is
		 * newer than they, and waits for the next turn) */
		unsigned k = 0;

		for (struct waiter *w = n->pend_poll.waiters; w; w = w->next)
			k++;
		while (k-- && fetch_wake_oldest(&n->pend_poll, FETCH_AGAIN))
			;
		if (n->pend_poll.waiters) {
			n->pend_poll_at = now + DC_PENDING_MS;
			loop_timer_arm_by(n->timer, n->pend_poll_at);
		}
	}
	/* only lookups: a transfer ends by its own deadline on its thread */
	for (struct rfetch *rf = n->rfetches, *next; rf; rf = next) {
		next = rf->next;
		if (!rf->transferring && now >= rf->deadline)
			rf_finish(n, rf, -ENOENT);
	}
	/* waited a whole --remote-timeout-ms without a place: the oldest first */
	while (n->backlog && now >= n->backlog->deadline)
		backlog_drop(n, backlog_pop(n), -ETIMEDOUT);
}


/* Fuzzing: fetch keys[i] (lens[i] bytes each) from the node at address, as
 * if the directory had just named it, all asked for at once; then run the
 * completions, calling tick(u) between polls, until every fetch has ended.
 * got[i]: the key was fetched (it is in the index now). */
void remote_fetch_all(struct node *n, const char *const *keys, const uint64_t *lens, size_t k,
		      const char *address, void (*tick)(void *u), void *u, bool *got)
{
	/* the data threads find them queued together (a loop never takes
	 * this lock; a fuzzer wants the same run every time) */
	pthread_mutex_lock(&n->xfer->lock);
	for (size_t i = 0; i < k; i++) {
		struct fetch *f;

		dc_put(n, keys[i], strlen(keys[i]), true, "peer", address, lens[i]);
		remote_locate(n, keys[i], strlen(keys[i]), &f);
	}
	pthread_mutex_unlock(&n->xfer->lock);
	while (n->n_rfetches || n->n_backlog) {
		tick(u);
		if (!xfer_poll(n))
			usleep(50);
	}
	for (size_t i = 0; i < k; i++)
		got[i] = index_find(&n->st->index, keys[i], strlen(keys[i]),
				    index_hash(keys[i], strlen(keys[i]))) != NULL;
}

/* ---- the jobs: run on a data thread, ended on the loop ---- */

void xfer_hand_back(struct node *n, struct xjob *j)
{
	handoff_push_wake(&n->xfer->done, j, next, n->xfer->bell);
}

static const char *fetch_peer(const struct xjob *j)
{
	return ((const struct rfetch *) j->owner)->addr[0];
}

/* fetches from the same holder, asked for ahead on one connection (with
 * RDMA, one-sided reads go one by one) */
static bool fetch_joins(const struct node *n, const struct xjob *first, const struct xjob *next)
{
	return !n->rdma && !strcmp(fetch_peer(first), fetch_peer(next));
}

static void fetch_run(struct node *n, struct xjob **jobs, unsigned k)
{
	struct xfer *x = n->xfer;
	struct rfetch *rf = jobs[0]->owner;
	uint64_t moved;

	pthread_mutex_lock(&x->lock);
	moved = *moved_at(x, rf->addr[0]);
	pthread_mutex_unlock(&x->lock);
	if (k > 1) {
		run_fetches(n, jobs, k, moved);
		return;
	}
	if (fetch_deadline(rf, moved) <= mono_ms()) {
		fetch_expire(x, jobs[0]);
		return;
	}
	run_fetch(rf, jobs[0], fetch_deadline(rf, moved), 0);
	if (jobs[0]->res == 0 || jobs[0]->res == -ENOENT)
		note_moved(x, rf->addr[rf->tried]);
	xfer_hand_back(n, jobs[0]);
}

static void fetch_ended(struct node *n, struct xjob *j)
{
	rf_finish(n, j->owner, j->res);
}

static const struct xjob_ops fetch_ops = {
	.queue = 0, .peer = fetch_peer, .joins = fetch_joins, .run = fetch_run,
	.done = fetch_ended,
};

/* ---- completions ---- */

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


static const struct holder_ops push_holder_ops = { 0 };

int remote_setup(struct node *n)
{
	struct xfer *x = calloc(1, sizeof(*x));
	const char *corrupt = getenv("KVCACHE_TEST_CORRUPT_PEER_SEND");
	const char *bogus = getenv("KVCACHE_TEST_BOGUS_RDMA");
	int r;

	if (!x)
		return -ENOMEM;
	n->pend_poll.far = true;
	n->xfer = x;
	pthread_mutex_init(&x->lock, NULL);
	for (unsigned i = 0; i < 2; i++)
		x->q[i].tail = &x->q[i].head;
	x->corrupt = corrupt && *corrupt == '1';
	if (x->corrupt)
		log_warn("KVCACHE_TEST_CORRUPT_PEER_SEND: every object served is sent damaged");
	x->no_eager = getenv("KVCACHE_TEST_NO_EAGER_PUSH") &&
		      !strcmp(getenv("KVCACHE_TEST_NO_EAGER_PUSH"), "1");
	if (bogus && (!strcmp(bogus, "rkey") || !strcmp(bogus, "address"))) {
		x->bogus_rdma = bogus[0];
		log_warn("KVCACHE_TEST_BOGUS_RDMA: peers are told a damaged %s", bogus);
	}
	x->bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (x->bell < 0)
		return -errno;
	if (dircache_init(n) < 0)
		return -ENOMEM;
	holder_init(&n->h, n->st, &push_holder_ops);
	r = index_init(&n->pending);
	if (r < 0)
		return r;
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

void remote_teardown(struct node *n)
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
	/* jobs never started or never collected: their owners go below */
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
	{
		uint64_t res, views;

		holder_done(&n->h, &res, &views);
	}
	serve_close_all(n);
	while (n->rfetches || n->backlog) {
		struct rfetch *rf = n->rfetches;

		if (rf) {
			rf_unlink(n, rf);
		} else {
			rf = backlog_pop(n);
			index_unlink(&n->pending, rf->o);
		}
		free(rf->o->fetch); /* no waiter is left: sessions went first */
		rf->o->fetch = NULL;
		object_free(n->st, rf->o);
		free(rf);
	}
	if (n->pending.buckets)
		index_done(&n->pending);
	dircache_done(n);
	loop_source_free(n->xfer_poller);
	loop_source_free(x->bell_src);
	if (x->bell >= 0)
		close(x->bell);
	pthread_mutex_destroy(&x->lock);
	free(x);
	n->xfer = NULL;
}
