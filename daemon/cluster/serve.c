/* SPDX-License-Identifier: MIT */
/*
 * Serving other nodes: their data connections to this node's peer port,
 * the handshake (with a secret), their fetches (a view of the object,
 * the bytes sent by the loop when they fit the socket at once, else by a
 * data thread) and the pushes they send here (received by the loop when
 * small and all there, else by a data thread).
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "blocking.h"
#include "checksum.h"
#include "log.h"
#include "node-private.h"
#include "serve.h"
#include "xfer.h"

#define LOG_TOPIC "remote"

#define MAX_SERVING 1024   /* peers' data connections */
#define HANDSHAKE (2 * USEC_PER_SEC) /* a peer's Hello (and proof) arrives within this */
#define HANDSHAKE_MAX 128  /* connections yet to prove themselves, at most */
#define SERVE_MAX_FRAME (16u << 10) /* a frame an asker sends */

static const struct xjob_ops send_ops, recv_ops;

struct pserve {
	struct pserve *next, *prev;
	struct node *n;
	struct pconn pc;
	struct loop_source *src;
	struct holder h;
	bool busy;               /* a data thread is sending */
	bool eof;                /* the peer is done asking */
	bool hello, authed;      /* with a secret: Hello, then its proof */
	bool hs_wait;            /* on n's handshake list */
	struct pserve *hs_next, *hs_prev;
	struct hs_source from;   /* where it came from (the budget per source) */
	usec_t hs_deadline;
	bool rdma;               /* RDMA agreed: Fetch.rdma is answered with a place */
	bool want_rdma;          /* this request asked for the place */
	uint32_t segment;        /* where the object served is */
	uint64_t offset;
	/* an answer the loop began to send itself: its frame, the checksum,
	 * and how much of [frame, bytes, checksum] went out */
	uint8_t *head;
	size_t head_len, sent;
	uint64_t sum;
	uint64_t ver;            /* its version */
	bool known;              /* its checksum was known: known_sum, not hashed */
	uint64_t known_sum;
	bool digested;           /* a data thread hashed it (or checked it): digest */
	uint64_t digest;
	uint8_t nonce[PEER_NONCE_SIZE];
	struct object *push_o;   /* a pushed object being received */
	bool eager;              /* its bytes came right after its frame */
	int push_err;            /* an eager push refused (push_o NULL): why */
	unsigned inline_turn;    /* pushes the loop took in during this ps_process() */
	unsigned fetches;        /* asked on this connection so far */
	struct waiter w;         /* waiting for a disk read-back */
	uint32_t seq;
	uint8_t key[PEER_MAX_KEY];
	size_t key_len;
	uint64_t handle, len;
	const uint8_t *bytes;
	struct xjob job;
};

/* Data thread, owning a serving connection: what the loop queued on it
 * and could not send yet goes out first. */
static int send_queued(struct pserve *ps, usec_t deadline)
{
	int r;

	if (!pconn_wants_write(&ps->pc))
		return 0;
	r = blk_send(ps->pc.fd, ps->pc.out + ps->pc.out_off, ps->pc.out_len - ps->pc.out_off,
		      deadline);
	if (r == 0)
		ps->pc.out_len = ps->pc.out_off = 0;
	return r;
}

