/* SPDX-License-Identifier: MIT */
/*
 * The node's side of the cluster.
 *
 * One link per master, every socket non-blocking on the loop.  A link
 * connects, says Hello, joins, and then heartbeats every third of the
 * master's client_ttl; each answer carries the member list kvcachectl
 * cluster shows.  Commits and removals become directory updates queued on
 * the link of the master that owns the key (key hash modulo masters) and
 * sent in batches each turn, so a put never waits for the network.  A link
 * that (re)joins re-publishes everything this node holds, walking the index
 * a bounded slice per turn: the directory is soft state.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "index.h"
#include "log.h"
#include "net.h"
#include "node.h"
#include "node-private.h"
#include "peer-conn.h"
#include "tier.h"

#define LOG_TOPIC "cluster"

static const struct backend_ops remote_ops;

/* ---- links ---- */

static void link_down(struct link *k, const char *why)
{
	if (k->state == L_UP)
		k->n->c.master_drops++;
	if (k->state == L_UP || !k->warned)
		log_warn("master %s: %s; retrying every %d ms", k->name, why, RETRY_MS);
	k->warned = true;
	loop_source_free(k->src);
	k->src = NULL;
	pconn_done(&k->pc);
	k->state = L_DOWN;
	k->retry_at = loop_now_ms(k->n->loop) + RETRY_MS;
	k->q_len = 0; /* what it missed comes with the next re-publish */
	k->resync = false;
	k->more = false;
	loop_timer_arm_by(k->n->timer, k->retry_at);
}

static void fill_load(struct node *n, Kvc__Peer__NodeLoad *l)
{
	struct store *st = n->st;

	kvc__peer__node_load__init(l);
	for (unsigned i = 0; i < st->n_tiers; i++) {
		l->capacity += tier_capacity(&st->tiers[i]);
		l->used += tier_used(&st->tiers[i]);
	}
	l->objects = st->index.n_objects;
}

static int send_join(struct link *k)
{
	struct node *n = k->n;
	Kvc__Peer__Join j = KVC__PEER__JOIN__INIT;
	Kvc__Peer__NodeLoad l;

	fill_load(n, &l);
	j.node_id = n->id;
	j.address = n->address;
	j.generation = n->generation;
	j.load = &l;
	j.transport = n->transport;
	j.features = PEER_FEAT_TCP | PEER_FEAT_EAGER_PUSH | (n->rdma ? PEER_FEAT_RDMA : 0);
	k->state = L_JOINING;
	return pconn_send(&k->pc, PEER_JOIN, ++k->seq, &j.base);
}

static int send_heartbeat(struct link *k)
{
	Kvc__Peer__Heartbeat hb = KVC__PEER__HEARTBEAT__INIT;
	Kvc__Peer__NodeLoad l;

	fill_load(k->n, &l);
	hb.load = &l;
	return pconn_send(&k->pc, PEER_HEARTBEAT, ++k->seq, &hb.base);
}

static void on_drop(struct node *n, const Kvc__Peer__Drop *d);
static bool drops_some(struct node *n);

static int on_frame(struct link *k, const struct peer_hdr *h, const uint8_t *payload)
{
	struct node *n = k->n;
	ProtobufCMessage *m;
	int r;

	if (h->type == PEER_LOOKUP_RESP) {
		/* up to 4096 answers of half a dozen pieces each: one arena
		 * (malloc and free were a third of the loop's time for them) */
		r = peer_msg_decode_in(&n->answers, h->type, payload, h->len, &m);
		if (r == 0)
			remote_located(n, h->seq, (const void *) m);
		peer_arena_reset(&n->answers);
		return r;
	}
	r = peer_msg_decode(h->type, payload, h->len, &m);
	if (r < 0)
		return r;
	switch (h->type) {
	case PEER_HELLO_ACK: {
		const Kvc__Peer__HelloAck *a = (const void *) m;

		if (k->state != L_HELLO) {
			r = -EPROTO;
			break;
		}
		if (a->error) {
			log_error("master %s refused this node: %s", k->name, a->error_msg);
			r = a->error;
			break;
		}
		k->features = a->features;
		if (n->secret.len) {
			Kvc__Peer__Auth au = KVC__PEER__AUTH__INIT;
			uint8_t proof[PEER_PROOF_SIZE];

			if (!peer_proof_ok(&n->secret, k->nonce, sizeof(k->nonce), a->proof.data,
					   a->proof.len) ||
			    a->nonce.len != PEER_NONCE_SIZE) {
				log_error("master %s does not know the cluster secret", k->name);
				r = -EACCES;
				break;
			}
			peer_proof(&n->secret, a->nonce.data, a->nonce.len, proof);
			au.proof = (ProtobufCBinaryData) { .len = sizeof(proof), .data = proof };
			r = pconn_send(&k->pc, PEER_AUTH, ++k->seq, &au.base);
			if (r < 0)
				break;
		}
		r = send_join(k);
		break;
	}
	case PEER_MEMBERS: {
		Kvc__Peer__Members *ms = (void *) m;

		if (k->state != L_JOINING && k->state != L_UP) {
			r = -EPROTO;
			break;
		}
		if (ms->error) {
			log_error("master %s: %s", k->name, ms->error_msg);
			r = ms->error;
			break;
		}
		if (k->state == L_JOINING) {
			log_notice("joined the cluster at master %s as %s (%zu members)", k->name,
				   n->id, ms->n_members);
			k->state = L_UP;
			k->warned = false;
			k->resync = true; /* the directory is soft state: tell it all */
			k->cursor = 0;
		}
		if (ms->defaults && ms->defaults->client_ttl_s)
			n->ttl_s = ms->defaults->client_ttl_s;
		if (k->members)
			kvc__peer__members__free_unpacked(k->members, NULL);
		k->members = ms;
		k->heard_ms = loop_now_ms(n->loop);
		return 0; /* kept */
	}
	case PEER_DROP:
		if (!(k->features & PEER_FEAT_VERSIONS)) {
			r = -EPROTO;
			break;
		}
		on_drop(n, (const void *) m);
		break;
	default:
		r = -EPROTO;
	}
	protobuf_c_message_free_unpacked(m, NULL);
	return r;
}

