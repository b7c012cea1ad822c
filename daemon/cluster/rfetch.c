/* SPDX-License-Identifier: MIT */
/*
 * Fetching a key this node does not hold from a node that does (the
 * remote backend's locate): the placeholder, the lookup, a place among
 * the fetches in flight, and the exchange a data thread runs (xfer.h).
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
#include "fetch.h"
#include "handoff.h"
#include "node-private.h"
#include "serve.h"
#include "shm-layout.h"
#include "xfer.h"

#define LOG_TOPIC "remote"

#define MAX_RFETCHES 256   /* fetches in flight; more wait for a place, */
#define MAX_BACKLOG 8192   /* this many; more are misses */
#define MAX_HOLDERS_TRIED 4

/* (defined with the completions, below) */
static const struct xjob_ops fetch_ops;

/*
 * The fetches begun in one turn of the loop (a client's batch: up to 128
 * requests at once) ask each master who holds their keys in one Lookup
 * frame, at the turn's end (a poller), not one frame per key: a 64-key
 * batch load of 64 KiB values kept the master's loop at 17% of a CPU and
 * each lookup took 300-600 us.  The master answers the keys it knows, in
 * the order asked.
 */
#define GROUP_MAX 64

_Static_assert(RF_MASTERS == MAX_MASTERS, "a Lookup filling for each master");
_Static_assert(RF_PROGRESS == SHM_SEG_PROGRESS_SLOTS, "a progress word per slot");

struct lgroup {
	struct lgroup *next, *prev; /* in n->fetches.asked[its master], once asked */
	struct link *k;
	uint32_t seq;
	unsigned n;
	struct rfetch *rf[GROUP_MAX]; /* NULL: ended before the answer */
};

struct rfetch {
	struct rfetch *next, *prev; /* in n->fetches.rfetches, or next in n->fetches.backlog */
	struct node *n;
	struct object *o;        /* placeholder: not in the index; o->fetch set */
	struct lgroup *grp;      /* the Lookup asking who holds it, until answered */
	unsigned gi;             /* its place in grp */
	bool transferring;
	usec_t deadline;
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
	/* its progress word (streamed: a slot taken), written by the data
	 * thread; dirty: bytes may have landed (a next attempt starts over);
	 * restarted: the word says so, and advances no more */
	bool streamed, dirty, restarted;
	unsigned pslot;
	uint64_t *word, word0;
	/* when it was asked for, had a holder and a place, asked its holder
	 * (data thread), had the holder's answer, had its bytes checked */
	usec_t t_begin, t_placed, t_asked, t_answer, t_bytes;
	struct xjob job;
};

/*
 * Streaming (SHM_SQE_STREAM): once a fetch's bytes have a place, its
 * waiters hear where, and of a progress word in the landing segment's
 * header that the data thread advances chunk by chunk, so a client's get
 * copies behind the transfer instead of after it (a 16 MiB get ran at
 * 60% of an acquire).  An attempt after bytes may have landed (another
 * holder; a kept connection that went stale) first marks the word
 * restarted: what was read is void, and the reader waits for the end.
 */
static void stream_begin(struct node *n, struct rfetch *rf)
{
	struct rfetcher *fs = &n->fetches;
	struct store_segment seg;
	unsigned s;

	if (!fs->n_pfree || !rf->o->fetch)
		return;
	s = fs->pfree[fs->pfree_head];
	fs->pfree_head = (fs->pfree_head + 1) % RF_PROGRESS;
	fs->n_pfree--;
	fs->pgen[s] = fs->pgen[s] % SHM_PROGRESS_GEN_MAX + 1;
	store_segment(n->st, 0, &seg); /* landings go to the first memory tier */
	rf->streamed = true;
	rf->pslot = s;
	rf->word = (uint64_t *) ((uint8_t *) seg.base + SHM_SEG_PROGRESS_OFF) + s;
	rf->word0 = (uint64_t) fs->pgen[s] << SHM_PROGRESS_GEN_SHIFT;
	__atomic_store_n(rf->word, rf->word0, __ATOMIC_RELEASE);
	fetch_landing(rf->o->fetch, &(struct fetch_stream) {
		.on = true,
		.segment = seg.index,
		.offset = store_land_offset(rf->o),
		.len = rf->o->len,
		.slot = s,
		.word0 = rf->word0,
	});
}