static void run_send(struct pserve *ps, struct xjob *j, usec_t timeout, bool corrupt)
{
	usec_t deadline = mono_us() + timeout;
	Kvc__Peer__FetchResp resp = KVC__PEER__FETCH_RESP__INIT;
	uint8_t *frame = NULL;
	size_t flen;
	int r;

	resp.len = ps->len;
	resp.version = ps->ver;
	r = blk_set_blocking(ps->pc.fd, true);
	if (r < 0) {
		j->res = r;
		return;
	}
	/* answers the loop queued before this one (misses of fetches asked
	 * ahead) go first: the asker reads them in order */
	r = send_queued(ps, deadline);
	if (r < 0) {
		blk_set_blocking(ps->pc.fd, false);
		j->res = r;
		return;
	}
	if (ps->head) {
		/* the rest of what the loop began (serve_now) */
		const struct {
			const void *p;
			size_t len;
		} part[3] = { { ps->head, ps->head_len }, { ps->bytes, ps->len },
			      { &ps->sum, sizeof(ps->sum) } };
		size_t skip = ps->sent;

		for (int i = 0; i < 3 && r == 0; i++) {
			if (skip >= part[i].len) {
				skip -= part[i].len;
				continue;
			}
			r = blk_send(ps->pc.fd, (const uint8_t *) part[i].p + skip,
				      part[i].len - skip, deadline);
			skip = 0;
		}
		free(ps->head);
		ps->head = NULL;
		if (blk_set_blocking(ps->pc.fd, false) < 0 && r == 0)
			r = -EIO;
		j->res = r;
		return;
	}
	if (ps->want_rdma) {
		/* the asker reads it: say where, with its checksum (kept, or
		 * hashed now), and hold it until the asker is done */
		if (!ps->known) {
			r = blk_sum(ps->bytes, ps->len, &ps->digest);
			if (r < 0) {
				blk_set_blocking(ps->pc.fd, false);
				j->res = r;
				return;
			}
		}
		resp.checksum = (ps->known ? ps->known_sum : ps->digest) ^ (corrupt ? 1 : 0);
		resp.rdma = true;
		resp.region = ps->segment;
		resp.offset = ps->offset;
	}
	r = peer_frame_pack(PEER_FETCH_RESP, ps->seq, &resp.base, &frame, &flen);
	if (r == 0 && ps->want_rdma)
		r = blk_send(ps->pc.fd, frame, flen, deadline);
	if (r == 0 && ps->want_rdma) {
		ProtobufCMessage *m;
		uint8_t buf[64];

		r = xfer_recv_frame(ps->pc.fd, PEER_FETCH_DONE, buf, sizeof(buf), deadline, &m);
		if (r == 0) {
			if (((Kvc__Peer__FetchDone *) m)->error)
				r = -EIO; /* the asker got nothing: not served */
			protobuf_c_message_free_unpacked(m, NULL);
		}
	} else if (r == 0 && ps->n->xfer->cut && ps->fetches > 1) {
		/* tests: a connection that breaks in the middle of an answer,
		 * after bytes that are not the object's */
		uint8_t *junk = malloc(ps->len / 2 + 1);

		r = junk ? blk_send(ps->pc.fd, frame, flen, deadline) : -ENOMEM;
		if (r == 0) {
			memset(junk, 0xee, ps->len / 2 + 1);
			r = blk_send(ps->pc.fd, junk, ps->len / 2, deadline);
		}
		free(junk);
		shutdown(ps->pc.fd, SHUT_RDWR);
		r = r < 0 ? r : -ECONNRESET;
	} else if (r == 0) {
		struct blk_pace pace = blk_pace(timeout, deadline, ps->len);

		/* the frame in the same system call as the first chunk */
		r = blk_send_framed(ps->pc.fd, frame, flen, ps->bytes, ps->len, &pace, corrupt,
				    ps->known ? &ps->known_sum : NULL, &ps->digest);
	}
	free(frame);
	if (r == 0 && !ps->known)
		ps->digested = true;
	if (blk_set_blocking(ps->pc.fd, false) < 0 && r == 0)
		r = -EIO; /* the loop reads it again: it must not block */
	j->res = r;
}

/* n bytes of an eager push: first what the loop read past its frame. */
static int take_in(struct pserve *ps, uint8_t *to, size_t n, usec_t deadline)
{
	size_t have = ps->pc.in_len - ps->pc.in_off, k = have < n ? have : n;

	memcpy(to, ps->pc.in + ps->pc.in_off, k);
	ps->pc.in_off += k;
	return k == n ? 0 : blk_recv(ps->pc.fd, to + k, n - k, deadline);
}

/* An eager push's len bytes and checksum: into dst, checked, or (dst
 * NULL: refused) read past. */
static int recv_eager(struct pserve *ps, uint8_t *dst, uint64_t len, const struct blk_pace *pace,
		      uint64_t *ret_sum)
{
	struct csum *h = dst ? csum_new() : NULL;
	uint8_t *scratch = dst ? NULL : malloc(BLK_CHUNK), tail[8];
	uint64_t want;
	int r = h || scratch ? 0 : -ENOMEM;

	for (uint64_t off = 0; r == 0 && off < len; off += BLK_CHUNK) {
		size_t n = len - off < BLK_CHUNK ? (size_t) (len - off) : BLK_CHUNK;
		uint8_t *to = dst ? dst + off : scratch;

		r = take_in(ps, to, n, blk_pace_next(pace));
		if (r == 0 && h)
			csum_update(h, to, n);
	}
	if (r == 0)
		r = take_in(ps, tail, sizeof(tail), blk_pace_next(pace));
	if (r == 0 && h) {
		memcpy(&want, tail, sizeof(want));
		if (csum_digest(h) != le64toh(want))
			r = -EBADMSG;
		else
			*ret_sum = le64toh(want);
	}
	csum_free(h);
	free(scratch);
	return r;
}

/* Read ahead of an eager push the loop takes in: enough for the next
 * push's frame, not so much of its bytes that copying them out of the
 * buffer costs more than the system calls saved. */
#define INLINE_AHEAD 4096u
/* Pushes the loop takes in one after another from one connection before
 * it looks at the others (and at its clients) again. */
#define INLINE_TURN 16u

