/* SPDX-License-Identifier: MIT */
/*
 * Pushing: this node copying one of its objects to another (push_to), as
 * a prefill pushes the blocks a decode node will read.  The loop takes a
 * view of the object and queues the push; a data thread offers it and
 * sends the bytes (at once, to a node that takes eager pushes), several
 * to the same node one after another on one connection; the loop hears
 * the answer and lets the view go.
 */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blocking.h"
#include "log.h"
#include "node-private.h"
#include "rdma.h"
#include "xfer.h"

#define LOG_TOPIC "remote"

/* This node copying one of its objects to another (push_to). */
struct rpush {
	struct node *n;
	uint64_t handle, len;
	const uint8_t *bytes;
	uint32_t segment;      /* where bytes is, for an RDMA write */
	uint64_t offset;
	bool via_rdma;         /* it was written by RDMA */
	bool known, digested;  /* as in struct pserve */
	uint64_t known_sum, digest;
	bool eager;            /* the target takes the bytes without PushReady */
	uint64_t ver;          /* the object's version */
	char key[PEER_MAX_KEY + 1];
	size_t key_len;
	char addr[PEER_MAX_ID + 1];
	struct xjob job;
};

/* With RDMA: write the object where the target said, then its checksum
 * on the connection. */
static int push_rdma(struct rpush *p, int fd, const Kvc__Peer__PushReply *rep, usec_t deadline,
		     bool corrupt)
{
	struct blk_pace pace = blk_pace(p->n->timeout, deadline, p->len);
	uint64_t sum;
	int r;

	r = xfer_rdma(p->n, false, p->addr, rep->region, rep->offset, p->segment, p->offset,
		       p->len, &pace);
	if (r < 0) {
		/* the connection cannot say "never mind": it is not kept */
		rdma_peer_drop(p->n->rdma, p->addr);
		return r == -EINVAL ? -EPROTO : r;
	}
	if (!p->known && (r = blk_sum(p->bytes, p->len, &p->digest)) < 0)
		return r;
	sum = htole64((p->known ? p->known_sum : p->digest) ^ (corrupt ? 1 : 0));
	p->via_rdma = true;
	return blk_send(fd, &sum, sizeof(sum), mono_us() + p->n->timeout);
}

/* The target's PushDone: 0, -EEXIST or -ENOENT (it did not keep the copy;
 * the connection is fine), or another error. */
static int push_done(int fd, uint8_t *buf, size_t cap, usec_t deadline)
{
	ProtobufCMessage *m;
	int r = xfer_recv_frame(fd, PEER_PUSH_DONE, buf, cap, deadline, &m);

	if (r < 0)
		return r == -ENOENT ? -EPROTO : r;
	r = ((Kvc__Peer__PushReply *) m)->error;
	protobuf_c_message_free_unpacked(m, NULL);
	if (r == -EEXIST || r == -ENOSPC || r == -E2BIG || r == -ENOMEM)
		return r == -EEXIST ? -EEXIST : -ENOENT; /* refused, cleanly */
	return r == -ENOENT ? -EIO : r;
}

/* An eager push's frame, bytes and checksum (PushDone comes later). */
static int push_eager(struct rpush *p, int fd, usec_t deadline, bool corrupt)
{
	Kvc__Peer__Push q = KVC__PEER__PUSH__INIT;
	struct blk_pace pace = blk_pace(p->n->timeout, deadline, p->len);
	uint8_t *frame;
	size_t flen;
	int r;

	q.key = (ProtobufCBinaryData) { .len = p->key_len, .data = (uint8_t *) p->key };
	q.len = p->len;
	q.eager = true;
	q.version = p->ver;
	r = peer_frame_pack(PEER_PUSH, 1, &q.base, &frame, &flen);
	if (r < 0)
		return r;
	/* frame, bytes and checksum leave in full segments, together: sent
	 * as they come (TCP_NODELAY), the frame went out alone, the target's
	 * loop woke to it before the bytes were there and handed the push to
	 * a data thread instead of taking it in itself */
	r = blk_send_framed(fd, frame, flen, p->bytes, p->len, &pace, corrupt,
			    p->known ? &p->known_sum : NULL, &p->digest);
	free(frame);
	if (r == 0 && !p->known)
		p->digested = true;
	return r;
}

/* On a data thread: offer the object, and send it if the target wants it
 * (with eager, send it at once). */