/* The fetch ended with res.  One that failed may go on elsewhere (the
 * shared tier, perhaps into the very same block): whatever a reader
 * copied from this one is void, and the fetch streams no more. */
static void stream_end(struct node *n, struct rfetch *rf, int res)
{
	struct rfetcher *fs = &n->fetches;

	if (!rf->streamed)
		return;
	if (res < 0) {
		__atomic_store_n(rf->word, rf->word0 | SHM_PROGRESS_RESTART, __ATOMIC_RELEASE);
		if (rf->o->fetch)
			rf->o->fetch->stream.on = false;
	}
	fs->pfree[(fs->pfree_head + fs->n_pfree++) % RF_PROGRESS] = (uint16_t) rf->pslot;
	rf->streamed = false;
}

/* On the data thread, before an attempt writes rf's bytes: the word to
 * advance (NULL: none, or it was marked restarted). */
static uint64_t *stream_attempt(struct rfetch *rf)
{
	if (!rf->streamed || rf->restarted)
		return NULL;
	if (rf->dirty) {
		__atomic_store_n(rf->word, rf->word0 | SHM_PROGRESS_RESTART, __ATOMIC_RELEASE);
		__atomic_fetch_add(&rf->n->fetches.c.restarts, 1, __ATOMIC_RELAXED);
		rf->restarted = true;
		return NULL;
	}
	rf->dirty = true;
	return rf->word;
}

static int fetch_on(struct rfetch *rf, int fd, bool rdma, const char *address,
		    usec_t deadline, bool *in_step);

/* A connection done with: kept for the next exchange when in step, else
 * closed. */
static void conn_done(struct xfer *x, const char *address, int fd, bool rd, bool in_step)
{
	if (in_step)
		xfer_idle_put(x, address, fd, rd);
	else
		close(fd);
}

/* One fetch from one holder, on a data thread: on a kept connection if
 * there is one (once more on a new one if it went stale), else a new one. */
static int fetch_from(struct rfetch *rf, const char *address, usec_t deadline)
{
	struct xfer *x = rf->n->xfer;
	bool rd = false, in_step;
	int fd = xfer_idle_take(x, address, &rd), r;

	if (fd >= 0) {
		r = fetch_on(rf, fd, rd, address, deadline, &in_step);
		conn_done(x, address, fd, rd, in_step);
		if (r != -ECONNRESET && r != -EPIPE) /* else stale: once more */
			return r;
	}
	r = xfer_open_conn(rf->n, address, deadline, &fd, &rd);
	if (r < 0)
		return r;
	r = fetch_on(rf, fd, rd, address, deadline, &in_step);
	conn_done(x, address, fd, rd, in_step);
	return r;
}

/* The object the holder said is at resp's place: read it by RDMA into
 * rf->dst, check it, and tell the holder it may let it go. */
static int fetch_rdma(struct rfetch *rf, int fd, const Kvc__Peer__FetchResp *resp,
		      const char *address, usec_t deadline)
{
	struct node *n = rf->n;
	struct object *o = rf->o;
	Kvc__Peer__FetchDone done = KVC__PEER__FETCH_DONE__INIT;
	uint64_t loff = store_land_offset(o);
	struct blk_pace pace = blk_pace(n->timeout, deadline, o->len);
	int r;

	stream_attempt(rf); /* (an RDMA read says nothing until it is whole) */
	r = xfer_rdma(n, true, address, resp->region, resp->offset, 0, loff, o->len, &pace);

	if (r == 0)
		r = blk_sum(rf->dst, o->len, &rf->sum);
	if (r == 0 && rf->sum != resp->checksum)
		r = -EBADMSG;
	done.error = r;
	/* a read that succeeded stands even if this does not go out: the
	 * holder lets the view go when the connection drops */
	xfer_send_msg(fd, PEER_FETCH_DONE, &done.base, mono_us() + n->timeout);
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
static int fetch_answer(struct rfetch *rf, int fd, struct blk_rx *rx, uint32_t seq, bool rdma,
			const char *address, usec_t deadline)
{
	struct object *o = rf->o;
	Kvc__Peer__FetchResp *resp;
	ProtobufCMessage *m;
	struct peer_hdr h;
	const uint8_t *p;
	int r = blk_rx_need(fd, rx, PEER_HDR_SIZE, deadline, &p);

	if (r < 0)
		return r;
	rf->t_answer = mono_us();
	r = peer_hdr_decode(p, BLK_RX_CAP - PEER_HDR_SIZE, &h);
	if (r == 0 && (h.type != PEER_FETCH_RESP || h.seq != seq))
		r = -EPROTO;
	if (r == 0) {
		blk_rx_take(rx, PEER_HDR_SIZE);
		r = blk_rx_need(fd, rx, h.len, deadline, &p);
	}
	if (r == 0) {
		r = peer_msg_decode(h.type, p, h.len, &m);
		blk_rx_take(rx, h.len);
	}
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
		struct blk_pace pace = blk_pace(rf->n->timeout, deadline, o->len);

		uint64_t *word = stream_attempt(rf);

		r = blk_recv_checked_rx(fd, rx, rf->dst, o->len, &pace, &rf->sum, word,
					rf->word0);
	}
	if (r == 0) {
		rf->summed = true;
		rf->t_bytes = mono_us();
	}
	protobuf_c_message_free_unpacked(m, NULL);
	return r;
}