/* Loop: an eager push whose len bytes and checksum are all in (FIONREAD
 * said so): what the loop read past its frame, then the rest in one
 * recvmsg() that also reads ahead (ahead) into the connection's buffer,
 * where the next push's frame usually is: that push is then taken in the
 * same turn instead of after another epoll_wait() and read. */
static int recv_inline(struct pserve *ps, uint8_t *dst, uint64_t len, bool ahead,
		       uint64_t *ret_sum)
{
	struct pconn *c = &ps->pc;
	size_t have = c->in_len - c->in_off, k = have < len ? have : (size_t) len, t, need;
	uint8_t tail[8];
	uint64_t want;

	memcpy(dst, c->in + c->in_off, k);
	c->in_off += k;
	have -= k;
	t = have < sizeof(tail) ? have : sizeof(tail);
	memcpy(tail, c->in + c->in_off, t);
	c->in_off += t;
	need = (size_t) (len - k) + sizeof(tail) - t;
	if (need) {
		size_t room = c->in_cap < INLINE_AHEAD ? c->in_cap : INLINE_AHEAD;
		struct iovec iov[3] = { { dst + k, (size_t) (len - k) },
					{ tail + t, sizeof(tail) - t },
					{ c->in, ahead ? room : 0 } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 3 };
		ssize_t got;

		c->in_off = c->in_len = 0; /* all of it was taken above */
		do
			got = recvmsg(c->fd, &mh, MSG_DONTWAIT);
		while (got < 0 && errno == EINTR);
		if (got == 0)
			return -ECONNRESET;
		if (got < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EIO : -errno;
		if ((size_t) got < need)
			return -EIO; /* fewer than FIONREAD said were there */
		c->in_len = (size_t) got - need;
	}
	memcpy(&want, tail, sizeof(want));
	if (blk_sum(dst, len, ret_sum) < 0)
		return -ENOMEM; /* (the connection is out of step: it goes) */
	return *ret_sum == le64toh(want) ? 0 : -EBADMSG;
}

/* On a data thread: a pushed object's bytes into its block. */
static void run_recv(struct pserve *ps, struct xjob *j, usec_t timeout)
{
	usec_t deadline = mono_us() + timeout;
	struct blk_pace pace = blk_pace(timeout, deadline, ps->len);
	struct object *o = ps->push_o;
	int r = blk_set_blocking(ps->pc.fd, true);

	/* PushReady may still sit in the connection's buffer */
	if (r == 0)
		r = send_queued(ps, deadline);
	if (r == 0 && ps->eager) {
		r = recv_eager(ps, o ? store_object_ptr(o) : NULL,
			       ps->len, &pace, &ps->digest);
	} else if (r == 0 && ps->want_rdma) {
		/* the pusher wrote the bytes: its checksum says it is done */
		uint64_t want;

		r = blk_recv(ps->pc.fd, &want, sizeof(want), pace.cap);
		if (r == 0)
			r = blk_sum(store_object_ptr(o), o->len, &ps->digest);
		if (r == 0 && ps->digest != le64toh(want))
			r = -EBADMSG;
	} else if (r == 0)
		r = blk_recv_checked(ps->pc.fd, store_object_ptr(o), o->len, &pace, &ps->digest,
				     NULL, 0);
	if (r == 0 && o)
		ps->digested = true;
	if (blk_set_blocking(ps->pc.fd, false) < 0 && r == 0)
		r = -EIO;
	j->res = r;
}

/* ps proved itself (or needs not): off the handshake list. */
static void hs_done(struct pserve *ps)
{
	struct node *n = ps->n;

	if (!ps->hs_wait)
		return;
	ps->hs_wait = false;
	if (ps->hs_prev)
		ps->hs_prev->hs_next = ps->hs_next;
	else
		n->srv.hs_head = ps->hs_next;
	if (ps->hs_next)
		ps->hs_next->hs_prev = ps->hs_prev;
	else
		n->srv.hs_tail = ps->hs_prev;
	n->srv.n_hs--;
}

usec_t remote_hs_deadline(const struct node *n)
{
	return n->srv.hs_head ? n->srv.hs_head->hs_deadline : UINT64_MAX;
}

static void ps_free(struct pserve *ps)
{
	struct node *n = ps->n;
	uint64_t res, views;

	hs_done(ps);
	fetch_unwait(&ps->w);
	free(ps->head);
	store_land_free(n->st, ps->push_o); /* NULL-safe */
	holder_done(&ps->h, &res, &views);
	loop_source_free(ps->src);
	pconn_done(&ps->pc);
	if (ps->prev)
		ps->prev->next = ps->next;
	else
		n->srv.serving = ps->next;
	if (ps->next)
		ps->next->prev = ps->prev;
	n->srv.n_serving--;
	free(ps);
}

static void ps_event(struct loop_source *s, int fd, uint32_t events, void *u);
static void ps_process(struct pserve *ps);
static int ps_serve(struct pserve *ps);

static void ps_fetch_ready(struct waiter *w, int res)
{
	struct pserve *ps = (struct pserve *) ((char *) w - offsetof(struct pserve, w));

	(void) res;
	/* ask again: a hit now, or its error */
	if (ps_serve(ps) < 0) {
		ps_free(ps);
		return;
	}
	ps_process(ps);
}



/* Objects up to this size the loop sends itself when the socket takes
 * them at once: a data thread would cost two wake-ups for a copy the
 * kernel does in microseconds. */
#define LOOP_SEND_MAX (256u << 10)

static void served(struct pserve *ps)
{
	struct node *n = ps->n;
	char msg[STORE_MSG_MAX];

	n->srv.c.served_summed += ps->known;
	if (ps->digested)
		store_release_summed(&ps->h, ps->handle, ps->digest, msg);
	else
		store_release(&ps->h, ps->handle, msg);
	ps->known = ps->digested = false;
	ps->busy = false;
	n->srv.c.served++;
	xfer_count_bytes(n, false, ps->want_rdma, ps->len);
}

/* A small hit, on the loop: [FetchResp, bytes, checksum] in one
 * non-blocking sendmsg.  0: all sent (the view is let go); 1: a data
 * thread sends the rest; <0: close. */
static int serve_now(struct pserve *ps)
{
	Kvc__Peer__FetchResp resp = KVC__PEER__FETCH_RESP__INIT;
	struct iovec iov[3];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 3 };
	ssize_t n;
	int r;

	if (ps->known) {
		ps->digest = ps->known_sum;
	} else {
		r = blk_sum(ps->bytes, ps->len, &ps->digest);
		if (r < 0)
			return r;
		ps->digested = true;
	}
	ps->sum = htole64(ps->digest ^ (ps->n->xfer->corrupt ? 1 : 0));
	resp.len = ps->len;
	resp.version = ps->ver;
	r = peer_frame_pack(PEER_FETCH_RESP, ps->seq, &resp.base, &ps->head, &ps->head_len);
	if (r < 0)
		return r;
	iov[0] = (struct iovec) { ps->head, ps->head_len };
	iov[1] = (struct iovec) { (void *) ps->bytes, ps->len };
	iov[2] = (struct iovec) { &ps->sum, sizeof(ps->sum) };
	do
		n = sendmsg(ps->pc.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
		free(ps->head);
		ps->head = NULL;
		return -errno;
	}
	ps->sent = n < 0 ? 0 : (size_t) n;
	if (ps->sent == ps->head_len + ps->len + sizeof(ps->sum)) {
		free(ps->head);
		ps->head = NULL;
		served(ps);
		return 0;
	}
	loop_set_io_events(ps->src, 0); /* the data thread owns the socket now */
	ps->job = (struct xjob) { .ops = &send_ops, .owner = ps };
	xfer_queue(ps->n, &ps->job);
	return 1;
}

