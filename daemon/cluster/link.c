/* SPDX-License-Identifier: MIT */
/*
 * The node's links to its masters.
 *
 * One link per master, every socket non-blocking on the loop.  A link
 * connects (a master named by host name is looked up on a thread of its
 * own), says Hello, joins, and then heartbeats every third of the master's
 * client_ttl; each answer carries the member list kvcachectl cluster
 * shows.  Commits and removals become directory updates queued on the link
 * of the master that owns the key (key hash modulo masters) and sent in
 * batches each turn, so a put never waits for the network.  A link that
 * (re)joins re-publishes everything this node holds, walking the index a
 * bounded slice per turn: the directory is soft state.  Answers to lookups
 * and a master's Drops go to the node's callbacks (lookup_answered,
 * dropped).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "link.h"
#include "kvc-config.h"
#include "log.h"
#include "net.h"
#include "node-private.h"
#include "peer-conn.h"
#include "view.h"

#define LOG_TOPIC "cluster"

void link_down(struct link *k, const char *why)
{
	bool was_up = k->state == L_UP;

	if (k->state == L_UP)
		k->n->links.c.master_drops++;
	if ((k->state == L_UP || !k->warned) && k->etcd[0])
		log_warn("master %s: %s; following etcd's master view", k->name, why);
	else if (k->state == L_UP || !k->warned)
		log_warn("master %s: %s; retrying every %d ms", k->name, why, RETRY_MS);
	k->warned = true;
	loop_source_free(k->src);
	k->src = NULL;
	pconn_done(&k->pc);
	k->state = L_DOWN;
	if (was_up && k->n->links.lost) /* what it was asked misses now, not at its deadline */
		k->n->links.lost(k->n, k);
	k->retry_at = loop_now(k->n->loop) + RETRY;
	if (k->etcd[0] && was_up) /* a leader that let go: another may lead already */
		k->retry_at = loop_now(k->n->loop) + ETCD_RETRY;
	k->q_len = 0; /* what it missed comes with the next re-publish */
	k->resync = false;
	k->more = false;
	loop_timer_arm_by(k->n->timer, k->retry_at);
}

static void fill_load(struct node *n, Kvc__Peer__NodeLoad *l)
{
	uint64_t capacity, used, objects;

	kvc__peer__node_load__init(l);
	store_load(n->st, &capacity, &used, &objects);
	l->capacity = capacity;
	l->used = used;
	l->objects = objects;
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
	j.version = (char *) KVC_VERSION;
	j.features = PEER_FEAT_TCP | PEER_FEAT_EAGER_PUSH | (n->rdma ? PEER_FEAT_RDMA : 0);
	k->state = L_JOINING;
	return pconn_send(&k->pc, PEER_JOIN, ++k->seq, &j.base);
}

int link_heartbeat(struct link *k)
{
	Kvc__Peer__Heartbeat hb = KVC__PEER__HEARTBEAT__INIT;
	Kvc__Peer__NodeLoad l;

	fill_load(k->n, &l);
	hb.load = &l;
	return pconn_send(&k->pc, PEER_HEARTBEAT, ++k->seq, &hb.base);
}