/* The exchange on a connected fd: 0, -ENOENT (cleanly), or another error.
 * *in_step: the connection may carry the next exchange. */
static int fetch_on(struct rfetch *rf, int fd, bool rdma, const char *address,
		    usec_t deadline, bool *in_step)
{
	Kvc__Peer__Fetch q = fetch_msg(rf, rdma);
	struct blk_rx rx;
	int r;

	blk_rx_init(&rx);
	rf->t_asked = mono_us();
	r = xfer_send_msg(fd, PEER_FETCH, &q.base, deadline);

	if (r == 0)
		r = fetch_answer(rf, fd, &rx, 1, rdma, address, deadline);
	/* (bytes past the answer: the holder is out of step) */
	*in_step = (r == 0 || r == -ENOENT) && !blk_rx_held(&rx);
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
static void run_fetch(struct rfetch *rf, struct xjob *j, usec_t deadline, unsigned first)
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

/*
 * A fetch on its data thread is out of time at its request's deadline
 * (--remote-timeout-ms from when it was asked for, however long it
 * waited for a thread), unless its holder answered since: a fetch queued
 * behind others to a holder that keeps sending has --remote-timeout-ms
 * from the last answer.  So a batch of any size from a silent holder ends
 * at its deadline, not one wave of the data threads after another, and a
 * large batch from a holder that is sending is not cut.
 */
static usec_t fetch_deadline(const struct rfetch *rf, usec_t moved)
{
	usec_t d = moved + rf->n->timeout;

	return moved && d > rf->deadline ? d : rf->deadline;
}

/* A fetch out of time before it was asked for: it ends without a word to
 * its holder (which is not thereby sick: it may be the one ahead that is). */
static void fetch_expire(struct node *n, struct xjob *j)
{
	((struct rfetch *) j->owner)->expired = true;
	j->res = -ETIMEDOUT;
	xfer_hand_back(n, j);
}

/* moved: when the holder last answered (0: not lately). */
static void run_fetches(struct node *n, struct xjob **jobs, unsigned k, usec_t moved)
{
	struct xfer *x = n->xfer;
	char address[PEER_MAX_ID + 1]; /* a copy: each job goes back, and is freed, as it ends */
	struct xjob *again[PIPE_MAX];
	unsigned n_again = 0, done = 0;
	uint8_t *frames = NULL;
	size_t len = 0;
	bool rd = false, kept;
	int fd, r = 0;
	struct blk_rx rx;

	usec_t timeout = n->timeout, now = mono_us(), asked;
	unsigned live = 0;

	memcpy(address, ((struct rfetch *) jobs[0]->owner)->addr[0], sizeof(address));
	for (unsigned i = 0; i < k; i++)
		if (fetch_deadline(jobs[i]->owner, moved) <= now)
			fetch_expire(n, jobs[i]);
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
		asked = mono_us();
		for (unsigned i = 0; r == 0 && i < k; i++)
			((struct rfetch *) jobs[i]->owner)->t_asked = asked;
		if (r == 0)
			r = blk_send(fd, frames, len, fetch_deadline(jobs[0]->owner, moved));
		if (r == 0 || !kept || (r != -ECONNRESET && r != -EPIPE))
			break;
		close(fd); /* a kept connection that went stale: once more */
		fd = -1;
		kept = false;
	}
	free(frames);
	blk_rx_init(&rx);
	if (r == 0) {
		__atomic_fetch_add(&n->fetches.c.fetch_ahead, k - 1, __ATOMIC_RELAXED);
		for (; done < k; done++) {
			struct xjob *j = jobs[done];
			struct rfetch *rf = j->owner;

			rf->tried = 0;
			r = fetch_answer(rf, fd, &rx, done + 1, false, address,
					 fetch_deadline(rf, moved));
			j->res = r;
			if (r == 0 || r == -ENOENT || r == -EIO)
				moved = xfer_note_moved(x, address);
			if (r == -ENOENT || r == -EIO) {
				again[n_again++] = j; /* its other holders, if any */
				r = 0;
				continue;
			}
			if (r < 0)
				break;
			fetch_result(j);
			xfer_hand_back(n, j);
		}
	}
	/* (bytes past the last answer: the holder is out of step) */
	if (fd >= 0)
		conn_done(x, address, fd, rd, r == 0 && !blk_rx_held(&rx));
	if (done < k && (r == -ETIMEDOUT || r == -EBADMSG)) {
		/* no second try for this one; the holder is not answering
		 * the ones behind it in time either after a timeout */
		jobs[done]->res = r;
		xfer_hand_back(n, jobs[done]);
		done++;
		for (; r == -ETIMEDOUT && done < k; done++) {
			jobs[done]->res = -ETIMEDOUT;
			xfer_hand_back(n, jobs[done]);
		}
	}
	for (unsigned i = 0; i < n_again; i++) {
		struct rfetch *rf = again[i]->owner;

		if (rf->n_addr > 1)
			run_fetch(rf, again[i], mono_us() + timeout, 1);
		else
			fetch_result(again[i]); /* -ENOENT or -EIO, as the holder said */
		xfer_hand_back(n, again[i]);
	}
	for (; done < k; done++) { /* the connection broke: each on its own */
		run_fetch(jobs[done]->owner, jobs[done], mono_us() + timeout, 0);
		xfer_hand_back(n, jobs[done]);
	}
}