/* Answer the request in ps->key: from a data thread for a hit, at once
 * otherwise.  <0: close. */
static int ps_serve(struct pserve *ps)
{
	struct node *n = ps->n;
	char msg[STORE_MSG_MAX];
	struct extent e;
	struct fetch *f = NULL;
	int r = -ENOENT;

	/* only what this node holds: never a lookup on a peer's behalf */
	if (store_find(n->st, ps->key, ps->key_len))
		r = store_acquire(&ps->h, ps->key, ps->key_len, true, &e, &f, msg);
	if (r == -EINPROGRESS && f) {
		/* on disk: wait for it, reading nothing more meanwhile */
		ps->w.done = ps_fetch_ready;
		fetch_wait(f, &ps->w);
		loop_set_io_events(ps->src, 0);
		return 1;
	}
	if (r == -EINPROGRESS)
		r = -EIO;
	if (r < 0) {
		Kvc__Peer__FetchResp resp = KVC__PEER__FETCH_RESP__INIT;

		resp.error = r == -ENOENT ? -ENOENT : -EIO;
		n->srv.c.serve_errors += r != -ENOENT;
		return pconn_send(&ps->pc, PEER_FETCH_RESP, ps->seq, &resp.base);
	}
	ps->handle = e.handle;
	ps->len = e.len;
	ps->segment = e.segment;
	ps->offset = e.offset;
	ps->ver = e.ver;
	ps->known = e.summed;
	ps->known_sum = e.sum;
	ps->digested = false;
	ps->bytes = store_extent_ptr(n->st, &e);
	ps->busy = true;
	if (!ps->want_rdma && e.len <= LOOP_SEND_MAX && !pconn_wants_write(&ps->pc))
		return serve_now(ps);
	loop_set_io_events(ps->src, 0); /* the data thread owns the socket now */
	ps->job = (struct xjob) { .ops = &send_ops, .owner = ps };
	xfer_queue(n, &ps->job);
	return 1;
}