/* The frames read from k's master: all of them, except that a turn takes
 * one lookup's answer (hundreds of keys, each into the directory cache,
 * and the requests that waited run again): what a turn leaves, k->more,
 * node_poll() takes next turn (with all, before the link goes down: every
 * frame).  A batch exists of 4096 keys is about nine answers, which
 * arriving together kept the loop 3.1-3.5 ms in one turn.  0, or -errno
 * (the link is beyond repair). */
static int link_frames(struct link *k, bool all)
{
	struct peer_hdr h;
	const uint8_t *payload;

	k->more = false;
	while (k->src) {
		int x = pconn_next(&k->pc, &h, &payload);

		if (x <= 0)
			return x;
		x = on_frame(k, &h, payload);
		if (x < 0)
			return x;
		if (h.type == PEER_LOOKUP_RESP && !all) {
			k->more = true;
			return 0;
		}
	}
	return 0;
}

static void link_event(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct link *k = u;
	int r = 0, x;

	(void) s;
	(void) fd;
	if (k->state == L_CONNECTING) {
		Kvc__Peer__Hello hello = KVC__PEER__HELLO__INIT;

		if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		r = net_connect_result(k->pc.fd);
		if (r < 0) {
			link_down(k, strerror(-r));
			return;
		}
		net_tune(k->pc.fd, 1);
		hello.major = PEER_MAJOR;
		hello.minor = PEER_MINOR;
		hello.features = PEER_FEAT_KNOWN;
		hello.node_id = k->n->id;
		hello.role = PEER_ROLE_NODE;
		if (k->n->secret.len) {
			peer_nonce(k->nonce);
			hello.nonce = (ProtobufCBinaryData) { .len = sizeof(k->nonce),
							      .data = k->nonce };
		}
		k->state = L_HELLO;
		r = pconn_send(&k->pc, PEER_HELLO, ++k->seq, &hello.base);
		if (r < 0) {
			link_down(k, strerror(-r));
			return;
		}
		events &= ~(uint32_t) EPOLLOUT;
	}
	if (events & EPOLLOUT)
		r = pconn_flush(&k->pc);
	if (r == 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		r = pconn_read(&k->pc);
	/* what came before an end of stream is read too, all of it (a
	 * refusal says why; answers are answers) */
	x = link_frames(k, r < 0);
	if (x < 0)
		r = x;
	if (r < 0) {
		link_down(k, r == -ECONNRESET ? "connection closed" : strerror(-r));
		return;
	}
	loop_set_io_events(k->src, EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
}

/* A name lookup under way on a thread of its own, which frees it when the
 * link has let go of it too (a lookup can outlive the node). */
struct resolve_req {
	struct net_addr addr;
	struct net_sockaddr sa;
	int res;
	int refs;  /* atomic: the thread's and the link's */
	bool done; /* atomic */
};

static void resolve_put(struct resolve_req *q)
{
	if (__atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(q);
}

static void *resolve_main(void *arg)
{
	struct resolve_req *q = arg;

	loop_helper_thread("resolve", true);
	q->res = net_resolve(&q->addr, false, &q->sa);
	__atomic_store_n(&q->done, true, __ATOMIC_RELEASE);
	resolve_put(q);
	return NULL;
}

/* Ask for k's master's address anew, unless a lookup is under way. */
static void resolve_start(struct link *k)
{
	struct resolve_req *q;
	pthread_attr_t at;
	pthread_t t;

	if (k->rq)
		return;
	q = calloc(1, sizeof(*q));
	if (!q)
		return;
	q->addr = k->addr;
	q->refs = 2;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, resolve_main, q) != 0) {
		free(q);
		q = NULL;
	}
	pthread_attr_destroy(&at);
	k->rq = q;
}

/* k's master's address into *sa: a numeric one as it is; a name's from
 * the last lookup (a new one starts each time, for the next connect), or
 * -EINPROGRESS while the first is under way, or its error. */
static int link_address(struct link *k, struct net_sockaddr *sa)
{
	int r = net_resolve(&k->addr, true, sa);

	if (r != -EAGAIN)
		return r;
	if (k->rq && __atomic_load_n(&k->rq->done, __ATOMIC_ACQUIRE)) {
		r = k->rq->res;
		if (r == 0) {
			k->sa = k->rq->sa;
			k->have_sa = true;
		}
		resolve_put(k->rq);
		k->rq = NULL;
		if (r < 0 && !k->have_sa)
			return r;
	}
	resolve_start(k); /* the answer after this one */
	if (!k->have_sa)
		return -EINPROGRESS;
	*sa = k->sa;
	return 0;
}

static void link_connect(struct link *k)
{
	struct net_sockaddr sa;
	int fd, r = link_address(k, &sa);

	if (r == 0)
		r = net_connect_sa(&sa, &fd);
	if (r < 0) {
		link_down(k, r == -EINPROGRESS ? "looking its name up" : strerror(-r));
		return;
	}
	pconn_init(&k->pc, fd, LINK_MAX_OUT);
	r = loop_add_io(k->n->loop, fd, EPOLLIN | EPOLLOUT, link_event, k, &k->src);
	if (r < 0) {
		pconn_done(&k->pc);
		link_down(k, strerror(-r));
		return;
	}
	k->state = L_CONNECTING;
}

/* ---- directory updates ---- */

struct link *node_owner(struct node *n, const void *key, size_t len)
{
	return &n->links[n->n_links == 1 ? 0 : index_hash(key, len) % n->n_links];
}

/* Queue one update for k; false if it does not fit (the queue is full or
 * cannot grow). */
static bool enqueue(struct link *k, uint8_t publish, const char *key, size_t key_len, uint64_t len,
		    uint64_t ver)
{
	struct upd_hdr h = { .publish = publish, .key_len = (uint16_t) key_len, .len = len, .ver = ver };
	size_t need = k->q_len + sizeof(h) + key_len;

	if (need > k->q_max)
		return false;
	if (need > k->q_cap) {
		size_t cap = k->q_cap ? k->q_cap : 65536;
		uint8_t *p;

		while (cap < need)
			cap *= 2;
		p = realloc(k->q, cap);
		if (!p)
			return false;
		k->q = p;
		k->q_cap = cap;
	}
	memcpy(k->q + k->q_len, &h, sizeof(h));
	memcpy(k->q + k->q_len + sizeof(h), key, key_len);
	k->q_len = need;
	return true;
}

/* A commit or removal for k's master.  While the link is down nothing is
 * queued: the re-publish after the next join covers it.  An update the
 * queue cannot take (the master is slower than the commits, for 256 MiB
 * of keys) starts the re-publish over, so every object held is published
 * again; a lost withdraw leaves a stale entry, one clean miss, as after
 * a dropped link. */
static void update(struct link *k, uint8_t publish, const char *key, size_t key_len, uint64_t len,
		   uint64_t ver)
{
	if (k->state != L_UP || enqueue(k, publish, key, key_len, len, ver))
		return;
	k->n->c.directory_overflows++;
	if (!k->resync)
		log_warn("master %s: %zu bytes of directory updates not sent yet; publishing everything again",
			 k->name, k->q_len);
	k->resync = true;
	k->cursor = 0;
}

_Static_assert(FLUSH_ENTRIES <= PEER_MAX_BATCH, "a turn's updates fit one frame's arrays");

/* Send what is queued on k, one frame per kind and batch, at most
 * FLUSH_ENTRIES updates a turn (packing 16,384 took the loop 7.7 ms in a
 * re-publish of a million objects); true if any. */
static bool flush_queue(struct link *k)
{
	Kvc__Peer__Entry *ev;
	Kvc__Peer__Entry **ep;
	ProtobufCBinaryData *wk;
	size_t off = 0, budget = FLUSH_ENTRIES; /* entries per turn */
	bool did = false;

	if (!k->q_len || k->state != L_UP)
		return false;
	ev = calloc(FLUSH_ENTRIES, sizeof(*ev));
	ep = calloc(FLUSH_ENTRIES, sizeof(*ep));
	wk = calloc(FLUSH_ENTRIES, sizeof(*wk));
	if (!ev || !ep || !wk)
		goto out;
	while (off < k->q_len && budget) {
		Kvc__Peer__Publish p = KVC__PEER__PUBLISH__INIT;
		Kvc__Peer__Withdraw w = KVC__PEER__WITHDRAW__INIT;
		struct upd_hdr h;
		bool publish;
		size_t bytes = 0;
		int r;

		memcpy(&h, k->q + off, sizeof(h));
		publish = h.publish != UPD_WITHDRAW;
		/* a run of the same kind, in order */
		while (off < k->q_len && bytes < BATCH_BYTES && budget &&
		       (publish ? p.n_entries : w.n_keys) < PEER_MAX_BATCH) {
			memcpy(&h, k->q + off, sizeof(h));
			if ((h.publish != UPD_WITHDRAW) != publish)
				break;
			if (publish) {
				size_t i = p.n_entries++;

				kvc__peer__entry__init(&ev[i]);
				ev[i].key.data = k->q + off + sizeof(h);
				ev[i].key.len = h.key_len;
				ev[i].len = h.len;
				ev[i].pending = h.publish == UPD_PENDING;
				ev[i].version = h.ver;
				ev[i].replaced = h.publish == UPD_REPLACE;
				ep[i] = &ev[i];
			} else {
				wk[w.n_keys].data = k->q + off + sizeof(h);
				wk[w.n_keys++].len = h.key_len;
			}
			bytes += h.key_len + 16;
			off += sizeof(h) + h.key_len;
			budget--;
		}
		if (publish) {
			p.entries = ep;
			r = pconn_send(&k->pc, PEER_PUBLISH, ++k->seq, &p.base);
		} else {
			w.keys = wk;
			r = pconn_send(&k->pc, PEER_WITHDRAW, ++k->seq, &w.base);
		}
		if (r < 0) {
			free(ev);
			free(ep);
			free(wk);
			link_down(k, strerror(-r));
			return true;
		}
		did = true;
	}
	memmove(k->q, k->q + off, k->q_len - off);
	k->q_len -= off;
	if (k->src)
		loop_set_io_events(k->src, EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
out:
	free(ev);
	free(ep);
	free(wk);
	return did;
}

struct resync_walk {
	struct node *n;
	unsigned link;
	bool full;
};

static void resync_one(void *u, struct object *o)
{
	struct resync_walk *w = u;

	if (w->full || !(o->flags & OBJ_COMMITTED) ||
	    node_owner(w->n, o->key, o->key_len) != &w->n->links[w->link])
		return;
	if (!enqueue(&w->n->links[w->link], UPD_PUBLISH, o->key, o->key_len, o->len, o->ver))
		w->full = true;
}

/* A slice of k's re-publish, as many objects as surely fit its queue; a
 * slice that did not fit after all (a long chain) is walked again. */
static bool resync_some(struct node *n, struct link *k)
{
	struct resync_walk w = { n, k->index, false };
	size_t most = sizeof(struct upd_hdr) + PEER_MAX_KEY;
	size_t fit = k->q_len < k->q_max / 2 ? (k->q_max - k->q_len) / most : 0;
	uint64_t from = k->cursor, to;

	if (!fit)
		return false;
	to = index_walk_some(&n->st->index, from, RESYNC_BUCKETS,
			     fit < RESYNC_OBJECTS ? fit : RESYNC_OBJECTS, resync_one, &w);
	if (w.full)
		return true; /* again from `from` once the queue has drained */
	k->cursor = to;
	if (to == UINT64_MAX) {
		k->resync = false;
		log_info("published every object to master %s", k->name);
	}
	return true;
}

/* Each turn: a slice of every re-publish, then what is queued. */
static bool node_poll(void *u)
{
	struct node *n = u;
	bool did = false;

	for (unsigned i = 0; i < n->n_links; i++) {
		struct link *k = &n->links[i];

		if (k->more && k->src) {
			int r = link_frames(k, false);

			did = true;
			if (r < 0) {
				link_down(k, strerror(-r));
				continue;
			}
		}
		if (k->resync && k->state == L_UP)
			did = resync_some(n, k) || did;
		did = flush_queue(k) || did;
	}
	if (n->n_drops)
		did = drops_some(n) || did;
	return did;
}

static void node_timer(struct loop_source *s, void *u)
{
	struct node *n = u;
	uint64_t now = loop_now_ms(n->loop), next = now + 1000;
	uint64_t period = n->ttl_s ? n->ttl_s * 1000 / 3 : 1000;

	if (period < 100)
		period = 100;
	for (unsigned i = 0; i < n->n_links; i++) {
		struct link *k = &n->links[i];

		if (k->state == L_DOWN && now >= k->retry_at)
			link_connect(k);
		else if (k->state == L_UP && now >= k->hb_at) {
			int r = send_heartbeat(k);

			if (r < 0) {
				link_down(k, strerror(-r));
				continue;
			}
			k->hb_at = now + period;
			loop_set_io_events(k->src,
					   EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
		}
		if (k->state == L_UP && k->heard_ms && now - k->heard_ms > 3 * period + 1000) {
			link_down(k, "no answer to heartbeats");
			continue;
		}
		if (k->state == L_DOWN && k->retry_at < next)
			next = k->retry_at;
		if (k->state == L_UP && k->hb_at < next)
			next = k->hb_at;
	}
	remote_expire(n, now);
	if ((n->n_rfetches || n->n_backlog || n->n_queries) && now + 50 < next)
		next = now + 50;
	if (n->pend_poll.waiters && n->pend_poll_at < next)
		next = n->pend_poll_at;
	if (n->hs_head && remote_hs_deadline(n) < next)
		next = remote_hs_deadline(n);
	loop_timer_arm(s, next > now ? next : now + 1);
}

/* ---- the remote backend ---- */

static void be_published(void *be, struct object *o)
{
	struct node *n = be;

	update(node_owner(n, o->key, o->key_len),
	       (o->flags & OBJ_REPLACED) ? UPD_REPLACE : UPD_PUBLISH, o->key, o->key_len, o->len,
	       o->ver);
	presum_add(n, o);
}

/* A put of key began here (or was announced), or ended without landing:
 * the directory tells other nodes' lookups to wait for it, or no more. */
static void be_pending(void *be, const char *key, size_t len, bool on)
{
	struct node *n = be;
	struct link *k = node_owner(n, key, len);

	if (k->features & PEER_FEAT_PENDING)
		update(k, on ? UPD_PENDING : UPD_WITHDRAW, key, len, 0, 0);
}

static void be_forget(void *be, struct object *o)
{
	struct node *n = be;

	presum_forget(n, o);
	update(node_owner(n, o->key, o->key_len), UPD_WITHDRAW, o->key, o->key_len, 0, 0);
}

/* A client removed key here (prefix: every key starting with it): the
 * masters tell every node holding a copy to drop it.  A master that is not
 * reachable now does not hear of it (counted). */
static void be_removed(void *be, const void *key, size_t len, bool prefix)
{
	struct node *n = be;
	Kvc__Peer__Remove rm = KVC__PEER__REMOVE__INIT;
	ProtobufCBinaryData k = { .len = len, .data = (uint8_t *) key };

	rm.version = store_version_next(n->st);
	if (prefix) {
		rm.prefix = k;
		rm.all = len == 0;
	} else {
		rm.keys = &k;
		rm.n_keys = 1;
	}
	for (unsigned i = 0; i < n->n_links; i++) {
		struct link *l = &n->links[i];

		if (!prefix && l != node_owner(n, key, len))
			continue;
		if (l->state != L_UP || !(l->features & PEER_FEAT_VERSIONS) ||
		    pconn_send(&l->pc, PEER_REMOVE, ++l->seq, &rm.base) < 0) {
			n->c.removals_unsent++;
			continue;
		}
		n->c.removals_sent++;
		loop_set_io_events(l->src, EPOLLIN | (pconn_wants_write(&l->pc) ? EPOLLOUT : 0));
	}
}

/* A copy here older than ver goes (views on it keep their bytes). */
static void drop_older(struct node *n, struct object *o, uint64_t ver)
{
	if (!(o->flags & OBJ_COMMITTED) || (o->flags & OBJ_DEAD) || o->ver >= ver)
		return;
	object_drop(n->st, o);
	n->c.copies_dropped++;
}

static void drop_matching(void *u, struct object *o)
{
	struct drop_walk *w = ((struct drop_walk **) u)[0];
	struct node *n = ((struct node **) u)[1];

	if (o->key_len >= w->len && !memcmp(o->key, w->prefix, w->len))
		drop_older(n, o, w->ver);
}

/* A slice of each removal by prefix under way; true if any. */
static bool drops_some(struct node *n)
{
	for (unsigned i = 0; i < n->n_drops;) {
		struct drop_walk *w = &n->drops[i];
		void *u[2] = { w, n };

		w->cursor = index_walk_some(&n->st->index, w->cursor, 16384, 256, drop_matching, u);
		if (w->cursor == UINT64_MAX)
			n->drops[i] = n->drops[--n->n_drops];
		else
			i++;
	}
	return n->n_drops > 0;
}

/* A master's Drop: these keys' copies (or those under a prefix) older than
 * its version go. */
static void on_drop(struct node *n, const Kvc__Peer__Drop *d)
{
	store_version_seen(n->st, d->version);
	for (size_t i = 0; i < d->n_keys; i++) {
		const ProtobufCBinaryData *k = &d->keys[i];
		struct object *o = index_find(&n->st->index, k->data, k->len,
					      index_hash(k->data, k->len));

		if (o)
			drop_older(n, o, d->version);
	}
	if (d->n_keys)
		return;
	if (n->n_drops == MAX_DROP_WALKS) {
		/* the oldest walk takes the newer prefix's place too: all */
		n->drops[0].len = 0;
		n->drops[0].cursor = 0;
		if (d->version > n->drops[0].ver)
			n->drops[0].ver = d->version;
		return;
	}
	n->drops[n->n_drops] = (struct drop_walk) { .len = d->all ? 0 : d->prefix.len,
						    .ver = d->version };
	if (n->drops[n->n_drops].len)
		memcpy(n->drops[n->n_drops].prefix, d->prefix.data, n->drops[n->n_drops].len);
	n->n_drops++;
}

static const char *state_name(uint32_t s)
{
	return s == PEER_STATE_UP ? "up" : s == PEER_STATE_SUSPECT ? "suspect" : "down";
}

static int be_describe(void *be, struct cluster_view *v)
{
	struct node *n = be;
	const Kvc__Peer__Members *ms = NULL;

	memset(v, 0, sizeof(*v));
	v->self = n->id;
	for (unsigned i = 0; i < n->n_links && i < 8; i++) {
		v->masters[v->n_masters++] = n->links[i].name;
		if (n->links[i].state == L_UP) {
			v->masters_up++;
			if (!ms)
				ms = n->links[i].members;
		}
	}
	if (!ms)
		return 0;
	for (size_t i = 0; i < ms->n_members && v->n_members < CLUSTER_VIEW_MAX; i++) {
		const Kvc__Peer__Member *m = ms->members[i];
		struct cluster_member *x = &v->members[v->n_members++];

		x->id = m->node_id;
		x->address = m->address;
		x->state = state_name(m->state);
		/* what the two of them use: RDMA needs it at both ends */
		x->transport = !strcmp(m->node_id, n->id) ? "local" :
			       n->rdma && m->transport && !strncmp(m->transport, "rdma", 4) ?
			       m->transport : "tcp";
		if (m->load) {
			x->capacity = m->load->capacity;
			x->used = m->load->used;
			x->objects = m->load->objects;
		}
	}
	return 0;
}

void node_fetch_all(struct node *n, const char *const *keys, const uint64_t *lens, size_t k,
		    const char *address, void (*tick)(void *u), void *u, bool *got)
{
	remote_fetch_all(n, keys, lens, k, address, tick, u, got);
}

void node_feed(struct node *n, int fd)
{
	remote_feed(n, fd);
}

struct peer_stat *node_peer_stat(struct node *n, const char *addr)
{
	for (unsigned i = 0; i < n->n_peer_stats; i++)
		if (strcmp(n->peer_stats[i].addr, addr) == 0)
			return &n->peer_stats[i];
	if (n->n_peer_stats == MAX_PEER_STATS)
		return NULL;
	struct peer_stat *p = &n->peer_stats[n->n_peer_stats++];
	*p = (struct peer_stat) { 0 };
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	return p;
}

static void be_stats(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	struct node *n = be;

	emit(u, "remote_hits", n->c.remote_hits);
	emit(u, "removals_sent", n->c.removals_sent);
	emit(u, "removals_unsent", n->c.removals_unsent);
	emit(u, "copies_dropped", n->c.copies_dropped);
	emit(u, "remote_misses", n->c.remote_misses);
	emit(u, "remote_errors", n->c.remote_errors);
	emit(u, "remote_corrupt", n->c.remote_corrupt);
	emit(u, "remote_bytes_in", n->c.remote_bytes_in);
	emit(u, "remote_bytes_out", n->c.remote_bytes_out);
	emit(u, "remote_served", n->c.served);
	emit(u, "remote_serve_errors", n->c.serve_errors);
	emit(u, "remote_served_summed", n->c.served_summed);
	emit(u, "remote_fetching", n->n_rfetches);
	emit(u, "remote_fetch_waiting", n->n_backlog);
	emit(u, "remote_fetch_waited", n->c.fetch_waited);
	emit(u, "remote_fetched_ahead", __atomic_load_n(&n->c.fetch_ahead, __ATOMIC_RELAXED));
	emit(u, "remote_lookup_waited", n->c.lookup_waited);
	emit(u, "remote_lookup_waits", n->c.pending_waits);
	emit(u, "remote_sick_skips", n->c.sick_skips);
	emit(u, "peer_handshake_timeouts", n->c.hs_timeouts);
	emit(u, "remote_peer_connections", n->n_serving);
	emit(u, "pushes", n->c.pushes);
	emit(u, "push_errors", n->c.push_errors);
	emit(u, "pushes_received", n->c.pushes_received);
	emit(u, "pushes_received_eager", n->c.pushes_eager);
	emit(u, "pushes_refused", n->c.pushes_refused);
	emit(u, "pushes_ahead", __atomic_load_n(&n->c.pushes_ahead, __ATOMIC_RELAXED));
	emit(u, "master_drops", n->c.master_drops);
	emit(u, "directory_overflows", n->c.directory_overflows);
	presum_stats(n, emit, u);
	emit(u, "tcp_bytes_in", n->c.tcp_bytes_in);
	emit(u, "tcp_bytes_out", n->c.tcp_bytes_out);
	emit(u, "rdma_bytes_in", n->c.rdma_bytes_in);
	emit(u, "rdma_bytes_out", n->c.rdma_bytes_out);
	if (n->rdma) {
		struct rdma_stats rs;

		rdma_get_stats(n->rdma, &rs);
		emit(u, "rdma_gets", rs.gets);
		emit(u, "rdma_get_bytes", rs.get_bytes);
		emit(u, "rdma_puts", rs.puts);
		emit(u, "rdma_put_bytes", rs.put_bytes);
		emit(u, "rdma_errors", rs.errors);
		emit(u, "rdma_timeouts", rs.timeouts);
		emit(u, "rdma_fallbacks", n->c.rdma_fallbacks);
	}
	for (unsigned i = 0; i < n->n_peer_stats; i++) {
		const struct peer_stat *p = &n->peer_stats[i];
		const struct {
			const char *what;
			uint64_t v;
		} f[] = {
			{ "fetches", p->fetches }, { "fetch_bytes", p->fetch_bytes },
			{ "fetch_errors", p->fetch_errors }, { "pushes", p->pushes },
			{ "push_bytes", p->push_bytes }, { "push_errors", p->push_errors },
		};

		/* the names live in the node: emit() copies them at once */
		for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
			snprintf(n->stat_name, sizeof(n->stat_name), "peer.%s.%s", p->addr, f[k].what);
			emit(u, n->stat_name, f[k].v);
		}
	}
}

static const struct backend_ops remote_ops = {
	.name = "remote",
	.forget = be_forget,
	.published = be_published,
	.pending = be_pending,
	.removed = be_removed,
	.locate = remote_locate,
	.where = remote_where,
	.holders = remote_holders,
	.push = remote_push,
	.stats = be_stats,
	.describe = be_describe,
};

/* ---- set-up ---- */

static void on_peer(struct loop_source *s, int fd, uint32_t events, void *u)
{
	(void) s;
	(void) events;
	for (;;) {
		int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (c < 0)
			return;
		remote_accept(u, c);
	}
}

int node_lookup(struct link *k, const void *key, size_t len, uint32_t *ret_seq)
{
	ProtobufCBinaryData b = { .len = len, .data = (uint8_t *) key };

	return node_lookup_many(k, &b, 1, ret_seq);
}

int node_lookup_many(struct link *k, ProtobufCBinaryData *keys, size_t n, uint32_t *ret_seq)
{
	Kvc__Peer__Lookup q = KVC__PEER__LOOKUP__INIT;
	int r;

	if (k->state != L_UP)
		return -ENOTCONN;
	q.n_keys = n;
	q.keys = keys;
	r = pconn_send(&k->pc, PEER_LOOKUP, ++k->seq, &q.base);
	if (r < 0)
		return r;
	*ret_seq = k->seq;
	loop_set_io_events(k->src, EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
	return 0;
}

/*
 * --protocol: tcp; rdma (an active verbs device, or a clear error); auto
 * (rdma where a device is active, else tcp).  Either way each pair of
 * nodes uses RDMA only when both ends have it, per peer, so a mixed
 * cluster works.  KVCACHE_TEST_RDMA_OVER_TCP=1 (tests only) runs the
 * RDMA path on UCX's TCP transport, as if a device were there.
 */
/* The interface that holds host's IPv4 address, or "". */
static void ifname_of(const char *host, char *out, size_t cap)
{
	struct ifaddrs *ifs, *i;
	struct in_addr a;

	out[0] = '\0';
	if (inet_pton(AF_INET, host, &a) != 1 || getifaddrs(&ifs) < 0)
		return;
	for (i = ifs; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *) i->ifa_addr)->sin_addr.s_addr == a.s_addr) {
			snprintf(out, cap, "%s", i->ifa_name);
			break;
		}
	freeifaddrs(ifs);
}

/* QUEUE_MAX; tests make it small to see the queue overflow */
static size_t queue_max(void)
{
	const char *t = getenv("KVCACHE_TEST_DIRECTORY_QUEUE");
	unsigned long v = t ? strtoul(t, NULL, 10) : 0;

	return v >= 1024 && v < QUEUE_MAX ? v : QUEUE_MAX;
}

static int pick_transport(struct node *n, const struct config *cfg, const char *host, char *err,
			  size_t err_len);

static int choose_transport(struct node *n, const struct config *cfg, const char *host, char *err,
			    size_t err_len)
{
	int r = pick_transport(n, cfg, host, err, err_len);

	if (r == 0 && cfg->protocol_asked[0])
		log_warn("protocol \"%s\" is not one kvcache drives: it runs as auto, and auto "
			 "chose %s", cfg->protocol_asked, n->transport);
	return r;
}

static int pick_transport(struct node *n, const struct config *cfg, const char *host, char *err,
			  size_t err_len)
{
	const char *t = getenv("KVCACHE_TEST_RDMA_OVER_TCP");
	char ifname[64];
	struct rdma_opts o = { .devices = cfg->device_name, .over_tcp = t && !strcmp(t, "1"),
			       .tcp_ifname = ifname };
	bool want = !strcmp(cfg->protocol, "rdma");
	char why[RDMA_ERR_MAX];
	int r;

	snprintf(n->transport, sizeof(n->transport), "tcp");
	if (!strcmp(cfg->protocol, "tcp"))
		return 0;
	if (!want && (!rdma_built() || (!o.over_tcp && rdma_active_devices(o.devices, NULL, 0) <= 0))) {
		log_info("no active RDMA device%s: data moves over tcp",
			 rdma_built() ? "" : " (built without RDMA)");
		return 0;
	}
	ifname_of(host, ifname, sizeof(ifname));
	if (o.over_tcp)
		log_warn("KVCACHE_TEST_RDMA_OVER_TCP: the RDMA path runs over UCX's tcp transport%s%s",
			 ifname[0] ? " on " : "", ifname);
	r = rdma_new(&o, &n->rdma, why);
	if (r < 0 && want) {
		snprintf(err, err_len, "--protocol rdma: %s", why);
		return -EINVAL;
	}
	if (r < 0) {
		log_warn("RDMA unavailable (%s): data moves over tcp", why);
		n->rdma = NULL;
		return 0;
	}
	for (unsigned i = 0; i < n->st->n_tiers; i++) {
		struct tier *x = &n->st->tiers[i];

		r = rdma_register(n->rdma, i, x->seg.base, x->seg.size);
		if (r < 0) {
			rdma_free(n->rdma);
			n->rdma = NULL;
			if (want) {
				snprintf(err, err_len, "--protocol rdma: registering the %s tier: %s",
					 x->name, strerror(-r));
				return -EINVAL;
			}
			log_warn("RDMA: registering the %s tier failed (%s): data moves over tcp",
				 x->name, strerror(-r));
			return 0;
		}
	}
	snprintf(n->transport, sizeof(n->transport), "rdma/%s", rdma_device(n->rdma));
	log_notice("data moves by RDMA (%s) with peers that have it, over tcp with the others",
		   rdma_device(n->rdma));
	return 0;
}

int node_setup(struct store *st, const struct config *cfg, struct node **ret, char *err,
	       size_t err_len)
{
	struct net_addr listen = { .port = DEFAULT_PEER_PORT };
	char list[sizeof(cfg->master_server_address)], *save = NULL, *tok;
	struct node *n;
	uint16_t port;
	int r;

	*ret = NULL;
	if (!cfg->master_server_address[0]) {
		if (cfg->protocol_asked[0])
			log_warn("protocol \"%s\" is not one kvcache drives: it runs as auto "
				 "(no --master: nothing moves between nodes)", cfg->protocol_asked);
		return 0;
	}
	if (strncmp(cfg->metadata_server, "etcd://", 7) == 0) {
		snprintf(err, err_len, "--metadata-server %s: etcd is not supported yet; use "
			 "P2PHANDSHAKE (membership through the master)", cfg->metadata_server);
		return -EINVAL;
	}
	if (strcasecmp(cfg->metadata_server, "P2PHANDSHAKE") != 0) {
		snprintf(err, err_len, "--metadata-server %s: expected P2PHANDSHAKE or etcd://HOST:PORT",
			 cfg->metadata_server);
		return -EINVAL;
	}
	/* Mooncake's local_hostname is where the node is reached: listen there
	 * unless told otherwise */
	if (!cfg->listen[0] && cfg->local_hostname[0])
		snprintf(listen.host, sizeof(listen.host), "%s", cfg->local_hostname);
	if (cfg->listen[0] && net_addr_parse(cfg->listen, DEFAULT_PEER_PORT, &listen) < 0) {
		snprintf(err, err_len, "--listen %s: expected [HOST:]PORT", cfg->listen);
		return -EINVAL;
	}
	if (!net_addr_is_loopback(&listen) && !cfg->insecure && !cfg->secret_file[0]) {
		snprintf(err, err_len, "refusing to serve peers on %s without --cluster-secret-file "
			 "(or --insecure on a trusted network)", listen.host[0] ? listen.host : "every address");
		return -EINVAL;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->st = st;
	peer_arena_init(&n->answers);
	n->cfg = cfg;
	n->loop = st->loop;
	n->listen_fd = -1;
	n->ttl_s = 10;
	n->timeout_ms = cfg->remote_timeout_ms;
	n->streams = cfg->data_streams;

	if (cfg->secret_file[0]) {
		r = peer_secret_load(cfg->secret_file, &n->secret, err, err_len);
		if (r < 0) {
			free(n);
			return -EINVAL;
		}
	}
	if (getrandom(&n->generation, sizeof(n->generation), 0) != sizeof(n->generation))
		n->generation = (uint64_t) getpid() << 32 ^ (uint64_t) loop_now_ms(st->loop);
	snprintf(list, sizeof(list), "%s", cfg->master_server_address);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct link *k;

		if (n->n_links == MAX_MASTERS) {
			snprintf(err, err_len, "--master: at most %d masters", MAX_MASTERS);
			r = -EINVAL;
			goto fail;
		}
		k = &n->links[n->n_links];
		if (net_addr_parse(tok, DEFAULT_MASTER_PORT, &k->addr) < 0 || !k->addr.host[0]) {
			snprintf(err, err_len, "--master: '%s' is not HOST:PORT", tok);
			r = -EINVAL;
			goto fail;
		}
		k->n = n;
		k->index = n->n_links++;
		k->pc.fd = -1;
		k->q_max = queue_max();
		net_addr_format(&k->addr, k->name, sizeof(k->name));
	}
	if (!n->n_links) {
		snprintf(err, err_len, "--master: no address given");
		r = -EINVAL;
		goto fail;
	}
	r = net_listen(&listen, &n->listen_fd);
	if (r < 0) {
		snprintf(err, err_len, "cannot serve peers on %s:%u: %s",
			 listen.host[0] ? listen.host : "*", listen.port, strerror(-r));
		goto fail;
	}
	net_local_port(n->listen_fd, &port);
	{
		struct net_addr adv = { .port = port };
		char host[NET_HOST_MAX];

		if (cfg->local_hostname[0])
			snprintf(adv.host, sizeof(adv.host), "%s", cfg->local_hostname);
		else if (listen.host[0])
			snprintf(adv.host, sizeof(adv.host), "%s", listen.host);
		else if (gethostname(host, sizeof(host)) == 0)
			snprintf(adv.host, sizeof(adv.host), "%.*s", (int) sizeof(adv.host) - 1, host);
		net_addr_format(&adv, n->address, sizeof(n->address));
	}
	snprintf(n->id, sizeof(n->id), "%s", cfg->node_id[0] ? cfg->node_id : n->address);
	r = choose_transport(n, cfg, listen.host, err, err_len);
	if (r < 0)
		goto fail;
	r = loop_add_io(n->loop, n->listen_fd, EPOLLIN, on_peer, n, &n->listen_src);
	if (r < 0)
		goto fail_msg;
	r = loop_add_poller(n->loop, node_poll, NULL, n, &n->poller);
	if (r < 0)
		goto fail_msg;
	r = loop_add_timer(n->loop, node_timer, n, &n->timer);
	if (r < 0)
		goto fail_msg;
	r = remote_setup(n);
	if (r == 0)
		r = presum_setup(n);
	if (r < 0)
		goto fail_msg;
	for (unsigned i = 0; i < n->n_links; i++)
		link_connect(&n->links[i]);
	loop_timer_arm(n->timer, loop_now_ms(n->loop) + 1);
	st->remote = (struct backend) { &remote_ops, n };
	log_notice("node %s: serving peers at %s, %u master(s) from %s", n->id, n->address,
		   n->n_links, cfg->master_server_address);
	*ret = n;
	return 0;
fail_msg:
	snprintf(err, err_len, "cannot set up the cluster: %s", strerror(-r));
fail:
	node_teardown(n);
	return r;
}

void node_teardown(struct node *n)
{
	if (!n)
		return;
	presum_teardown(n);
	remote_teardown(n);
	if (n->st->remote.be == n)
		n->st->remote = (struct backend) { 0 };
	for (unsigned i = 0; i < n->n_links; i++) {
		struct link *k = &n->links[i];

		loop_source_free(k->src);
		if (k->pc.fd >= 0)
			pconn_done(&k->pc);
		free(k->q);
		if (k->members)
			kvc__peer__members__free_unpacked(k->members, NULL);
		if (k->rq)
			resolve_put(k->rq); /* a lookup still under way frees it */
	}
	loop_source_free(n->listen_src);
	loop_source_free(n->poller);
	loop_source_free(n->timer);
	if (n->listen_fd >= 0)
		close(n->listen_fd);
	rdma_free(n->rdma); /* after the data threads: none is in a transfer */
	peer_arena_done(&n->answers);
	explicit_bzero(&n->secret, sizeof(n->secret));
	free(n);
}