static int push_on(struct rpush *p, int fd, bool rdma, usec_t deadline, bool corrupt)
{
	Kvc__Peer__Push q = KVC__PEER__PUSH__INIT;
	Kvc__Peer__PushReply *rep;
	ProtobufCMessage *m;
	uint8_t buf[256];
	int r;

	if (p->eager && !rdma) {
		/* the bytes at once; the answer says whether they were kept */
		r = push_eager(p, fd, deadline, corrupt);
		return r < 0 ? r : push_done(fd, buf, sizeof(buf), mono_us() + p->n->timeout);
	}
	q.key = (ProtobufCBinaryData) { .len = p->key_len, .data = (uint8_t *) p->key };
	q.len = p->len;
	q.rdma = rdma;
	q.version = p->ver;
	r = xfer_send_msg(fd, PEER_PUSH, &q.base, deadline);
	if (r == 0)
		r = xfer_recv_frame(fd, PEER_PUSH_READY, buf, sizeof(buf), deadline, &m);
	if (r < 0)
		return r;
	rep = (Kvc__Peer__PushReply *) m;
	r = rep->error;
	if (r < 0) {
		protobuf_c_message_free_unpacked(m, NULL);
		return r == -EEXIST ? -EEXIST : -ENOENT; /* the connection is fine */
	}
	if (rep->rdma && !rdma)
		r = -EPROTO;
	else if (rep->rdma)
		r = push_rdma(p, fd, rep, deadline, corrupt);
	else {
		struct blk_pace pace = blk_pace(p->n->timeout, deadline, p->len);

		r = blk_send_checked(fd, p->bytes, p->len, &pace, corrupt,
				 p->known ? &p->known_sum : NULL, &p->digest);
	}
	if (r == 0 && !p->known)
		p->digested = true;
	protobuf_c_message_free_unpacked(m, NULL);
	return r < 0 ? r : push_done(fd, buf, sizeof(buf), mono_us() + p->n->timeout);
}

static void run_push(struct rpush *p, struct xjob *j, usec_t timeout, bool corrupt)
{
	struct xfer *x = p->n->xfer;
	usec_t deadline = mono_us() + timeout;
	bool rd = false;
	int fd = xfer_idle_take(x, p->addr, &rd), r;

	if (fd >= 0) {
		r = push_on(p, fd, rd, deadline, corrupt);
		if (r == 0 || r == -EEXIST || r == -ENOENT) {
			xfer_idle_put(x, p->addr, fd, rd);
			j->res = r;
			return;
		}
		close(fd);
	}
	r = xfer_open_conn(p->n, p->addr, deadline, &fd, &rd);
	if (r == 0) {
		r = push_on(p, fd, rd, deadline, corrupt);
		if (r == 0 || r == -EEXIST || r == -ENOENT)
			xfer_idle_put(x, p->addr, fd, rd);
		else
			close(fd);
	}
	j->res = r == -ECONNREFUSED ? -ECONNRESET : r;
}

/*
 * Eager pushes to the same node, one after another on one connection
 * without waiting for each PushDone: the target takes them in order, and
 * the link does not stand idle while it stores each (on loopback a 1 MiB
 * push waited 400-1300 us for its PushDone after its last byte).  When the
 * connection breaks, the pushes not yet answered go again on their own (a
 * copy the target kept meanwhile is then -EEXIST, not an error).
 */
static void run_pushes(struct node *n, struct xjob **jobs, unsigned k, usec_t timeout,
		       bool corrupt)
{
	struct xfer *x = n->xfer;
	char address[PEER_MAX_ID + 1]; /* a copy: each job goes back, and is freed, as it ends */
	uint8_t buf[256];
	unsigned sent = 0, done = 0;
	bool rd = false;
	int fd, r = 0;

	memcpy(address, ((struct rpush *) jobs[0]->owner)->addr, sizeof(address));
	fd = xfer_idle_take(x, address, &rd);
	if (fd < 0)
		r = xfer_open_conn(n, address, mono_us() + timeout, &fd, &rd);
	if (r == 0 && rd)
		r = -EPROTO; /* (never: a node with RDMA pushes one by one) */
	for (; r == 0 && sent < k; sent++)
		r = push_eager(jobs[sent]->owner, fd, mono_us() + timeout, corrupt);
	if (r == 0)
		__atomic_fetch_add(&n->push.c.pushes_ahead, k - 1, __ATOMIC_RELAXED);
	for (; r == 0 && done < k; done++) {
		r = push_done(fd, buf, sizeof(buf), mono_us() + timeout);
		if (r == 0 || r == -EEXIST || r == -ENOENT) {
			jobs[done]->res = r; /* kept, or refused cleanly */
			r = 0;
		} else if (r == -EBADMSG || r == -EIO) {
			jobs[done]->res = r; /* damaged, or failed there: the stream is in step */
			r = 0;
		} else {
			break;
		}
		xfer_hand_back(n, jobs[done]);
	}
	if (fd >= 0 && r == 0)
		xfer_idle_put(x, address, fd, rd);
	else if (fd >= 0)
		close(fd);
	for (; r == -ETIMEDOUT && done < k; done++) {
		/* the target is not answering: the ones behind end too */
		jobs[done]->res = -ETIMEDOUT;
		xfer_hand_back(n, jobs[done]);
	}
	for (; done < k; done++) { /* the connection broke: each on its own */
		struct rpush *p = jobs[done]->owner;

		p->digested = false;
		run_push(p, jobs[done], timeout, corrupt);
		xfer_hand_back(n, jobs[done]);
	}
}