/* With RDMA agreed, once the asker is authenticated: this node's pool,
 * for its one-sided reads. */
static int ps_rdma_info(struct pserve *ps, uint32_t seq)
{
	Kvc__Peer__RdmaInfo ri = KVC__PEER__RDMA_INFO__INIT;
	Kvc__Peer__RdmaRegion rg[RDMA_MAX_REGIONS], *rgp[RDMA_MAX_REGIONS];
	struct rdma_region regs[RDMA_MAX_REGIONS];
	unsigned n;
	size_t wl;

	if (!ps->rdma)
		return 0;
	ri.worker.data = (uint8_t *) rdma_worker_address(ps->n->rdma, &wl);
	ri.worker.len = wl;
	ri.device = (char *) rdma_device(ps->n->rdma);
	n = rdma_regions(ps->n->rdma, regs);
	for (unsigned i = 0; i < n; i++) {
		kvc__peer__rdma_region__init(&rg[i]);
		rg[i].id = regs[i].id;
		rg[i].addr = regs[i].addr;
		rg[i].size = regs[i].size;
		rg[i].rkey = (ProtobufCBinaryData) { .len = regs[i].rkey_len,
						      .data = (uint8_t *) regs[i].rkey };
		rgp[i] = &rg[i];
	}
	ri.regions = rgp;
	ri.n_regions = n;
	if (ps->n->xfer->bogus_rdma) {
		/* tests: a peer announcing a damaged description */
		static uint8_t junk[48];

		for (size_t i = 0; i < sizeof(junk); i++)
			junk[i] = (uint8_t) (0x5a ^ (i * 29));
		if (ps->n->xfer->bogus_rdma == 'r')
			for (unsigned i = 0; i < n; i++)
				rg[i].rkey = (ProtobufCBinaryData) { .len = sizeof(junk), .data = junk };
		else
			ri.worker = (ProtobufCBinaryData) { .len = sizeof(junk), .data = junk };
	}
	return pconn_send(&ps->pc, PEER_RDMA_INFO, seq, &ri.base) < 0 ? -EIO : 0;
}

/* The holder's side of the handshake (handshake() is the other). */
static int ps_auth(struct pserve *ps, uint8_t type, uint32_t seq, ProtobufCMessage *m)
{
	const struct peer_secret *sec = &ps->n->secret;

	if (type == PEER_HELLO) {
		const Kvc__Peer__Hello *x = (const void *) m;
		Kvc__Peer__HelloAck ack = KVC__PEER__HELLO_ACK__INIT;
		uint8_t proof[PEER_PROOF_SIZE];

		if (ps->hello)
			return -EPROTO;
		ps->hello = true;
		ack.features = x->features & PEER_FEAT_KNOWN;
		if (!ps->n->rdma)
			ack.features &= ~(uint64_t) PEER_FEAT_RDMA;
		ps->rdma = ack.features & PEER_FEAT_RDMA;
		if (sec->len && x->nonce.len == PEER_NONCE_SIZE) {
			peer_proof(sec, x->nonce.data, x->nonce.len, proof);
			peer_nonce(ps->nonce);
			ack.proof = (ProtobufCBinaryData) { .len = sizeof(proof), .data = proof };
			ack.nonce = (ProtobufCBinaryData) { .len = sizeof(ps->nonce),
							    .data = ps->nonce };
		} else if (sec->len) {
			ack.error = -EACCES;
			ack.error_msg = "this node requires the cluster secret";
		} else
			ps->authed = true;
		if (pconn_send(&ps->pc, PEER_HELLO_ACK, seq, &ack.base) < 0)
			return -EIO;
		if (ack.error)
			return -EACCES;
		return ps->authed ? ps_rdma_info(ps, seq) : 0;
	}
	if (!ps->hello || ps->authed || !sec->len)
		return -EPROTO;
	if (!peer_proof_ok(sec, ps->nonce, sizeof(ps->nonce),
			   ((const Kvc__Peer__Auth *) m)->proof.data,
			   ((const Kvc__Peer__Auth *) m)->proof.len)) {
		log_warn_ratelimited("peer connection refused: wrong cluster secret");
		return -EACCES;
	}
	ps->authed = true;
	return ps_rdma_info(ps, seq);
}

/* An eager push the loop takes in itself when its bytes are all there: a
 * copy and a hash of at most this, against two hand-offs. */
#define LOOP_RECV_MAX (64u << 10)

static int push_finish(struct pserve *ps, int res);

/* A push offered: make room and say so, then a data thread receives (an
 * eager one: receive it, or read past it). */