/* ---- fetching ---- */

static void rf_unlink(struct node *n, struct rfetch *rf)
{
	if (rf->prev)
		rf->prev->next = rf->next;
	else
		n->fetches.rfetches = rf->next;
	if (rf->next)
		rf->next->prev = rf->prev;
	n->fetches.n_rfetches--;
}

/* A holder that let a fetch time out is passed over this long (the
 * deadline again, at least 1 s): the key's other holders are asked, and
 * when it has none the fetch misses at once instead of holding a data
 * thread for another deadline.  The first fetch after it is a probe. */
#define SICK(n) ((n)->timeout > USEC_PER_SEC ? (n)->timeout : USEC_PER_SEC)

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
	uint64_t len = o->len;

	rf_unlink(n, rf);
	rf_unprobe(rf);
	stream_end(n, rf, res);
	if (rf->grp)
		rf->grp->rf[rf->gi] = NULL;
	if (rf->n_addr && rf->transferring && !rf->expired) {
		struct peer_stat *ps = node_peer_stat(n, rf->addr[rf->tried]);

		if (ps && res == 0) {
			ps->fetches++;
			ps->fetch_bytes += o->len;
			ps->sick_until = 0;
		} else if (ps && res < 0 && res != -ENOENT) {
			ps->fetch_errors++;
			if (res == -ETIMEDOUT) /* silent for a whole deadline */
				ps->sick_until = loop_now(n->loop) + SICK(n);
		}
	}
	if (res < 0) {
		if (res == -ENOENT)
			n->fetches.c.remote_misses++;
		else
			n->fetches.c.remote_errors++;
		if (res == -EBADMSG) {
			n->fetches.c.remote_corrupt++;
			log_warn_ratelimited("%s from %s: checksum mismatch; not served", o->key,
					     rf->addr[0]);
		}
	}
	if (res == 0) {
		o->ver = rf->ver;
		store_version_seen(st, rf->ver);
	}
	/* (-EEXIST: stored here meanwhile; its waiters find that one) */
	if (store_land_done(st, o, res, rf->summed, rf->sum) == 0) {
		n->fetches.c.remote_hits++;
		xfer_count_bytes(n, true, rf->via_rdma, len);
	}
	free(rf);
	backlog_pump(n);
}