static int on_frame(struct link *k, const struct peer_hdr *h, const uint8_t *payload)
{
	struct node *n = k->n;
	ProtobufCMessage *m;
	int r;

	if (h->type == PEER_LOOKUP_RESP) {
		/* up to 4096 answers of half a dozen pieces each: one arena
		 * (malloc and free were a third of the loop's time for them) */
		r = peer_msg_decode_in(&n->links.answers, h->type, payload, h->len, &m);
		if (r == 0)
			n->links.lookup_answered(n, k, h->seq, (const void *) m);
		peer_arena_reset(&n->links.answers);
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
		k->term = a->term;
		if (k->etcd[0] && a->term < k->view_term) {
			log_warn("master %s is of term %llu, the view's is %llu: not the leader",
				 k->leader, (unsigned long long) a->term,
				 (unsigned long long) k->view_term);
			r = -ESTALE;
			break;
		}
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
		k->heard = loop_now(n->loop);
		if (n->links.heard)
			n->links.heard(n, k);
		return 0; /* kept */
	}
	case PEER_DROP:
		if (!(k->features & PEER_FEAT_VERSIONS)) {
			r = -EPROTO;
			break;
		}
		n->links.dropped(n, (const void *) m);
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
int link_frames(struct link *k, bool all)
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
		net_congestion(k->pc.fd, k->n->cfg->tcp_congestion);
		hello.major = peer_major;
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
	if (x == -EPROTONOSUPPORT) {
		k->n->links.c.version_refused++;
		log_error("master %s speaks peer protocol %u, this node %u: not compatible; "
			  "upgrade one of them", k->name, k->pc.their_major, peer_major);
	}
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

	loop_helper_thread("resolve", LOOP_HELPER_BATCH);
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
/* The answer of the name lookup under way, if it is done (its address
 * kept): 0 or its error; -EINPROGRESS while it runs or when there is none. */
static int take_lookup(struct link *k)
{
	int r;

	if (!k->rq || !__atomic_load_n(&k->rq->done, __ATOMIC_ACQUIRE))
		return -EINPROGRESS;
	r = k->rq->res;
	if (r == 0) {
		k->sa = k->rq->sa;
		k->have_sa = true;
	}
	resolve_put(k->rq);
	k->rq = NULL;
	return r;
}

/* An etcd link: the newest view its follower read, kept; true when it
 * names another leader than before. */
static bool take_view(struct link *k)
{
	struct master_view *v = view_take(k->vf);
	bool changed = false;

	if (!v)
		return false;
	k->view_res = v->res;
	if (v->res == 0) {
		changed = strcmp(k->leader, v->leader) || k->view_term != v->term;
		if (changed)
			log_notice("master %s: the leader is %s (term %llu)", k->name, v->leader,
				   (unsigned long long) v->term);
		k->sa = v->sa;
		k->have_sa = true;
		snprintf(k->leader, sizeof(k->leader), "%s", v->leader);
		k->view_term = v->term;
	} else {
		k->have_sa = false; /* nobody to connect to until it names one */
	}
	free(v);
	return changed;
}

usec_t link_check_view(struct link *k)
{
	usec_t now = loop_now(k->n->loop);

	if (!k->etcd[0])
		return 0;
	if (take_view(k) && k->state == L_DOWN && k->retry_at > now) {
		k->retry_at = now; /* a new leader: connect now */
		return now;
	}
	if (k->state == L_UP && k->view_res == 0 && k->view_term && k->view_term != k->term) {
		/* another leads now (this one was stopped, or cut off): its
		 * lease ended, and it cannot answer for the directory */
		link_down(k, "etcd's master view names another leader");
		return k->retry_at;
	}
	return now + ETCD_RETRY; /* its follower's word is looked at this often */
}

/* k's master's address into *sa: a numeric one as it is; a name's from
 * the last lookup (a new one starts each time, for the next connect), or
 * -EINPROGRESS while the first is under way, or its error; an etcd link's
 * from the view its follower read last. */
static int link_address(struct link *k, struct net_sockaddr *sa)
{
	int r;

	if (k->etcd[0]) {
		take_view(k);
		if (!k->have_sa)
			return k->view_res < 0 ? k->view_res : -EINPROGRESS;
		*sa = k->sa;
		return 0;
	}
	r = net_resolve(&k->addr, true, sa);
	if (r != -EAGAIN)
		return r;
	r = take_lookup(k);
	if (r < 0 && r != -EINPROGRESS && !k->have_sa)
		return r;
	resolve_start(k); /* the answer after this one */
	if (!k->have_sa)
		return -EINPROGRESS;
	*sa = k->sa;
	return 0;
}

void link_connect(struct link *k)
{
	struct net_sockaddr sa;
	int fd, r = link_address(k, &sa);

	if (r == 0)
		r = net_connect_sa(&sa, &fd);
	if (r == -EINPROGRESS) {
		/* nothing to say yet: a view comes in a millisecond or two,
		 * a name may take longer */
		k->retry_at = loop_now(k->n->loop) + (k->etcd[0] ? ETCD_RETRY : RETRY);
		loop_timer_arm_by(k->n->timer, k->retry_at);
		return;
	}
	if (r < 0) {
		link_down(k, r == -EHOSTUNREACH && k->etcd[0] ? "no leader in etcd's master view"
							      : strerror(-r));
		if (r == -EHOSTUNREACH && k->etcd[0]) {
			/* an election is under way: look again soon */
			k->retry_at = loop_now(k->n->loop) + ETCD_ELECTION_RETRY;
			loop_timer_arm_by(k->n->timer, k->retry_at);
		}
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
	return &n->links.l[n->links.n == 1 ? 0 : store_key_hash(key, len) % n->links.n];
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
void link_update(struct link *k, uint8_t publish, const char *key, size_t key_len, uint64_t len,
		   uint64_t ver)
{
	if (k->state != L_UP || enqueue(k, publish, key, key_len, len, ver))
		return;
	k->n->links.c.directory_overflows++;
	if (!k->resync)
		log_warn("master %s: %zu bytes of directory updates not sent yet; publishing everything again",
			 k->name, k->q_len);
	k->resync = true;
	k->cursor = 0;
}

struct flush_arrays {
	Kvc__Peer__Entry ev[FLUSH_ENTRIES];
	Kvc__Peer__Entry *ep[FLUSH_ENTRIES];
	ProtobufCBinaryData wk[FLUSH_ENTRIES];
};

_Static_assert(FLUSH_ENTRIES <= PEER_MAX_BATCH, "a turn's updates fit one frame's arrays");

/* Send what is queued on k, one frame per kind and batch, at most
 * FLUSH_ENTRIES updates a turn (packing 16,384 took the loop 7.7 ms in a
 * re-publish of a million objects); true if any. */
bool link_flush(struct link *k)
{
	Kvc__Peer__Entry *ev;
	Kvc__Peer__Entry **ep;
	ProtobufCBinaryData *wk;
	size_t off = 0, budget = FLUSH_ENTRIES; /* entries per turn */
	bool did = false;
	Kvc__Peer__NodeLoad load;

	if (!k->q_len || k->state != L_UP)
		return false;
	/* the load goes with the updates that change it: the master's view of
	 * it is not a heartbeat old (kvcachectl cluster) */
	fill_load(k->n, &load);
	if (!k->fa && !(k->fa = malloc(sizeof(*k->fa))))
		return false; /* sent in a later turn */
	ev = k->fa->ev;
	ep = k->fa->ep;
	wk = k->fa->wk;
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
			p.load = &load;
			r = pconn_send(&k->pc, PEER_PUBLISH, ++k->seq, &p.base);
		} else {
			w.keys = wk;
			w.load = &load;
			r = pconn_send(&k->pc, PEER_WITHDRAW, ++k->seq, &w.base);
		}
		if (r < 0) {
			link_down(k, strerror(-r));
			return true;
		}
		did = true;
	}
	memmove(k->q, k->q + off, k->q_len - off);
	k->q_len -= off;
	if (k->src)
		loop_set_io_events(k->src, EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
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
	    node_owner(w->n, o->key, o->key_len) != &w->n->links.l[w->link])
		return;
	if (!enqueue(&w->n->links.l[w->link], UPD_PUBLISH, o->key, o->key_len, o->len, o->ver))
		w->full = true;
}

/* A slice of k's re-publish, as many objects as surely fit its queue; a
 * slice that did not fit after all (a long chain) is walked again. */
bool link_resync_some(struct node *n, struct link *k)
{
	struct resync_walk w = { n, k->index, false };
	size_t most = sizeof(struct upd_hdr) + PEER_MAX_KEY;
	size_t fit = k->q_len < k->q_max / 2 ? (k->q_max - k->q_len) / most : 0;
	uint64_t from = k->cursor, to;

	if (!fit)
		return false;
	to = store_walk(n->st, from, RESYNC_BUCKETS, fit < RESYNC_OBJECTS ? fit : RESYNC_OBJECTS,
			resync_one, &w);
	if (w.full)
		return true; /* again from `from` once the queue has drained */
	k->cursor = to;
	if (to == UINT64_MAX) {
		k->resync = false;
		log_info("published every object to master %s", k->name);
	}
	return true;
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

/* QUEUE_MAX; tests make it small to see the queue overflow */
size_t link_queue_max(const struct config *cfg)
{
	unsigned long v = cfg->test.directory_queue;

	return v >= 1024 && v < QUEUE_MAX ? v : QUEUE_MAX;
}

void link_done(struct link *k)
{
	loop_source_free(k->src);
	if (k->pc.fd >= 0)
		pconn_done(&k->pc);
	free(k->q);
	free(k->fa);
	k->fa = NULL;
	if (k->members)
		kvc__peer__members__free_unpacked(k->members, NULL);
	if (k->rq)
		resolve_put(k->rq); /* a lookup still under way frees it */
	view_unfollow(k->vf);
	k->vf = NULL;
}

void link_feed(struct link *k, int fd)
{
	int r;

	if (k->src || k->state != L_DOWN)
		link_down(k, "a fed connection takes its place");
	pconn_init(&k->pc, fd, LINK_MAX_OUT);
	k->state = L_HELLO; /* as if Hello had gone out */
	if (loop_add_io(k->n->loop, fd, EPOLLIN, link_event, k, &k->src) < 0) {
		pconn_done(&k->pc);
		k->state = L_DOWN;
		return;
	}
	pconn_read(&k->pc); /* to the end: what came before it counts */
	r = link_frames(k, true);
	if (r == 0 && k->src)
		link_down(k, "the fed connection ended");
	else if (k->src)
		link_down(k, "the fed connection broke a rule");
}