static int ps_push(struct pserve *ps, uint32_t seq, const Kvc__Peer__Push *x)
{
	struct store *st = ps->n->st;
	Kvc__Peer__PushReply rep = KVC__PEER__PUSH_REPLY__INIT;
	struct object *o = NULL;
	int r = 0;

	ps->seq = seq;
	if (ps->n->secret.len && !ps->authed)
		return -EACCES;
	if (x->eager && (x->rdma || x->len > PEER_EAGER_PUSH_MAX))
		return -EPROTO; /* bytes this node will not read past */
	if (store_find(st, x->key.data, x->key.len))
		r = -EEXIST;
	else if (!(o = store_land_object(x->key.data, x->key.len)))
		r = -ENOMEM;
	else {
		o->len = x->len;
		o->ver = x->version;
		store_version_seen(st, x->version);
		r = store_land_place(st, o);
	}
	rep.error = r;
	ps->eager = x->eager;
	ps->n->srv.c.pushes_eager += x->eager;
	ps->n->srv.c.pushes_refused += r < 0;
	if (r < 0 && x->eager) {
		/* its bytes are on their way: read past them, then say no */
		store_land_free(st, o);
		ps->push_err = r;
		o = NULL;
	} else if (r < 0) {
		store_land_free(st, o);
		return pconn_send(&ps->pc, PEER_PUSH_READY, seq, &rep.base) < 0 ? -EIO : 0;
	}
	ps->want_rdma = ps->rdma && x->rdma;
	if (x->eager) {
		int ready = 0;

		ps->len = x->len;
		ps->push_o = o;
		ps->busy = true;
		if (o && o->len <= LOOP_RECV_MAX && ioctl(ps->pc.fd, FIONREAD, &ready) == 0 &&
		    ps->pc.in_len - ps->pc.in_off + (size_t) ready >= o->len + 8) {
			/* small, and all here: taken in at once, by the loop */
			ps->n->srv.c.pushes_inline++;
			r = recv_inline(ps, store_object_ptr(o), o->len,
					++ps->inline_turn < INLINE_TURN, &ps->digest);
			ps->digested = r == 0;
			return push_finish(ps, r);
		}
		loop_set_io_events(ps->src, 0);
		ps->job = (struct xjob) { .ops = &recv_ops, .owner = ps };
		xfer_queue(ps->n, &ps->job);
		return 1;
	}
	if (ps->want_rdma) {
		rep.rdma = true;
		rep.region = 0; /* dram: o->tier */
		rep.offset = store_land_offset(o);
	}
	if (pconn_send(&ps->pc, PEER_PUSH_READY, seq, &rep.base) < 0) {
		store_land_free(st, o);
		return -EIO;
	}
	if (ps->pc.in_len - ps->pc.in_off) {
		/* bytes before PushReady: not how pushes go */
		store_land_free(st, o);
		return -EPROTO;
	}
	ps->push_o = o;
	ps->busy = true;
	loop_set_io_events(ps->src, 0);
	ps->job = (struct xjob) { .ops = &recv_ops, .owner = ps };
	xfer_queue(ps->n, &ps->job);
	return 1;
}

/* Loop: a pushed object's bytes are in (res 0), or not: store it and
 * answer PushDone.  <0: the connection is out of step and must go. */
static int push_finish(struct pserve *ps, int res)
{
	struct node *n = ps->n;
	struct object *o = ps->push_o;
	Kvc__Peer__PushReply rep = KVC__PEER__PUSH_REPLY__INIT;
	bool summed = ps->digested;

	ps->busy = false;
	ps->push_o = NULL;
	ps->eager = false;
	ps->digested = false;
	rep.error = res;
	if (!o) {
		/* an eager push refused, its bytes read past */
		if (res == 0)
			rep.error = ps->push_err;
	} else {
		uint64_t len = o->len;

		if (res == -EBADMSG) {
			n->srv.c.remote_corrupt++;
			log_warn_ratelimited("pushed %s: checksum mismatch; not stored", o->key);
		}
		rep.error = store_land_done(n->st, o, res, summed, ps->digest);
		if (rep.error == -EEXIST && res == 0)
			n->srv.c.pushes_refused++; /* stored here meanwhile */
		if (rep.error == 0) {
			n->srv.c.pushes_received++;
			xfer_count_bytes(n, true, ps->want_rdma, len);
		}
	}
	if (res < 0 && res != -EBADMSG)
		return res; /* the stream is out of step */
	/* sent at the end of ps_process(): the PushDones of the pushes taken
	 * in one turn leave together */
	return pconn_queue(&ps->pc, PEER_PUSH_DONE, ps->seq, &rep.base) < 0 ? -EIO : 0;
}