/* Drop rf's holders known sick, but one of them nobody is probing, which
 * it asks last (its probe); false when none is left. */
static bool rf_healthy(struct node *n, struct rfetch *rf)
{
	usec_t now = loop_now(n->loop);
	unsigned k = 0, probe = MAX_HOLDERS_TRIED;

	for (unsigned i = 0; i < rf->n_addr; i++) {
		struct peer_stat *ps = node_peer_stat(n, rf->addr[i]);

		if (ps && ps->sick_until > now) {
			if (probe == MAX_HOLDERS_TRIED && (rf->probe == ps || !ps->probing)) {
				ps->probing = true;
				rf->probe = ps;
				probe = i;
			} else
				n->fetches.c.sick_skips++;
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

static void group_unlink(struct node *n, struct lgroup *g)
{
	unsigned m = g->k->index;

	if (g->prev)
		g->prev->next = g->next;
	else
		n->fetches.asked[m] = g->next;
	if (g->next)
		g->next->prev = g->prev;
	else
		n->fetches.asked_tail[m] = g->prev;
}

/* g's keys (those whose fetches have not ended) go to its master in one
 * Lookup; when that master is not there, each fetch misses. */
static void group_ask(struct node *n, struct lgroup *g)
{
	ProtobufCBinaryData keys[GROUP_MAX];
	unsigned m = 0;

	n->fetches.filling[g->k->index] = NULL;
	for (unsigned i = 0; i < g->n; i++) {
		struct rfetch *rf = g->rf[i];

		if (!rf)
			continue;
		keys[m] = (ProtobufCBinaryData) { .len = rf->o->key_len,
						   .data = (uint8_t *) rf->o->key };
		rf->gi = m;
		g->rf[m++] = rf;
	}
	g->n = m;
	if (m && node_lookup_many(g->k, keys, m, &g->seq) < 0) {
		for (unsigned i = 0; i < m; i++) {
			g->rf[i]->grp = NULL;
			rf_finish(n, g->rf[i], -ENOENT);
		}
		m = 0;
	}
	if (!m) {
		free(g);
		return;
	}
	n->fetches.c.lookups++;
	n->fetches.c.lookup_keys += m;
	g->next = NULL;
	g->prev = n->fetches.asked_tail[g->k->index];
	if (g->prev)
		g->prev->next = g;
	else
		n->fetches.asked[g->k->index] = g;
	n->fetches.asked_tail[g->k->index] = g;
}

/* rf's key into the Lookup its master is asked at this turn's end (a
 * full one is asked at once).  <0: that master is not there. */
static int lookup_add(struct node *n, struct rfetch *rf)
{
	struct link *k = node_owner(n, rf->o->key, rf->o->key_len);
	struct lgroup *g = n->fetches.filling[k->index];

	if (g && g->n == GROUP_MAX)
		group_ask(n, g); /* (may begin others, which fill a new one) */
	if (k->state != L_UP)
		return -ENOENT;
	g = n->fetches.filling[k->index];
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g)
			return -ENOENT;
		g->k = k;
		n->fetches.filling[k->index] = g;
	}
	rf->grp = g;
	rf->gi = g->n;
	g->rf[g->n++] = rf;
	return 0;
}

/* The loop's poller: the Lookups filled this turn go out. */
static bool lookups_flush(void *u)
{
	struct node *n = u;
	bool did = false;

	for (unsigned i = 0; i < n->links.n; i++)
		if (n->fetches.filling[i]) {
			group_ask(n, n->fetches.filling[i]);
			did = true;
		}
	return did;
}

/* rf's bytes have their place (store_land_place()): they land there, and
 * its waiters may hear where (a transfer follows at once). */
static void rf_placed(struct node *n, struct rfetch *rf)
{
	rf->dst = store_object_ptr(rf->o);
	rf->transferring = true;
	rf->t_placed = mono_us();
	stream_begin(n, rf);
}

/* Begin a fetch whose placeholder is made: a place among the fetches in
 * flight, then the transfer at once if an exists or prefix lookup just
 * asked the directory, else a Lookup.  <0: not begun. */
static int rf_begin(struct node *n, struct rfetch *rf)
{
	struct object *o = rf->o;

	rf->prev = NULL;
	rf->next = n->fetches.rfetches;
	if (rf->next)
		rf->next->prev = rf;
	n->fetches.rfetches = rf;
	n->fetches.n_rfetches++;
	if (dc_addresses(n, o->key, o->key_len, o->hash, rf->addr, MAX_HOLDERS_TRIED, &rf->n_addr,
			 &o->len) && rf_healthy(n, rf) &&
	    store_land_place(n->st, o) == 0) {
		rf_placed(n, rf);
	} else {
		rf->n_addr = 0;
		o->len = 0;
		if (lookup_add(n, rf) < 0) {
			rf_unlink(n, rf);
			return -ENOENT;
		}
	}
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
	if (res == -ENOENT)
		n->fetches.c.remote_misses++;
	else
		n->fetches.c.remote_errors++;
	store_land_done(n->st, rf->o, res, false, 0);
	free(rf);
}

static struct rfetch *backlog_pop(struct node *n)
{
	struct rfetch *rf = n->fetches.backlog;

	n->fetches.backlog = rf->next;
	if (!n->fetches.backlog)
		n->fetches.backlog_tail = NULL;
	n->fetches.n_backlog--;
	rf->next = NULL;
	return rf;
}

/* Places among the fetches in flight went free: the oldest waiting begin. */
static void backlog_pump(struct node *n)
{
	while (n->fetches.backlog && n->fetches.n_rfetches < MAX_RFETCHES) {
		struct rfetch *rf = backlog_pop(n);

		if (rf_begin(n, rf) < 0)
			backlog_drop(n, rf, -ENOENT);
	}
}

int remote_locate(void *be, const void *key, size_t len, struct fetch **ret)
{
	struct node *n = be;
	struct object *o = store_landing_find(n->st, key, len);
	struct rfetch *rf;
	struct fetch *f;

	if (o) { /* single flight */
		*ret = o->fetch;
		return 0;
	}
	if ((n->fetches.n_rfetches >= MAX_RFETCHES || n->fetches.backlog) && n->fetches.n_backlog >= MAX_BACKLOG)
		return -ENOENT;
	rf = calloc(1, sizeof(*rf));
	if (!rf)
		return -ENOENT;
	if (store_land_begin(n->st, key, len, true, &o, &f) != 0) {
		free(rf);
		return -ENOENT;
	}
	rf->n = n;
	rf->o = o;
	rf->t_begin = mono_us();
	/* from the request: lookup, a place, a thread and the answer all count */
	rf->deadline = loop_now(n->loop) + n->timeout;
	if (n->fetches.n_rfetches >= MAX_RFETCHES || n->fetches.backlog) {
		/* in the order asked, each bounded like a lookup */
		if (n->fetches.backlog_tail)
			n->fetches.backlog_tail->next = rf;
		else
			n->fetches.backlog = rf;
		n->fetches.backlog_tail = rf;
		n->fetches.n_backlog++;
		n->fetches.c.fetch_waited++;
		loop_timer_arm_by(n->timer, rf->deadline);
	} else if (rf_begin(n, rf) < 0) {
		rf_unprobe(rf);
		store_land_abandon(n->st, o); /* nobody waits yet */
		free(rf);
		return -ENOENT;
	}
	*ret = f;
	return 0;
}


void remote_link_lost(struct node *n, struct link *k)
{
	static const Kvc__Peer__LookupResp none = KVC__PEER__LOOKUP_RESP__INIT;
	struct lgroup *g = n->fetches.filling[k->index];

	while (queries_link_lost(n, k))
		;
	/* the fetches still asking k who holds their key miss now */
	if (g) {
		n->fetches.filling[k->index] = NULL;
		for (unsigned i = 0; i < g->n; i++)
			if (g->rf[i]) {
				g->rf[i]->grp = NULL;
				rf_finish(n, g->rf[i], -ENOENT);
			}
		free(g);
	}
	while ((g = n->fetches.asked[k->index]))
		remote_located(n, k, g->seq, &none);
}

/* rf's holders are as loc says (NULL: held nowhere): its transfer is
 * queued, or it ends. */
static void located(struct node *n, struct rfetch *rf, const Kvc__Peer__Location *loc)
{
	struct object *o = rf->o;
	int r;

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
	o->len = loc->len;
	r = store_land_place(n->st, o);
	if (r < 0) {
		rf_finish(n, rf, r);
		return;
	}
	rf_placed(n, rf);
	rf->job = (struct xjob) { .ops = &fetch_ops, .owner = rf };
	xfer_queue(n, &rf->job);
}

void remote_located(struct node *n, struct link *k, uint32_t seq,
		    const Kvc__Peer__LookupResp *resp)
{
	struct lgroup *g;
	size_t li = 0;

	if (query_answered(n, k, seq, resp))
		return;
	/* the first one asked of k, as k answers in order (past any whose
	 * answer never came), never one asked after seq */
	for (g = n->fetches.asked[k->index]; g && g->seq != seq && (int32_t) (seq - g->seq) > 0;
	     g = g->next)
		;
	if (!g || g->seq != seq)
		return;
	group_unlink(n, g);
	/* the answers name the keys known, in the order asked */
	for (unsigned i = 0; i < g->n; i++) {
		struct rfetch *rf = g->rf[i];
		const Kvc__Peer__Location *loc = li < resp->n_locations ? resp->locations[li] : NULL;

		if (!rf)
			continue;
		rf->grp = NULL;
		if (loc && loc->key.len == rf->o->key_len &&
		    !memcmp(loc->key.data, rf->o->key, rf->o->key_len))
			li++;
		else
			loc = NULL;
		located(n, rf, loc);
	}
	free(g);
}

void remote_expire(struct node *n, usec_t now)
{
	queries_expire(n, now);
	serve_expire(n, now);
	if (n->dc.pend_poll.waiters && now >= n->dc.pend_poll_at) {
		/* those waiting now ask again (one that waits again is
		 * newer than they, and waits for the next turn) */
		unsigned k = 0;

		for (struct waiter *w = n->dc.pend_poll.waiters; w; w = w->next)
			k++;
		while (k-- && fetch_wake_oldest(&n->dc.pend_poll, FETCH_AGAIN))
			;
		if (n->dc.pend_poll.waiters) {
			n->dc.pend_poll_at = now + DC_PENDING;
			loop_timer_arm_by(n->timer, n->dc.pend_poll_at);
		}
	}
	/* only lookups: a transfer ends by its own deadline on its thread */
	for (struct rfetch *rf = n->fetches.rfetches, *next; rf; rf = next) {
		next = rf->next;
		if (!rf->transferring && now >= rf->deadline)
			rf_finish(n, rf, -ENOENT);
	}
	/* waited a whole --remote-timeout-ms without a place: the oldest first */
	while (n->fetches.backlog && now >= n->fetches.backlog->deadline)
		backlog_drop(n, backlog_pop(n), -ETIMEDOUT);
}


/* Fuzzing: fetch keys[i] (lens[i] bytes each) from the node at address, as
 * if the directory had just named it, all asked for at once; then run the
 * completions, calling tick(u) between polls, until every fetch has ended.
 * got[i]: the key was fetched (it is in the index now). */
void remote_fetch_all(struct node *n, const char *const *keys, const uint64_t *lens, size_t k,
		      const char *address, void (*tick)(void *u), void *u, bool *got)
{
	/* the data threads find them queued together (a fuzzer wants the
	 * same run every time) */
	xfer_hold(n);
	for (size_t i = 0; i < k; i++) {
		struct fetch *f;

		dc_put(n, keys[i], strlen(keys[i]), true, "peer", address, lens[i]);
		remote_locate(n, keys[i], strlen(keys[i]), &f);
	}
	xfer_release(n);
	while (n->fetches.n_rfetches || n->fetches.n_backlog) {
		tick(u);
		if (!xfer_poll(n))
			usleep(50);
	}
	for (size_t i = 0; i < k; i++)
		got[i] = store_find(n->st, keys[i], strlen(keys[i])) != NULL;
}

/* ---- the jobs: run on a data thread, ended on the loop ---- */

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
	usec_t moved;

	moved = xfer_moved(x, rf->addr[0]);
	if (k > 1) {
		run_fetches(n, jobs, k, moved);
		return;
	}
	if (fetch_deadline(rf, moved) <= mono_us()) {
		fetch_expire(n, jobs[0]);
		return;
	}
	run_fetch(rf, jobs[0], fetch_deadline(rf, moved), 0);
	if (jobs[0]->res == 0 || jobs[0]->res == -ENOENT)
		xfer_note_moved(x, rf->addr[rf->tried]);
	xfer_hand_back(n, jobs[0]);
}