static const char *push_peer(const struct xjob *j)
{
	return ((const struct rpush *) j->owner)->addr;
}

/* eager pushes to the same node, one after another on one connection */
static bool push_joins(const struct node *n, const struct xjob *first, const struct xjob *next)
{
	const struct rpush *a = first->owner, *b = next->owner;

	return !n->rdma && a->eager && b->eager && !strcmp(a->addr, b->addr);
}

static void push_run(struct node *n, struct xjob **jobs, unsigned k)
{
	if (k > 1) {
		run_pushes(n, jobs, k, n->timeout, n->xfer->corrupt);
		return;
	}
	run_push(jobs[0]->owner, jobs[0], n->timeout, n->xfer->corrupt);
	xfer_hand_back(n, jobs[0]);
}

static void push_ended(struct node *n, struct xjob *j)
{
	struct rpush *p = j->owner;
	struct peer_stat *pst = node_peer_stat(n, p->addr);
	char msg[STORE_MSG_MAX];

	if (p->digested)
		store_release_summed(&n->h, p->handle, p->digest, msg);
	else
		store_release(&n->h, p->handle, msg);
	if (pst && j->res == 0) {
		pst->pushes++;
		pst->push_bytes += p->len;
	} else if (pst && j->res != -EEXIST) {
		pst->push_errors++;
	}
	if (j->res == 0) {
		n->push.c.pushes++;
		xfer_count_bytes(n, false, p->via_rdma, p->len);
	} else if (j->res != -EEXIST) {
		n->push.c.push_errors++;
		log_warn_ratelimited("push of %s to %s failed: %s", p->key, p->addr,
				     strerror(-j->res));
	}
	free(p);
}

static void push_drop(struct xjob *j)
{
	free(j->owner); /* its view goes with the holder */
}

static const struct xjob_ops push_ops = {
	.queue = 0, .peer = push_peer, .joins = push_joins, .run = push_run,
	.done = push_ended, .drop = push_drop,
};

int remote_push(void *be, const char *key, size_t len, const char *target)
{
	struct node *n = be;
	const char *addr = NULL;
	char msg[STORE_MSG_MAX];
	struct extent e;
	struct fetch *f = NULL;
	struct object *o;
	struct rpush *p;
	uint64_t features = 0;
	int r;

	if (!strcmp(target, n->id))
		return -EINVAL;
	for (unsigned i = 0; i < n->links.n && !addr; i++) {
		const Kvc__Peer__Members *ms = n->links.l[i].members;

		for (size_t k = 0; ms && k < ms->n_members && !addr; k++)
			if (!strcmp(ms->members[k]->node_id, target) &&
			    ms->members[k]->state != PEER_STATE_DOWN) {
				addr = ms->members[k]->address;
				features = ms->members[k]->features;
			}
	}
	if (!addr)
		return -EHOSTUNREACH;
	o = store_find(n->st, key, len);
	if (!o)
		return -ENOENT;
	r = store_acquire(&n->h, key, len, true, &e, &f, msg);
	if (r < 0)
		return r == -EINPROGRESS ? -EAGAIN : r; /* on disk only: not pushed */
	p = calloc(1, sizeof(*p));
	if (!p) {
		store_release(&n->h, e.handle, msg);
		return -ENOMEM;
	}
	p->n = n;
	p->handle = e.handle;
	p->len = e.len;
	p->bytes = store_extent_ptr(n->st, &e);
	p->segment = e.segment;
	p->offset = e.offset;
	p->ver = e.ver;
	p->known = e.summed;
	p->known_sum = e.sum;
	if (!p->known)
		presum_forget(n->presum, o); /* the push hashes it as it sends: once is enough */
	memcpy(p->key, key, len);
	p->key_len = len;
	p->eager = (features & PEER_FEAT_EAGER_PUSH) && e.len <= PEER_EAGER_PUSH_MAX &&
		   !n->xfer->no_eager;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->job = (struct xjob) { .ops = &push_ops, .owner = p };
	xfer_queue(n, &p->job);
	return 0;
}