/* Frames already read, one request at a time. */
static void ps_process(struct pserve *ps)
{
	struct peer_hdr h;
	const uint8_t *payload;
	int r = 0;

	ps->inline_turn = 0;
	while (!ps->busy && !ps->w.fetch) {
		ProtobufCMessage *m;

		r = pconn_next(&ps->pc, &h, &payload);
		if (r <= 0)
			break;
		r = peer_msg_decode(h.type, payload, h.len, &m);
		if (r < 0)
			break;
		if (h.type == PEER_HELLO || h.type == PEER_AUTH) {
			r = ps_auth(ps, h.type, h.seq, m);
			protobuf_c_message_free_unpacked(m, NULL);
			if (r < 0)
				break;
			if (ps->authed)
				hs_done(ps);
			continue;
		}
		if (!ps->n->secret.len)
			hs_done(ps); /* a request without a Hello, where none is needed */
		if (h.type == PEER_PUSH) {
			r = ps_push(ps, h.seq, (const void *) m);
			protobuf_c_message_free_unpacked(m, NULL);
			if (r < 0)
				break;
			continue;
		}
		if (h.type != PEER_FETCH || (ps->n->secret.len && !ps->authed)) {
			if (h.type == PEER_FETCH)
				log_warn_ratelimited("peer connection refused: no proof of the "
						     "cluster secret");
			protobuf_c_message_free_unpacked(m, NULL);
			r = h.type == PEER_FETCH ? -EACCES : -EPROTO;
			break;
		}
		ps->seq = h.seq;
		ps->fetches++;
		ps->want_rdma = ps->rdma && ((Kvc__Peer__Fetch *) m)->rdma;
		ps->key_len = ((Kvc__Peer__Fetch *) m)->key.len;
		memcpy(ps->key, ((Kvc__Peer__Fetch *) m)->key.data, ps->key_len);
		protobuf_c_message_free_unpacked(m, NULL);
		r = ps_serve(ps);
		if (r < 0)
			break;
	}
	if (r == -EPROTONOSUPPORT) {
		ps->n->srv.c.version_refused++;
		log_warn_ratelimited("refused a peer speaking peer protocol %u (this node speaks "
				     "%u): upgrade one of them", ps->pc.their_major, peer_major);
		pconn_refuse_version(&ps->pc);
	}
	if (r < 0) {
		log_info("peer connection dropped: %s", strerror(-r));
		ps_free(ps);
		return;
	}
	ps->n->srv.c.push_turns += ps->inline_turn > 0;
	/* (a data thread that owns the connection sends what is queued first) */
	if ((!ps->busy && pconn_flush(&ps->pc) < 0) ||
	    (ps->eof && !ps->busy && !ps->w.fetch)) {
		ps_free(ps);
		return;
	}
	if (!ps->busy && !ps->w.fetch)
		loop_set_io_events(ps->src,
				   EPOLLIN | (pconn_wants_write(&ps->pc) ? EPOLLOUT : 0));
}