/*
 * Where a fetch's time went, phase by phase (kvcachectl stats,
 * remote_fetch_*_us): finding its holder and a place for its bytes (the
 * directory's answer, or a place among the fetches in flight), waiting for
 * a data thread, from asking to the holder's answer (the request's way
 * there, the holder's loop and thread), the bytes until checked, and the
 * hand-back to this loop.  Each step is a hand-off between threads or
 * nodes; a single fetch pays them all, a batch overlaps them.
 */
static void fetch_timed(struct node *n, const struct rfetch *rf)
{
	usec_t now = mono_us();
	const usec_t t[] = { rf->t_begin, rf->t_placed, rf->t_asked, rf->t_answer, rf->t_bytes,
			     now };
	uint64_t *sum[] = { &n->fetches.c.locate_us, &n->fetches.c.queue_us,
			    &n->fetches.c.answer_us, &n->fetches.c.bytes_us, &n->fetches.c.end_us };

	for (size_t i = 1; i < sizeof(t) / sizeof(t[0]); i++)
		if (!t[i - 1] || t[i] < t[i - 1])
			return; /* (a path that skipped a step: not timed) */
	for (size_t i = 0; i < sizeof(sum) / sizeof(sum[0]); i++)
		*sum[i] += t[i + 1] - t[i];
	n->fetches.c.timed++;
}

