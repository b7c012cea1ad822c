/* SPDX-License-Identifier: MIT */
/*
 * The node's side of the cluster: the store's remote backend (commits,
 * removals and pending puts become directory updates on the links,
 * link.c; a master's Drops walk this node's objects), the turn and the
 * timer that drive the links, the fetches and the serving connections,
 * and the set-up that wires the parts together (choosing the transport,
 * the peer port).
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

#include "accept.h"
#include "log.h"
#include "net.h"
#include "node.h"
#include "node-private.h"
#include "link.h"
#include "members.h"
#include "view.h"
#include "xfer.h"
#include "peer-conn.h"

#define LOG_TOPIC "cluster"

static const struct remote_ops remote_ops;

static void on_drop(struct node *n, const Kvc__Peer__Drop *d);
static bool drops_some(struct node *n);

/* Each turn: a slice of every re-publish, then what is queued. */
static bool node_poll(void *u)
{
	struct node *n = u;
	bool did = false;

	for (unsigned i = 0; i < n->links.n; i++) {
		struct link *k = &n->links.l[i];

		if (k->more && k->src) {
			int r = link_frames(k, false);

			did = true;
			if (r < 0) {
				link_down(k, strerror(-r));
				continue;
			}
		}
		if (k->resync && k->state == L_UP)
			did = link_resync_some(n, k) || did;
		did = link_flush(k) || did;
	}
	if (n->n_drops)
		did = drops_some(n) || did;
	return did;
}

/*
 * kvcachectl cluster: the other members' loads as the masters know them
 * now.  Each heartbeat's answer carries them, but a node heartbeats every
 * third of the TTL, so the list it last heard is seconds old: a node that
 * had just stored 292 blocks showed 0 on its neighbour.  A node's
 * directory updates carry its load (link_flush()), and a cluster request
 * sends a heartbeat to each master and waits for the answers (one round
 * trip; at most --remote-timeout-ms), joining those already asked for.
 */

static void loads_over(struct node *n)
{
	for (unsigned i = 0; i < n->links.n; i++)
		n->links.l[i].loads_asked = false;
	n->loads.waiting = false;
	fetch_wake(&n->loads.f, 0); /* each asks again, and is answered */
}

/* k's answer came, or k is gone. */
static void loads_heard(struct node *n, struct link *k)
{
	if (!k->loads_asked)
		return;
	k->loads_asked = false;
	for (unsigned i = 0; i < n->links.n; i++)
		if (n->links.l[i].loads_asked)
			return;
	loads_over(n);
}

static void link_lost(struct node *n, struct link *k)
{
	remote_link_lost(n, k);
	loads_heard(n, k);
}