static void ps_event(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct pserve *ps = u;
	int r = 0;

	(void) s;
	(void) fd;
	if (ps->busy)
		return;
	if (events & EPOLLOUT)
		r = pconn_flush(&ps->pc);
	if (r == 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		r = pconn_read(&ps->pc);
	if (r < 0 && r != -ECONNRESET) {
		ps_free(ps);
		return;
	}
	if (r == -ECONNRESET)
		ps->eof = true; /* answer what was asked before it, then go */
	ps_process(ps);
}

void remote_refused(struct node *n, const char *why)
{
	/* counted and said (once in 10 s), so a flood is told apart from a
	 * dead holder */
	n->srv.c.refused++;
	if (loop_now(n->loop) >= n->srv.refused_logged + 10 * USEC_PER_SEC) {
		n->srv.refused_logged = loop_now(n->loop);
		log_warn("refusing peer connections (%u served): %s (stat peer_refused)",
			 n->srv.n_serving, why);
	}
}

void remote_accept(struct node *n, int fd)
{
	static const struct holder_ops ops = { 0 };
	struct pserve *ps;

	struct hs_source src;
	struct pserve *oldest = NULL;
	unsigned same = 0;

	/* a flood of connections that say nothing: its own oldest goes (past
	 * HS_PER_SOURCE from its address, or past HANDSHAKE_MAX in all), so a
	 * real peer, whose Hello comes at once, still gets in.  (The list is
	 * at most HANDSHAKE_MAX long.) */
	hs_source_of(fd, &src);
	for (struct pserve *p = n->srv.hs_head; p; p = p->hs_next)
		if (hs_source_eq(&p->from, &src) && !same++)
			oldest = p;
	if (same >= HS_PER_SOURCE || n->srv.n_hs >= HANDSHAKE_MAX) {
		n->srv.c.hs_timeouts++;
		if (loop_now(n->loop) >= n->srv.hs_logged + 10 * USEC_PER_SEC) {
			n->srv.hs_logged = loop_now(n->loop);
			log_warn("%u peer connections (%u from one address) have not said Hello: "
				 "closing the oldest (stat peer_handshake_timeouts)", n->srv.n_hs, same);
		}
		ps_free(same >= HS_PER_SOURCE ? oldest : n->srv.hs_head);
	}
	if (n->srv.n_serving >= MAX_SERVING || !(ps = calloc(1, sizeof(*ps)))) {
		remote_refused(n, n->srv.n_serving >= MAX_SERVING ? "all in use" : "out of memory");
		close(fd);
		return;
	}
	net_tune(fd, 1);
	net_congestion(fd, n->cfg->tcp_congestion); /* (the sender's counts) */
	ps->n = n;
	pconn_init(&ps->pc, fd, 1u << 20);
	/* askers send small frames (Hello, Auth, Fetch, Push, FetchDone), and
	 * the bytes of an eager push follow its frame: read little past it */
	pconn_limit_in(&ps->pc, SERVE_MAX_FRAME);
	holder_init(&ps->h, n->st, &ops);
	if (loop_add_io(n->loop, fd, EPOLLIN, ps_event, ps, &ps->src) < 0) {
		pconn_done(&ps->pc);
		free(ps);
		return;
	}
	ps->next = n->srv.serving;
	if (ps->next)
		ps->next->prev = ps;
	n->srv.serving = ps;
	n->srv.n_serving++;
	ps->hs_wait = true;
	ps->from = src;
	ps->hs_deadline = loop_now(n->loop) + HANDSHAKE;
	ps->hs_prev = n->srv.hs_tail;
	if (n->srv.hs_tail)
		n->srv.hs_tail->hs_next = ps;
	else
		n->srv.hs_head = ps;
	n->srv.hs_tail = ps;
	n->srv.n_hs++;
	loop_timer_arm_by(n->timer, ps->hs_deadline);
	/* a real peer's Hello is usually here already: read it now, so a
	 * burst of its connections is not counted against its address */
	ps_event(ps->src, fd, EPOLLIN, ps);
}

static void send_run(struct node *n, struct xjob **jobs, unsigned k)
{
	(void) k;
	run_send(jobs[0]->owner, jobs[0], n->timeout, n->xfer->corrupt);
	xfer_hand_back(n, jobs[0]);
}

static void send_ended(struct node *n, struct xjob *j)
{
	struct pserve *ps = j->owner;
	char msg[STORE_MSG_MAX];

	if (j->res < 0) {
		ps->busy = false;
		store_release(&ps->h, ps->handle, msg);
		n->srv.c.serve_errors++;
		ps_free(ps);
		return;
	}
	served(ps);
	ps_process(ps);
}

static const struct xjob_ops send_ops = { .queue = 1, .run = send_run, .done = send_ended };

static void recv_run(struct node *n, struct xjob **jobs, unsigned k)
{
	(void) k;
	run_recv(jobs[0]->owner, jobs[0], n->timeout);
	xfer_hand_back(n, jobs[0]);
}

static void recv_ended(struct node *n, struct xjob *j)
{
	struct pserve *ps = j->owner;

	(void) n;
	if (push_finish(ps, j->res) < 0) {
		ps_free(ps);
		return;
	}
	ps_process(ps);
}

static const struct xjob_ops recv_ops = { .queue = 1, .run = recv_run, .done = recv_ended };

/* Fuzzing: serve fd as an accepted data connection.  Handle what can be
 * read from it now, let the data threads finish what that started (their
 * completions run here, as the loop would run them), then hang it up as if
 * the peer had gone. */
void remote_feed(struct node *n, int fd)
{
	struct pserve *ps;

	remote_accept(n, fd);
	ps = n->srv.serving;
	if (!ps || ps->pc.fd != fd)
		return; /* refused: already closed */
	ps_event(ps->src, fd, EPOLLIN, ps);
	for (;;) {
		struct pserve *x;

		for (x = n->srv.serving; x && x != ps; x = x->next)
			;
		if (!x)
			return; /* it closed itself */
		if (!ps->busy) {
			ps_free(ps);
			return;
		}
		if (!xfer_poll(n))
			usleep(100); /* a data thread is still sending */
	}
}

/* Connections that did not prove themselves in time, oldest first. */
void serve_expire(struct node *n, usec_t now)
{
	while (n->srv.hs_head && now >= n->srv.hs_head->hs_deadline) {
		n->srv.c.hs_timeouts++;
		ps_free(n->srv.hs_head);
	}
}

void serve_close_all(struct node *n)
{
	while (n->srv.serving)
		ps_free(n->srv.serving);
}