static void fetch_ended(struct node *n, struct xjob *j)
{
	if (j->res == 0)
		fetch_timed(n, j->owner);
	rf_finish(n, j->owner, j->res);
}

static const struct xjob_ops fetch_ops = {
	.queue = 0, .peer = fetch_peer, .joins = fetch_joins, .run = fetch_run,
	.done = fetch_ended,
};

static const struct holder_ops push_holder_ops = { 0 };

int remote_init(struct node *n)
{
	int r;

	n->dc.pend_poll.far = true;
	for (unsigned i = 0; i < RF_PROGRESS; i++)
		n->fetches.pfree[i] = (uint16_t) i;
	n->fetches.n_pfree = RF_PROGRESS;
	r = xfer_init(n);
	if (r < 0)
		return r;
	if (dircache_init(n) < 0)
		return -ENOMEM;
	r = loop_add_poller(n->loop, lookups_flush, NULL, n, &n->fetches.flush);
	if (r < 0)
		return r;
	holder_init(&n->h, n->st, &push_holder_ops);
	return store_landing_init(n->st);
}

void remote_done(struct node *n)
{
	if (!n->xfer)
		return;
	xfer_done(n); /* the threads stop first; the jobs they had go */
	{
		uint64_t res, views;

		holder_done(&n->h, &res, &views);
	}
	serve_close_all(n);
	loop_source_free(n->fetches.flush);
	n->fetches.flush = NULL;
	for (unsigned i = 0; i < RF_MASTERS; i++) {
		free(n->fetches.filling[i]);
		n->fetches.filling[i] = NULL;
	}
	for (unsigned i = 0; i < RF_MASTERS; i++)
		while (n->fetches.asked[i]) {
			struct lgroup *g = n->fetches.asked[i];

			group_unlink(n, g);
			free(g);
		}
	while (n->fetches.rfetches || n->fetches.backlog) {
		struct rfetch *rf = n->fetches.rfetches;

		if (rf)
			rf_unlink(n, rf);
		else
			rf = backlog_pop(n);
		store_land_abandon(n->st, rf->o); /* no waiter is left: sessions went first */
		free(rf);
	}
	dircache_done(n);
}