static int be_refresh(void *be, struct fetch **ret)
{
	struct node *n = be;
	bool asked = false;

	for (unsigned i = 0; i < n->links.n && !n->loads.waiting; i++) {
		struct link *k = &n->links.l[i];

		if (k->state != L_UP || link_heartbeat(k) < 0)
			continue; /* (a broken link: the timer's heartbeat finds it) */
		loop_set_io_events(k->src, EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
		k->loads_asked = asked = true;
	}
	if (asked) {
		n->loads.waiting = true;
		n->loads.f.far = true;
		n->loads.deadline = loop_now(n->loop) + n->timeout;
		loop_timer_arm_by(n->timer, n->loads.deadline);
	}
	if (!n->loads.waiting)
		return 0;
	*ret = &n->loads.f;
	return -EINPROGRESS;
}

static void node_timer(struct loop_source *s, void *u)
{
	struct node *n = u;
	usec_t now = loop_now(n->loop), next = now + USEC_PER_SEC;
	usec_t period = n->ttl_s ? n->ttl_s * USEC_PER_SEC / 3 : USEC_PER_SEC;

	if (period < 100 * USEC_PER_MSEC)
		period = 100 * USEC_PER_MSEC;
	for (unsigned i = 0; i < n->links.n; i++) {
		struct link *k = &n->links.l[i];

		if (k->state == L_DOWN && now >= k->retry_at)
			link_connect(k);
		else if (k->state == L_UP && now >= k->hb_at) {
			int r = link_heartbeat(k);

			if (r < 0) {
				link_down(k, strerror(-r));
				continue;
			}
			k->hb_at = now + period;
			loop_set_io_events(k->src,
					   EPOLLIN | (pconn_wants_write(&k->pc) ? EPOLLOUT : 0));
		}
		if (k->state == L_UP && k->heard && now - k->heard > 3 * period + USEC_PER_SEC) {
			link_down(k, "no answer to heartbeats");
			continue;
		}
		{
			usec_t again = link_check_view(k);

			if (again && again < next)
				next = again;
		}
		if (k->state == L_DOWN && k->retry_at < next)
			next = k->retry_at;
		if (k->state == L_UP && k->hb_at < next)
			next = k->hb_at;
	}
	remote_expire(n, now);
	if (n->loads.waiting && now >= n->loads.deadline)
		loads_over(n); /* a master that did not answer: as last heard */
	else if (n->loads.waiting && n->loads.deadline < next)
		next = n->loads.deadline;
	if ((n->fetches.n_rfetches || n->fetches.n_backlog || n->dc.n_queries) &&
	    now + 50 * USEC_PER_MSEC < next)
		next = now + 50 * USEC_PER_MSEC;
	if (n->dc.pend_poll.waiters && n->dc.pend_poll_at < next)
		next = n->dc.pend_poll_at;
	if (n->srv.hs_head && remote_hs_deadline(n) < next)
		next = remote_hs_deadline(n);
	loop_timer_arm(s, next > now ? next : now + 1);
}

/* ---- the remote backend ---- */

static void on_published(void *data, struct object *o)
{
	struct node *n = data;

	link_update(node_owner(n, o->key, o->key_len),
		    (o->flags & OBJ_REPLACED) ? UPD_REPLACE : UPD_PUBLISH, o->key, o->key_len, o->len,
		    o->ver);
}

/* A put of key began here (or was announced), or ended without landing:
 * the directory tells other nodes' lookups to wait for it, or no more. */
static void on_pending(void *data, const char *key, size_t len, bool on)
{
	struct node *n = data;
	struct link *k = node_owner(n, key, len);

	if (k->features & PEER_FEAT_PENDING)
		link_update(k, on ? UPD_PENDING : UPD_WITHDRAW, key, len, 0, 0);
}

static void on_forgotten(void *data, struct object *o)
{
	struct node *n = data;

	link_update(node_owner(n, o->key, o->key_len), UPD_WITHDRAW, o->key, o->key_len, 0, 0);
}

/* A client removed key here (prefix: every key starting with it): the
 * masters tell every node holding a copy to drop it.  A master that is not
 * reachable now does not hear of it (counted). */
static void on_removed(void *data, const void *key, size_t len, bool prefix)
{
	struct node *n = data;
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
	for (unsigned i = 0; i < n->links.n; i++) {
		struct link *l = &n->links.l[i];

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
	store_drop(n->st, o);
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

		w->cursor = store_walk(n->st, w->cursor, 16384, 256, drop_matching, u);
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
		struct object *o = store_find(n->st, k->data, k->len);

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

/* What the two of them use: RDMA needs it at both ends. */
static const char *pair_transport(const struct node *n, const char *id, const char *transport)
{
	return !strcmp(id, n->id)						  ? "local"
	       : n->rdma && transport && !strncmp(transport, "rdma", 4) ? transport
									  : "tcp";
}

/* The member list etcd gives (--metadata-server etcd://), with the loads
 * the master's list has for the same nodes. */
static void describe_etcd(struct node *n, const struct member_list *l,
			  const Kvc__Peer__Members *ms, struct cluster_view *v)
{
	for (size_t i = 0; i < l->n && v->n_members < CLUSTER_VIEW_MAX; i++) {
		const struct member *m = &l->m[i];
		struct cluster_member *x = &v->members[v->n_members++];

		x->id = m->id;
		x->address = m->address;
		x->state = "up"; /* its key is alive */
		x->transport = pair_transport(n, m->id, m->transport);
		x->version = m->version;
		for (size_t k = 0; ms && k < ms->n_members; k++)
			if (!strcmp(ms->members[k]->node_id, m->id) && ms->members[k]->load) {
				x->capacity = ms->members[k]->load->capacity;
				x->used = ms->members[k]->load->used;
				x->objects = ms->members[k]->load->objects;
			}
	}
}

/* This node's row: its load now, not as its last heartbeat told the
 * master (seconds old: a node that had just stored or fetched showed the
 * load from before). */
static void own_load(struct node *n, struct cluster_view *v)
{
	for (unsigned i = 0; i < v->n_members; i++)
		if (!strcmp(v->members[i].id, n->id))
			store_load(n->st, &v->members[i].capacity, &v->members[i].used,
				   &v->members[i].objects);
}

static int be_describe(void *be, struct cluster_view *v)
{
	struct node *n = be;
	const Kvc__Peer__Members *ms = NULL;
	const struct member_list *l = members_view(n);

	memset(v, 0, sizeof(*v));
	v->self = n->id;
	for (unsigned i = 0; i < n->links.n && i < 8; i++) {
		struct link *k = &n->links.l[i];

		if (k->etcd[0] && k->state == L_UP)
			snprintf(k->shown, sizeof(k->shown), "%s (leader %s, term %llu)", k->name,
				 k->leader, (unsigned long long) k->term);
		else if (k->etcd[0])
			snprintf(k->shown, sizeof(k->shown), "%s (no leader joined)", k->name);
		v->masters[v->n_masters++] = k->etcd[0] ? k->shown : k->name;
		if (n->links.l[i].state == L_UP) {
			v->masters_up++;
			if (!ms)
				ms = n->links.l[i].members;
		}
	}
	if (l) {
		describe_etcd(n, l, ms, v);
		own_load(n, v);
		return 0;
	}
	if (!ms)
		return 0;
	for (size_t i = 0; i < ms->n_members && v->n_members < CLUSTER_VIEW_MAX; i++) {
		const Kvc__Peer__Member *m = ms->members[i];
		struct cluster_member *x = &v->members[v->n_members++];

		x->id = m->node_id;
		x->address = m->address;
		x->state = state_name(m->state);
		x->transport = pair_transport(n, m->node_id, m->transport);
		x->version = m->version;
		if (m->load) {
			x->capacity = m->load->capacity;
			x->used = m->load->used;
			x->objects = m->load->objects;
		}
	}
	own_load(n, v);
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

void node_feed_link(struct node *n, int fd)
{
	link_feed(&n->links.l[0], fd);
	while (drops_some(n)) /* what a Drop by prefix started, to its end */
		;
}

static void be_stats(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	struct node *n = be;

	members_stats(n, emit, u);
	emit(u, "remote_hits", n->fetches.c.remote_hits);
	emit(u, "peer_version_refused", n->links.c.version_refused + n->srv.c.version_refused);
	emit(u, "removals_sent", n->c.removals_sent);
	emit(u, "removals_unsent", n->c.removals_unsent);
	emit(u, "copies_dropped", n->c.copies_dropped);
	emit(u, "remote_misses", n->fetches.c.remote_misses);
	emit(u, "remote_errors", n->fetches.c.remote_errors);
	emit(u, "remote_corrupt", n->fetches.c.remote_corrupt + n->srv.c.remote_corrupt);
	emit(u, "remote_bytes_in", (n->xfer ? n->xfer->c.remote_bytes_in : 0));
	emit(u, "remote_bytes_out", (n->xfer ? n->xfer->c.remote_bytes_out : 0));
	emit(u, "remote_served", n->srv.c.served);
	emit(u, "remote_serve_errors", n->srv.c.serve_errors);
	emit(u, "remote_served_summed", n->srv.c.served_summed);
	emit(u, "remote_fetching", n->fetches.n_rfetches);
	emit(u, "remote_fetch_waiting", n->fetches.n_backlog);
	emit(u, "remote_fetch_waited", n->fetches.c.fetch_waited);
	emit(u, "remote_fetched_ahead", __atomic_load_n(&n->fetches.c.fetch_ahead, __ATOMIC_RELAXED));
	emit(u, "remote_fetch_restarts", __atomic_load_n(&n->fetches.c.restarts, __ATOMIC_RELAXED));
	emit(u, "remote_lookup_waited", n->dc.c.lookup_waited);
	emit(u, "remote_lookups", n->fetches.c.lookups);
	emit(u, "remote_lookup_keys", n->fetches.c.lookup_keys);
	emit(u, "remote_lookup_waits", n->dc.c.pending_waits);
	emit(u, "remote_sick_skips", n->fetches.c.sick_skips);
	emit(u, "remote_fetches_timed", n->fetches.c.timed);
	emit(u, "remote_fetch_locate_us", n->fetches.c.locate_us);
	emit(u, "remote_fetch_queue_us", n->fetches.c.queue_us);
	emit(u, "remote_fetch_answer_us", n->fetches.c.answer_us);
	emit(u, "remote_fetch_bytes_us", n->fetches.c.bytes_us);
	emit(u, "remote_fetch_end_us", n->fetches.c.end_us);
	emit(u, "peer_handshake_timeouts", n->srv.c.hs_timeouts);
	emit(u, "peer_refused", n->srv.c.refused);
	emit(u, "remote_peer_connections", n->srv.n_serving);
	emit(u, "pushes", n->push.c.pushes);
	emit(u, "push_errors", n->push.c.push_errors);
	emit(u, "pushes_received", n->srv.c.pushes_received);
	emit(u, "pushes_received_eager", n->srv.c.pushes_eager);
	emit(u, "pushes_received_inline", n->srv.c.pushes_inline);
	emit(u, "pushes_inline_turns", n->srv.c.push_turns);
	emit(u, "pushes_refused", n->srv.c.pushes_refused);
	emit(u, "pushes_ahead", __atomic_load_n(&n->push.c.pushes_ahead, __ATOMIC_RELAXED));
	emit(u, "master_drops", n->links.c.master_drops);
	emit(u, "directory_overflows", n->links.c.directory_overflows);
	presum_stats(n->presum, emit, u);
	emit(u, "tcp_bytes_in", (n->xfer ? n->xfer->c.tcp_bytes_in : 0));
	emit(u, "tcp_bytes_out", (n->xfer ? n->xfer->c.tcp_bytes_out : 0));
	emit(u, "rdma_bytes_in", (n->xfer ? n->xfer->c.rdma_bytes_in : 0));
	emit(u, "rdma_bytes_out", (n->xfer ? n->xfer->c.rdma_bytes_out : 0));
	if (n->rdma) {
		struct rdma_stats rs;

		rdma_get_stats(n->rdma, &rs);
		emit(u, "rdma_gets", rs.gets);
		emit(u, "rdma_get_bytes", rs.get_bytes);
		emit(u, "rdma_puts", rs.puts);
		emit(u, "rdma_put_bytes", rs.put_bytes);
		emit(u, "rdma_errors", rs.errors);
		emit(u, "rdma_timeouts", rs.timeouts);
		emit(u, "rdma_fallbacks", (n->xfer ? n->xfer->c.rdma_fallbacks : 0));
	}
	for (unsigned i = 0; i < n->pstats.n; i++) {
		const struct peer_stat *p = &n->pstats.s[i];
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
			snprintf(n->pstats.name, sizeof(n->pstats.name), "peer.%s.%s", p->addr, f[k].what);
			emit(u, n->pstats.name, f[k].v);
		}
	}
}

static const struct remote_ops remote_ops = {
	.version = REMOTE_OPS_VERSION,
	.name = "remote",
	.locate = remote_locate,
	.where = remote_where,
	.stats = be_stats,
};

/* what the local side asks of the cluster (kvcachectl where and cluster,
 * pushes) */
const struct cluster_admin *node_admin(struct node *n)
{
	if (!n)
		return NULL;
	n->admin = (struct cluster_admin) {
		.be = n,
		.holders = remote_holders,
		.push = remote_push,
		.describe = be_describe,
		.refresh = be_refresh,
	};
	return &n->admin;
}

/* what the directory hears of */
static const struct store_events node_events = {
	.version = STORE_EVENTS_VERSION,
	.published = on_published,
	.forgotten = on_forgotten,
	.pending = on_pending,
	.removed = on_removed,
};

/* ---- set-up ---- */

static void on_peer(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct node *n = u;

	(void) s;
	(void) events;
	for (;;) {
		int c = accept_next(fd, &n->spare_fd);

		if (c == -EMFILE) {
			remote_refused(n, "out of file descriptors");
			continue;
		}
		if (c < 0)
			return;
		remote_accept(n, c);
	}
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
	char ifname[64];
	struct rdma_opts o = { .devices = cfg->device_name, .over_tcp = cfg->test.rdma_over_tcp,
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
	for (unsigned i = 0; i < store_segments(n->st); i++) {
		struct store_segment x;

		store_segment(n->st, i, &x);
		r = rdma_register(n->rdma, i, x.base, x.size);
		if (r < 0) {
			rdma_free(n->rdma);
			n->rdma = NULL;
			if (want) {
				snprintf(err, err_len, "--protocol rdma: registering the %s tier: %s",
					 x.name, strerror(-r));
				return -EINVAL;
			}
			log_warn("RDMA: registering the %s tier failed (%s): data moves over tcp",
				 x.name, strerror(-r));
			return 0;
		}
	}
	snprintf(n->transport, sizeof(n->transport), "rdma/%s", rdma_device(n->rdma));
	log_notice("data moves by RDMA (%s) with peers that have it, over tcp with the others",
		   rdma_device(n->rdma));
	return 0;
}

/* --peer-tcp-congestion names one this kernel has and lets us use: tried
 * on a socket at start, so a typo stops the daemon instead of leaving
 * every connection on the system's. */
static int congestion_check(const char *name, char *err, size_t err_len)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return 0; /* no IPv4 here: the connections will say */
	r = net_congestion(fd, name);
	close(fd);
	if (r < 0)
		snprintf(err, err_len,
			 "--peer-tcp-congestion %s: %s (see "
			 "/proc/sys/net/ipv4/tcp_allowed_congestion_control)",
			 name, r == -ENOENT ? "not in this kernel" : strerror(-r));
	return r < 0 ? -EINVAL : 0;
}

/* --master etcd://HOST:PORT[;HOST:PORT...][/CLUSTER_ID] (Mooncake's
 * master_server_address for masters with --enable_ha): k follows the
 * leader etcd's master view names. */
static int etcd_link(struct link *k, const char *spec, char *err, size_t err_len)
{
	const char *eps = spec + 7, *slash = strchr(eps, '/');
	const char *id = slash && slash[1] ? slash + 1 : "kvcache";
	size_t len = slash ? (size_t) (slash - eps) : strlen(eps);

	if (!len || len >= sizeof(k->etcd) || strlen(id) > 128 || strchr(id, '/')) {
		snprintf(err, err_len, "--master %s: expected etcd://HOST:PORT[;HOST:PORT...][/CLUSTER_ID]",
			 spec);
		return -EINVAL;
	}
	memcpy(k->etcd, eps, len);
	k->etcd[len] = '\0';
	snprintf(k->view_key, sizeof(k->view_key), "/kvcache/%s/master_view", id);
	if (view_follow(k->etcd, k->view_key, &k->vf) < 0) { /* checks them */
		snprintf(err, err_len, "--master %s: expected etcd://HOST:PORT[;HOST:PORT...]"
			 "[/CLUSTER_ID]", spec);
		return -EINVAL;
	}
	snprintf(k->name, sizeof(k->name), "%.*s", (int) sizeof(k->name) - 1, spec);
	return 0;
}

int node_new(struct store *st, const struct config *cfg, struct node **ret, char *err,
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
	if (strncmp(cfg->metadata_server, "etcd://", 7) != 0 &&
	    strcasecmp(cfg->metadata_server, "P2PHANDSHAKE") != 0) {
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
	if (cfg->test.peer_major) {
		peer_major = (uint8_t) cfg->test.peer_major;
		log_warn("KVCACHE_TEST_PEER_MAJOR: this node speaks peer protocol %u", peer_major);
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->st = st;
	n->links.lookup_answered = remote_located;
	n->links.dropped = on_drop;
	n->links.lost = link_lost;
	n->links.heard = loads_heard;
	peer_arena_init(&n->links.answers);
	n->cfg = cfg;
	n->loop = store_loop(st);
	n->listen_fd = n->spare_fd = -1;
	n->ttl_s = 10;
	n->timeout = cfg->remote_timeout_ms * USEC_PER_MSEC;
	n->streams = cfg->data_streams;

	r = congestion_check(cfg->tcp_congestion, err, err_len);
	if (r < 0) {
		free(n);
		return r;
	}
	if (cfg->secret_file[0]) {
		r = peer_secret_load(cfg->secret_file, &n->secret, err, err_len);
		if (r < 0) {
			free(n);
			return -EINVAL;
		}
	}
	if (getrandom(&n->generation, sizeof(n->generation), 0) != sizeof(n->generation))
		n->generation = (uint64_t) getpid() << 32 ^ (loop_now(n->loop) / USEC_PER_MSEC);
	snprintf(list, sizeof(list), "%s", cfg->master_server_address);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct link *k;

		if (n->links.n == MAX_MASTERS) {
			snprintf(err, err_len, "--master: at most %d masters", MAX_MASTERS);
			r = -EINVAL;
			goto fail;
		}
		k = &n->links.l[n->links.n];
		if (!strncmp(tok, "etcd://", 7)) {
			r = etcd_link(k, tok, err, err_len);
			if (r < 0)
				goto fail;
		} else if (net_addr_parse(tok, DEFAULT_MASTER_PORT, &k->addr) < 0 ||
			   !k->addr.host[0]) {
			snprintf(err, err_len, "--master: '%s' is not HOST:PORT", tok);
			r = -EINVAL;
			goto fail;
		}
		k->n = n;
		k->index = n->links.n++;
		k->pc.fd = -1;
		k->q_max = link_queue_max(cfg);
		if (!k->etcd[0])
			net_addr_format(&k->addr, k->name, sizeof(k->name));
	}
	if (!n->links.n) {
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
	if (!strncmp(cfg->metadata_server, "etcd://", 7)) {
		r = members_start(n, cfg->metadata_server, cfg->client_ttl_s, err, err_len);
		if (r < 0)
			goto fail;
	}
	n->spare_fd = accept_spare(n->listen_fd);
	r = loop_add_io(n->loop, n->listen_fd, EPOLLIN, on_peer, n, &n->listen_src);
	if (r < 0)
		goto fail_msg;
	r = loop_add_poller(n->loop, node_poll, NULL, n, &n->poller);
	if (r < 0)
		goto fail_msg;
	r = loop_add_timer(n->loop, node_timer, n, &n->timer);
	if (r < 0)
		goto fail_msg;
	r = remote_init(n);
	if (r == 0)
		r = presum_new(st, cfg, PRESUM_MIN, &n->presum);
	if (r < 0)
		goto fail_msg;
	for (unsigned i = 0; i < n->links.n; i++)
		link_connect(&n->links.l[i]);
	loop_timer_arm(n->timer, loop_now(n->loop) + 1);
	store_remote_attach(st, &remote_ops, n);
	store_add_listener(st, &n->listener, &node_events, n);
	log_notice("node %s: serving peers at %s, %u master(s) from %s", n->id, n->address,
		   n->links.n, cfg->master_server_address);
	*ret = n;
	return 0;
fail_msg:
	snprintf(err, err_len, "cannot set up the cluster: %s", strerror(-r));
fail:
	node_free(n);
	return r;
}

void node_free(struct node *n)
{
	if (!n)
		return;
	members_stop(n);
	presum_free(n->presum);
	n->presum = NULL;
	remote_done(n);
	store_remote_detach(n->st, n);
	store_remove_listener(n->st, &n->listener);
	for (unsigned i = 0; i < n->links.n; i++)
		link_done(&n->links.l[i]);
	loop_source_free(n->listen_src);
	loop_source_free(n->poller);
	loop_source_free(n->timer);
	if (n->listen_fd >= 0)
		close(n->listen_fd);
	if (n->spare_fd >= 0)
		close(n->spare_fd);
	rdma_free(n->rdma); /* after the data threads: none is in a transfer */
	peer_arena_done(&n->links.answers);
	explicit_bzero(&n->secret, sizeof(n->secret));
	free(n);
}
