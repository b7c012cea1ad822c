/* SPDX-License-Identifier: MIT */
/*
 * The master: one loop thread, every connection non-blocking.
 *
 * Nodes live in a slot table; a directory entry names its holders by
 * (slot, generation).  Dropping a node bumps its slot's generation, which
 * makes every entry naming it stale at once, without a walk: lookups skip
 * stale holders and prune them from the entries they touch.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "accept.h"
#include "log.h"
#include "loop.h"
#include "master.h"
#include "peer-conn.h"

#define LOG_TOPIC "master"

#define MAX_NODES ((int) PEER_MAX_MEMBERS)
#define MAX_HOLDERS 8              /* replicas of one key the directory keeps */
#define MAX_OUT (64u << 20)        /* queued to one connection */
#define GROW_STEP 64               /* buckets moved per insert while growing */
#define CONN_MAX 4096
#define HANDSHAKE (2 * USEC_PER_SEC) /* a connection's Hello (and proof) within this */
#define HANDSHAKE_MAX 128          /* connections yet to prove themselves, at most */
#define PENDING (10 * USEC_PER_SEC) /* a holder's "being stored" stands this long */
#define TOMB (30 * USEC_PER_SEC)     /* a removal refuses older copies this long */
#define PREFIX_TOMBS 32            /* removals by prefix remembered at once */

struct mconn;

struct mnode {
	bool used;
	bool connected;
	uint32_t gen;           /* bumped when the node is dropped */
	char id[PEER_MAX_ID + 1];
	char address[PEER_MAX_ID + 1];
	char transport[PEER_MAX_ID + 1];
	uint64_t features;      /* its Join's */
	char version[32];       /* its Join's ("" from an older node) */
	uint64_t generation;    /* the node's own, per run */
	usec_t last;
	uint64_t capacity, used_bytes, objects;
	uint64_t entries;       /* directory entries naming it (approximate) */
	struct mconn *conn;
};

struct ref {
	uint32_t slot, gen; /* gen's top bit: the holder is storing it, not holding it yet */
};

#define REF_PENDING 0x80000000u

struct dentry {
	struct dentry *next;
	uint64_t hash;
	uint64_t len;
	uint64_t ver;         /* its last removal's or replacement's version (0: none) */
	usec_t tomb_until;    /* removed at ver: older copies are refused until then */
	struct dentry *tprev, *tnext; /* on the master's list of removals, oldest first */
	usec_t pend_until;    /* its pending holders stand until then */
	uint32_t n;
	struct ref h[MAX_HOLDERS];
	uint32_t key_len;
	uint8_t key[];
};

struct dir {
	struct dentry **b;
	size_t nb;
	struct dentry **old;  /* being moved out of while growing */
	size_t n_old, pos;
	size_t n;
};

struct mconn {
	struct mconn *next, *prev;
	struct master *m;
	struct pconn pc;
	struct loop_source *src;
	bool hello;
	bool authed;          /* proved the secret (or there is none) */
	uint32_t features;    /* agreed in its Hello */
	bool hs_wait;         /* on the master's list of those yet to prove themselves */
	struct mconn *hs_next, *hs_prev;
	struct hs_source from;         /* where it came from (the budget per source) */
	usec_t hs_deadline;
	uint8_t nonce[PEER_NONCE_SIZE];
	int node;             /* slot, or -1 */
};

struct master {
	struct loop *loop;
	struct master_config cfg;
	int listen_fd, spare_fd; /* spare_fd: kept for accept_next() */
	uint16_t port;
	struct loop_source *listen_src, *ttl_timer;
	struct mconn *conns;
	unsigned n_conns;
	struct mnode nodes[MAX_NODES];
	struct dir dir;
	uint64_t joins, drops, refused;
	struct mconn *hs_head, *hs_tail; /* oldest first */
	unsigned n_hs;
	uint64_t hs_timeouts;
	usec_t hs_logged;
	uint64_t full; /* connections refused at accept: CONN_MAX in use */
	usec_t full_logged;
	struct dentry *tomb_head, *tomb_tail;
	/* removals by prefix (all: an empty one), kept TOMB_MS */
	struct {
		uint8_t prefix[PEER_MAX_KEY];
		uint32_t len;
		uint64_t ver;
		usec_t until;
	} ptomb[PREFIX_TOMBS];
	unsigned ptomb_next;
	uint64_t removals, drops_sent, stale_refused;
	bool standby;  /* --enable_ha, not leading: refuses nodes */
	uint64_t term; /* the election's, while leading (0: no election) */
	uint64_t terms, stepdowns;
	uint64_t version_refused; /* connections of another peer protocol major */
};

/* ---- directory ---- */

static uint64_t key_hash(const void *k, size_t len)
{
	return XXH3_64bits(k, len);
}

static int dir_init(struct dir *d)
{
	d->nb = 1024;
	d->b = calloc(d->nb, sizeof(*d->b));
	return d->b ? 0 : -ENOMEM;
}

static void dir_migrate(struct dir *d, size_t budget)
{
	while (d->old && budget--) {
		struct dentry *e = d->old[d->pos], *next;

		for (; e; e = next) {
			next = e->next;
			e->next = d->b[e->hash & (d->nb - 1)];
			d->b[e->hash & (d->nb - 1)] = e;
		}
		d->old[d->pos] = NULL;
		if (++d->pos == d->n_old) {
			free(d->old);
			d->old = NULL;
		}
	}
}

static struct dentry **dir_slot(struct dir *d, const void *key, size_t len, uint64_t h)
{
	struct dentry **pp;

	if (d->old) {
		pp = &d->old[h & (d->n_old - 1)];
		if ((h & (d->n_old - 1)) >= d->pos) {
			for (; *pp; pp = &(*pp)->next)
				if ((*pp)->hash == h && (*pp)->key_len == len &&
				    !memcmp((*pp)->key, key, len))
					return pp;
		}
	}
	for (pp = &d->b[h & (d->nb - 1)]; *pp; pp = &(*pp)->next)
		if ((*pp)->hash == h && (*pp)->key_len == len && !memcmp((*pp)->key, key, len))
			return pp;
	return pp;
}

static struct dentry *dir_find(struct dir *d, const void *key, size_t len)
{
	return *dir_slot(d, key, len, key_hash(key, len));
}

static struct dentry *dir_add(struct dir *d, const void *key, size_t len)
{
	uint64_t h = key_hash(key, len);
	struct dentry **pp = dir_slot(d, key, len, h), *e;

	if (*pp)
		return *pp;
	if (!d->old && d->n >= d->nb) {
		struct dentry **nb = calloc(d->nb * 2, sizeof(*nb));

		if (nb) {
			d->old = d->b;
			d->n_old = d->nb;
			d->pos = 0;
			d->b = nb;
			d->nb *= 2;
		}
	}
	dir_migrate(d, GROW_STEP);
	e = calloc(1, sizeof(*e) + len);
	if (!e)
		return NULL;
	e->hash = h;
	e->key_len = (uint32_t) len;
	memcpy(e->key, key, len);
	pp = &d->b[h & (d->nb - 1)];
	e->next = *pp;
	*pp = e;
	d->n++;
	return e;
}

static void tomb_unlink(struct master *m, struct dentry *e);

static void dir_del(struct master *m, struct dentry *e)
{
	struct dir *d = &m->dir;
	struct dentry **pp = dir_slot(d, e->key, e->key_len, e->hash);

	tomb_unlink(m, e);
	if (*pp == e) {
		*pp = e->next;
		d->n--;
		free(e);
	}
}

static void dir_done(struct dir *d)
{
	dir_migrate(d, SIZE_MAX);
	for (size_t i = 0; i < d->nb; i++)
		for (struct dentry *e = d->b[i], *n; e; e = n) {
			n = e->next;
			free(e);
		}
	free(d->b);
}

static bool ref_live(const struct master *m, struct ref r)
{
	const struct mnode *n = &m->nodes[r.slot];

	return n->used && n->gen == (r.gen & ~REF_PENDING);
}

/* Drop stale holders from e (gone, or pending for longer than PENDING_MS);
 * true if any live one is left. */
static bool prune(struct master *m, struct dentry *e)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < e->n; i++)
		if (ref_live(m, e->h[i]) &&
		    (!(e->h[i].gen & REF_PENDING) || loop_now(m->loop) < e->pend_until))
			e->h[k++] = e->h[i];
	e->n = k;
	return k > 0;
}

/* ---- removals ---- */

static bool tombed(const struct dentry *e)
{
	return e->tprev || e->tnext || e->tomb_until;
}

static void tomb_unlink(struct master *m, struct dentry *e)
{
	if (!e->tomb_until)
		return;
	if (e->tprev)
		e->tprev->tnext = e->tnext;
	else
		m->tomb_head = e->tnext;
	if (e->tnext)
		e->tnext->tprev = e->tprev;
	else
		m->tomb_tail = e->tprev;
	e->tprev = e->tnext = NULL;
	e->tomb_until = 0;
}

/* e was removed at ver: older copies are refused for TOMB_MS (a fetch
 * under way when the removal came publishes its copy later). */
static void tomb_set(struct master *m, struct dentry *e, uint64_t ver)
{
	tomb_unlink(m, e);
	e->ver = ver;
	e->tomb_until = loop_now(m->loop) + TOMB;
	e->tprev = m->tomb_tail;
	if (m->tomb_tail)
		m->tomb_tail->tnext = e;
	else
		m->tomb_head = e;
	m->tomb_tail = e;
}

/* The version key was removed at by a removal by prefix that stands (0:
 * none). */
static uint64_t prefix_tomb(const struct master *m, const void *key, size_t len)
{
	usec_t now = loop_now(m->loop);
	uint64_t ver = 0;

	for (unsigned i = 0; i < PREFIX_TOMBS; i++)
		if (m->ptomb[i].until > now && m->ptomb[i].len <= len &&
		    !memcmp(m->ptomb[i].prefix, key, m->ptomb[i].len) && m->ptomb[i].ver > ver)
			ver = m->ptomb[i].ver;
	return ver;
}

/* Is a copy of e's key at version ver older than a removal?  (0: unknown,
 * taken as current unless a removal stands.) */
static bool removed_since(const struct master *m, const struct dentry *e, uint64_t ver)
{
	uint64_t p = prefix_tomb(m, e->key, e->key_len);

	if (p && (!ver || ver <= p))
		return true;
	if (e->tomb_until > loop_now(m->loop))
		return !ver || ver <= e->ver;
	return false;
}

/* Tell the node on c to drop its copies of key older than ver. */
static void send_drop(struct mconn *c, const void *key, size_t len, uint64_t ver)
{
	Kvc__Peer__Drop d = KVC__PEER__DROP__INIT;
	ProtobufCBinaryData k = { .len = len, .data = (uint8_t *) key };

	if (!c || !(c->features & PEER_FEAT_VERSIONS))
		return;
	d.keys = &k;
	d.n_keys = 1;
	d.version = ver;
	if (pconn_send(&c->pc, PEER_DROP, 0, &d.base) == 0)
		c->m->drops_sent++;
}

/* Every holder of e but the one in slot `keep` (-1: none) drops its copy
 * older than ver and leaves e; holders still storing it stay. */
static void drop_holders(struct master *m, struct dentry *e, uint64_t ver, int keep)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < e->n; i++) {
		struct ref r = e->h[i];

		if ((r.gen & REF_PENDING) || (int) r.slot == keep) {
			e->h[k++] = r;
			continue;
		}
		if (ref_live(m, r) && m->nodes[r.slot].conn)
			send_drop(m->nodes[r.slot].conn, e->key, e->key_len, ver);
	}
	e->n = k;
}

/* Removals whose time is up: an entry with no holder left goes. */
static void tombs_expire(struct master *m, usec_t now)
{
	while (m->tomb_head && m->tomb_head->tomb_until <= now) {
		struct dentry *e = m->tomb_head;

		tomb_unlink(m, e);
		if (!prune(m, e))
			dir_del(m, e);
	}
}

static void on_remove(struct mconn *c, const Kvc__Peer__Remove *x)
{
	struct master *m = c->m;

	m->removals++;
	for (size_t i = 0; i < x->n_keys; i++) {
		struct dentry *e = dir_add(&m->dir, x->keys[i].data, x->keys[i].len);

		if (!e)
			return;
		if (e->ver > x->version && e->n)
			continue; /* a newer copy is published: the removal is older */
		drop_holders(m, e, x->version, -1);
		tomb_set(m, e, x->version);
	}
	if (x->n_keys)
		return;
	{
		unsigned t = m->ptomb_next++ % PREFIX_TOMBS;
		size_t len = x->all ? 0 : x->prefix.len;
		Kvc__Peer__Drop d = KVC__PEER__DROP__INIT;

		if (len)
			memcpy(m->ptomb[t].prefix, x->prefix.data, len);
		m->ptomb[t].len = (uint32_t) len;
		m->ptomb[t].ver = x->version;
		m->ptomb[t].until = loop_now(m->loop) + TOMB;
		d.prefix = (ProtobufCBinaryData) { .len = len, .data = x->prefix.data };
		d.all = x->all;
		d.version = x->version;
		/* every node walks its own objects; the entries go as they
		 * withdraw, and lookups meanwhile skip those removed */
		for (struct mconn *o = m->conns; o; o = o->next)
			if (o != c && o->node >= 0 && (o->features & PEER_FEAT_VERSIONS) &&
			    pconn_send(&o->pc, PEER_DROP, 0, &d.base) == 0)
				m->drops_sent++;
	}
}

/* ---- nodes ---- */

static void node_drop(struct master *m, int slot, const char *why)
{
	struct mnode *n = &m->nodes[slot];

	log_notice("node %s (%s) dropped: %s", n->id, n->address, why);
	m->drops++;
	if (n->conn)
		n->conn->node = -1;
	n->used = false;
	n->conn = NULL;
	n->gen++; /* every directory entry naming it is stale now */
}

static int node_find(const struct master *m, const char *id)
{
	for (int i = 0; i < MAX_NODES; i++)
		if (m->nodes[i].used && !strcmp(m->nodes[i].id, id))
			return i;
	return -1;
}

/* Nodes heartbeat every third of the TTL: suspect once one is missed
 * (silent for two thirds), not when one is a little late. */
static uint32_t node_state(const struct master *m, const struct mnode *n)
{
	usec_t silent = loop_now(m->loop) - n->last;

	if (!n->connected)
		return PEER_STATE_DOWN;
	return silent > m->cfg.client_ttl_s * USEC_PER_SEC * 2 / 3 ? PEER_STATE_SUSPECT
								  : PEER_STATE_UP;
}

void master_export(const struct master *m, master_export_fn fn, void *u)
{
	uint64_t by_state[3] = { 0 };
	static const char *const names[3] = { "up", "suspect", "down" };

	for (int i = 0; i < MAX_NODES; i++) {
		uint32_t st;

		if (!m->nodes[i].used)
			continue;
		st = node_state(m, &m->nodes[i]);
		by_state[st == PEER_STATE_UP ? 0 : st == PEER_STATE_SUSPECT ? 1 : 2]++;
	}
	for (int i = 0; i < 3; i++)
		fn(u, "nodes", names[i], false, by_state[i]);
	fn(u, "directory_entries", NULL, false, m->dir.n);
	fn(u, "connections", NULL, false, m->n_conns);
	fn(u, "joins", NULL, true, m->joins);
	fn(u, "drops", NULL, true, m->drops);
	fn(u, "refused_connections", NULL, true, m->refused);
	fn(u, "handshake_timeouts", NULL, true, m->hs_timeouts);
	fn(u, "connections_refused_full", NULL, true, m->full);
	fn(u, "removals", NULL, true, m->removals);
	fn(u, "drops_sent", NULL, true, m->drops_sent);
	fn(u, "stale_copies_refused", NULL, true, m->stale_refused);
	fn(u, "leading", NULL, false, !m->standby);
	fn(u, "term", NULL, false, m->term);
	fn(u, "terms_led", NULL, true, m->terms);
	fn(u, "stepdowns", NULL, true, m->stepdowns);
	fn(u, "peer_version_refused", NULL, true, m->version_refused);
}

static void conn_close(struct mconn *c, const char *why);

static void ttl_check(struct loop_source *s, void *u)
{
	struct master *m = u;
	usec_t now = loop_now(m->loop);

	while (m->hs_head && now >= m->hs_head->hs_deadline) {
		m->hs_timeouts++;
		conn_close(m->hs_head, NULL);
	}
	tombs_expire(m, now);
	for (int i = 0; i < MAX_NODES; i++)
		if (m->nodes[i].used &&
		    now - m->nodes[i].last > m->cfg.client_ttl_s * USEC_PER_SEC)
			node_drop(m, i, "silent longer than --client_ttl");
	loop_timer_arm(s, now + 250 * USEC_PER_MSEC);
}

/* ---- connections ---- */

/* c proved itself (or is going): off the handshake list. */
static void hs_done(struct mconn *c)
{
	struct master *m = c->m;

	if (!c->hs_wait)
		return;
	c->hs_wait = false;
	if (c->hs_prev)
		c->hs_prev->hs_next = c->hs_next;
	else
		m->hs_head = c->hs_next;
	if (c->hs_next)
		c->hs_next->hs_prev = c->hs_prev;
	else
		m->hs_tail = c->hs_prev;
	m->n_hs--;
}

static void conn_close(struct mconn *c, const char *why)
{
	struct master *m = c->m;

	hs_done(c);
	if (c->node >= 0) {
		struct mnode *n = &m->nodes[c->node];

		log_info("node %s disconnected: %s", n->id, why ? why : "closed");
		n->connected = false;
		n->conn = NULL;
	} else if (why)
		log_info("connection closed: %s", why);
	loop_source_free(c->src);
	pconn_done(&c->pc);
	if (c->prev)
		c->prev->next = c->next;
	else
		m->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	m->n_conns--;
	free(c);
}

static void fill_load(Kvc__Peer__NodeLoad *l, const struct mnode *n)
{
	kvc__peer__node_load__init(l);
	l->capacity = n->capacity;
	l->used = n->used_bytes;
	l->objects = n->objects;
}

static int send_members(struct mconn *c, uint32_t seq, int err, const char *msg)
{
	struct master *m = c->m;
	Kvc__Peer__Members ms = KVC__PEER__MEMBERS__INIT;
	Kvc__Peer__Defaults df = KVC__PEER__DEFAULTS__INIT;
	Kvc__Peer__Member *mv = NULL, **mp = NULL;
	Kvc__Peer__NodeLoad *lv = NULL;
	size_t n = 0;
	int r;

	df.client_ttl_s = m->cfg.client_ttl_s;
	df.default_kv_lease_ttl_ms = m->cfg.default_kv_lease_ttl_ms;
	df.eviction_high_watermark_ratio = m->cfg.eviction_high_watermark_ratio;
	df.eviction_ratio = m->cfg.eviction_ratio;
	ms.defaults = &df;
	ms.error = err;
	ms.error_msg = (char *) (msg ? msg : "");
	if (!err) {
		mv = calloc(MAX_NODES, sizeof(*mv));
		mp = calloc(MAX_NODES, sizeof(*mp));
		lv = calloc(MAX_NODES, sizeof(*lv));
		if (!mv || !mp || !lv) {
			free(mv);
			free(mp);
			free(lv);
			return -ENOMEM;
		}
		for (int i = 0; i < MAX_NODES; i++) {
			const struct mnode *x = &m->nodes[i];

			if (!x->used)
				continue;
			kvc__peer__member__init(&mv[n]);
			mv[n].node_id = (char *) x->id;
			mv[n].address = (char *) x->address;
			mv[n].transport = (char *) x->transport;
			mv[n].features = x->features;
			mv[n].version = (char *) x->version;
			mv[n].state = node_state(m, x);
			mv[n].generation = x->generation;
			mv[n].silent_ms = (uint32_t) ((loop_now(m->loop) - x->last) / USEC_PER_MSEC);
			fill_load(&lv[n], x);
			mv[n].load = &lv[n];
			mp[n] = &mv[n];
			n++;
		}
	}
	ms.n_members = n;
	ms.members = mp;
	r = pconn_send(&c->pc, PEER_MEMBERS, seq, &ms.base);
	free(mv);
	free(mp);
	free(lv);
	return r;
}

static void set_load(struct mnode *n, const Kvc__Peer__NodeLoad *l)
{
	if (!l)
		return;
	n->capacity = l->capacity;
	n->used_bytes = l->used;
	n->objects = l->objects;
}

static int on_join(struct mconn *c, uint32_t seq, const Kvc__Peer__Join *j)
{
	struct master *m = c->m;
	int slot = node_find(m, j->node_id);
	struct mnode *n;

	/* a connection is one node: joining again (a re-join after a drop,
	 * or the same id) is fine, as another node is not */
	if (c->node >= 0 && c->node != slot)
		return -EPROTO;
	if (slot >= 0 && m->nodes[slot].generation != j->generation) {
		/* the same name, a new run: what the old one held is gone */
		if (m->nodes[slot].conn && m->nodes[slot].conn != c)
			m->nodes[slot].conn->node = -1;
		node_drop(m, slot, "restarted");
		slot = -1;
	}
	if (slot >= 0 && m->nodes[slot].conn && m->nodes[slot].conn != c)
		m->nodes[slot].conn->node = -1; /* a reconnect: the old socket is dead */
	if (slot < 0) {
		for (int i = 0; i < MAX_NODES && slot < 0; i++)
			if (!m->nodes[i].used)
				slot = i;
		if (slot < 0)
			return send_members(c, seq, -EUSERS, "too many nodes");
		n = &m->nodes[slot];
		n->used = true;
		snprintf(n->id, sizeof(n->id), "%s", j->node_id);
		n->generation = j->generation;
		log_notice("node %s joined from %s", j->node_id, j->address);
		m->joins++;
	}
	n = &m->nodes[slot];
	snprintf(n->address, sizeof(n->address), "%s", j->address);
	snprintf(n->transport, sizeof(n->transport), "%s", j->transport ? j->transport : "tcp");
	snprintf(n->version, sizeof(n->version), "%s", j->version ? j->version : "");
	n->features = j->features;
	n->connected = true;
	n->conn = c;
	n->last = loop_now(m->loop);
	set_load(n, j->load);
	c->node = slot;
	return send_members(c, seq, 0, NULL);
}

static void on_publish(struct mconn *c, const Kvc__Peer__Publish *p)
{
	struct master *m = c->m;
	struct ref me = { (uint32_t) c->node, m->nodes[c->node].gen };

	set_load(&m->nodes[c->node], p->load);
	for (size_t i = 0; i < p->n_entries; i++) {
		const Kvc__Peer__Entry *x = p->entries[i];
		struct dentry *e = dir_add(&m->dir, x->key.data, x->key.len);
		struct ref r = me;
		bool have = false;

		if (!e)
			return;
		if (!x->pending && (c->features & PEER_FEAT_VERSIONS)) {
			if (removed_since(m, e, x->version) || (x->version && x->version < e->ver)) {
				/* a copy older than a removal or than the copies
				 * published: it goes, and is never listed */
				m->stale_refused++;
				send_drop(c, e->key, e->key_len,
					  e->ver > x->version ? e->ver : x->version + 1);
				if (!e->n && !tombed(e))
					dir_del(m, e);
				continue;
			}
			if (x->replaced && x->version > e->ver) {
				/* the key was replaced: the older copies go */
				drop_holders(m, e, x->version, c->node);
				tomb_unlink(m, e);
				e->ver = x->version;
			}
		}
		if (x->pending) {
			/* being stored there: lookups wait for it a while (a
			 * holder it names already keeps the bytes it holds) */
			e->pend_until = loop_now(m->loop) + PENDING;
			r.gen |= REF_PENDING;
		} else
			e->len = x->len;
		for (uint32_t k = 0; k < e->n; k++)
			if (e->h[k].slot == r.slot) {
				if (!x->pending || (e->h[k].gen & REF_PENDING))
					e->h[k] = r;
				have = true;
			}
		if (have)
			continue;
		if (e->n == MAX_HOLDERS && !prune(m, e) && e->n == MAX_HOLDERS)
			continue;
		if (e->n == MAX_HOLDERS)
			continue;
		e->h[e->n++] = r;
		m->nodes[c->node].entries++;
	}
}

static void on_withdraw(struct mconn *c, const Kvc__Peer__Withdraw *w)
{
	struct master *m = c->m;

	set_load(&m->nodes[c->node], w->load);
	for (size_t i = 0; i < w->n_keys; i++) {
		struct dentry *e = dir_find(&m->dir, w->keys[i].data, w->keys[i].len);

		if (!e)
			continue;
		for (uint32_t k = 0; k < e->n; k++)
			if (e->h[k].slot == (uint32_t) c->node) {
				e->h[k] = e->h[--e->n];
				break;
			}
		if (!prune(m, e) && !tombed(e))
			dir_del(m, e);
	}
}

static int on_lookup(struct mconn *c, uint32_t seq, const Kvc__Peer__Lookup *q)
{
	struct master *m = c->m;
	Kvc__Peer__LookupResp rs = KVC__PEER__LOOKUP_RESP__INIT;
	Kvc__Peer__Location *lv = calloc(q->n_keys ? q->n_keys : 1, sizeof(*lv));
	Kvc__Peer__Location **lp = calloc(q->n_keys ? q->n_keys : 1, sizeof(*lp));
	char **names = calloc(q->n_keys * MAX_HOLDERS * 2 + 1, sizeof(char *));
	size_t n = 0, ni = 0;
	int r;

	if (!lv || !lp || !names) {
		free(lv);
		free(lp);
		free(names);
		return -ENOMEM;
	}
	for (size_t i = 0; i < q->n_keys; i++) {
		struct dentry *e = dir_find(&m->dir, q->keys[i].data, q->keys[i].len);
		Kvc__Peer__Location *l = &lv[n];

		if (!e)
			continue;
		if (!prune(m, e)) {
			if (!tombed(e))
				dir_del(m, e);
			continue;
		}
		if (e->ver && prefix_tomb(m, e->key, e->key_len) >= e->ver)
			continue; /* removed by prefix: its holders are dropping it */
		kvc__peer__location__init(l);
		l->key = q->keys[i];
		l->len = e->len;
		l->holders = names + ni;
		l->addresses = names + ni + MAX_HOLDERS;
		for (uint32_t k = 0; k < e->n; k++) {
			struct mnode *x = &m->nodes[e->h[k].slot];

			if (!x->connected)
				continue; /* a holder that hung up serves nobody */
			if (e->h[k].gen & REF_PENDING) {
				l->pending = true;
				continue;
			}
			l->holders[l->n_holders++] = x->id;
			l->addresses[l->n_addresses++] = x->address;
		}
		ni += 2 * MAX_HOLDERS;
		if (l->n_holders) {
			l->pending = false;
			lp[n++] = l;
		} else if (l->pending && (c->features & PEER_FEAT_PENDING)) {
			l->len = 0;
			lp[n++] = l;
		}
	}
	rs.n_locations = n;
	rs.locations = lp;
	r = pconn_send(&c->pc, PEER_LOOKUP_RESP, seq, &rs.base);
	free(lv);
	free(lp);
	free(names);
	return r;
}

/* One frame; <0 closes the connection. */
static int on_frame(struct mconn *c, const struct peer_hdr *h, const uint8_t *payload)
{
	struct master *m = c->m;
	ProtobufCMessage *msg;
	int r;

	r = peer_msg_decode(h->type, payload, h->len, &msg);
	if (r < 0)
		return r;
	if (!c->hello && h->type != PEER_HELLO) {
		r = -EPROTO;
		goto out;
	}
	if (c->hello && !c->authed && h->type != PEER_AUTH) {
		log_warn("connection refused: no proof of the cluster secret");
		c->m->refused++;
		r = -EACCES;
		goto out;
	}
	if (c->node < 0 && h->type != PEER_HELLO && h->type != PEER_AUTH && h->type != PEER_JOIN &&
	    h->type != PEER_LOOKUP) {
		r = -ENOTCONN;
		goto out;
	}
	if (c->node >= 0)
		m->nodes[c->node].last = loop_now(m->loop);
	switch (h->type) {
	case PEER_HELLO: {
		const Kvc__Peer__Hello *x = (const void *) msg;
		Kvc__Peer__HelloAck ack = KVC__PEER__HELLO_ACK__INIT;

		if (c->hello) {
			r = -EPROTO;
			break;
		}
		uint8_t proof[PEER_PROOF_SIZE];

		c->hello = true;
		ack.features = x->features & PEER_FEAT_KNOWN;
		c->features = ack.features;
		if (x->major != peer_major) {
			ack.error = -EPROTONOSUPPORT;
			ack.error_msg = "unsupported peer protocol version";
		} else if (m->standby) {
			ack.error = -EAGAIN;
			ack.error_msg = "this master is a standby: the leader is the one in "
					"etcd's master view";
		} else if (m->cfg.secret && x->nonce.len != PEER_NONCE_SIZE) {
			ack.error = -EACCES;
			ack.error_msg = "this master requires the cluster secret "
					"(--cluster-secret-file)";
			log_warn("refused %s: it has no cluster secret",
				 x->node_id && x->node_id[0] ? x->node_id : "a connection");
		} else if (m->cfg.secret) {
			peer_proof(m->cfg.secret, x->nonce.data, x->nonce.len, proof);
			peer_nonce(c->nonce);
			ack.proof = (ProtobufCBinaryData) { .len = sizeof(proof), .data = proof };
			ack.nonce = (ProtobufCBinaryData) { .len = sizeof(c->nonce), .data = c->nonce };
		} else
			c->authed = true;
		ack.term = m->term;
		r = pconn_send(&c->pc, PEER_HELLO_ACK, h->seq, &ack.base);
		if (ack.error)
			r = ack.error;
		break;
	}
	case PEER_AUTH: {
		const Kvc__Peer__Auth *x = (const void *) msg;

		if (c->authed || !m->cfg.secret) {
			r = -EPROTO;
			break;
		}
		if (!peer_proof_ok(m->cfg.secret, c->nonce, sizeof(c->nonce), x->proof.data,
				   x->proof.len)) {
			log_warn("connection refused: wrong cluster secret");
			c->m->refused++;
			r = -EACCES;
			break;
		}
		c->authed = true;
		break;
	}
	case PEER_JOIN:
		r = on_join(c, h->seq, (const void *) msg);
		break;
	case PEER_HEARTBEAT:
		set_load(&m->nodes[c->node], ((const Kvc__Peer__Heartbeat *) msg)->load);
		r = send_members(c, h->seq, 0, NULL);
		break;
	case PEER_PUBLISH:
		on_publish(c, (const void *) msg);
		break;
	case PEER_WITHDRAW:
		on_withdraw(c, (const void *) msg);
		break;
	case PEER_REMOVE:
		on_remove(c, (const void *) msg);
		break;
	case PEER_LOOKUP:
		r = on_lookup(c, h->seq, (const void *) msg);
		break;
	default:
		r = -EPROTO; /* a type only a master sends */
	}
	if (c->authed)
		hs_done(c);
out:
	protobuf_c_message_free_unpacked(msg, NULL);
	return r;
}

static void conn_event(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct mconn *c = u;
	struct peer_hdr h;
	const uint8_t *payload;
	int r = 0;

	(void) s;
	(void) fd;
	if (events & EPOLLOUT)
		r = pconn_flush(&c->pc);
	if (r == 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		r = pconn_read(&c->pc);
	/* whatever arrived before an end of stream still counts */
	while (c->pc.fd >= 0) {
		int k = pconn_next(&c->pc, &h, &payload);

		if (k <= 0) {
			if (k < 0)
				r = k;
			break;
		}
		k = on_frame(c, &h, payload);
		if (k < 0) {
			r = k;
			break;
		}
	}
	if (r == -EPROTONOSUPPORT) {
		c->m->version_refused++;
		log_warn_ratelimited("refused a connection speaking peer protocol %u (this master "
				     "speaks %u): upgrade one of them", c->pc.their_major, peer_major);
		pconn_refuse_version(&c->pc);
	}
	if (r < 0) {
		conn_close(c, r == -ECONNRESET ? "end of stream" : strerror(-r));
		return;
	}
	loop_set_io_events(c->src, EPOLLIN | (pconn_wants_write(&c->pc) ? EPOLLOUT : 0));
}

/* A connection refused at accept: counted, and logged once in 10 s. */
static void refused(struct master *m, const char *why)
{
	m->full++;
	if (loop_now(m->loop) >= m->full_logged + 10 * USEC_PER_SEC) {
		m->full_logged = loop_now(m->loop);
		log_warn("refusing connections (%u open): %s (metric connections_refused_full)",
			 m->n_conns, why);
	}
}

static struct mconn *adopt(struct master *m, int cfd)
{
	struct mconn *c;

	struct hs_source src;
	struct mconn *oldest = NULL;
	unsigned same = 0;

	/* a flood of connections that say nothing: its own oldest goes (past
	 * HS_PER_SOURCE from its address, or past HANDSHAKE_MAX in all), so a
	 * node, whose Hello comes at once, still gets in.  (The list is at
	 * most HANDSHAKE_MAX long.) */
	hs_source_of(cfd, &src);
	for (struct mconn *p = m->hs_head; p; p = p->hs_next)
		if (hs_source_eq(&p->from, &src) && !same++)
			oldest = p;
	if (same >= HS_PER_SOURCE || m->n_hs >= HANDSHAKE_MAX) {
		m->hs_timeouts++;
		if (loop_now(m->loop) >= m->hs_logged + 10 * USEC_PER_SEC) {
			m->hs_logged = loop_now(m->loop);
			log_warn("%u connections (%u from one address) have not said Hello: closing "
				 "the oldest", m->n_hs, same);
		}
		conn_close(same >= HS_PER_SOURCE ? oldest : m->hs_head, NULL);
	}
	if (m->n_conns >= CONN_MAX || !(c = calloc(1, sizeof(*c)))) {
		refused(m, m->n_conns >= CONN_MAX ? "all in use" : "out of memory");
		close(cfd);
		return NULL;
	}
	net_tune(cfd, (int) m->cfg.client_ttl_s);
	net_congestion(cfd, "auto"); /* as the nodes' (docs/cluster.rst) */
	c->m = m;
	c->node = -1;
	pconn_init(&c->pc, cfd, MAX_OUT);
	if (loop_add_io(m->loop, cfd, EPOLLIN, conn_event, c, &c->src) < 0) {
		pconn_done(&c->pc);
		free(c);
		return NULL;
	}
	c->next = m->conns;
	if (c->next)
		c->next->prev = c;
	m->conns = c;
	m->n_conns++;
	c->hs_wait = true;
	c->from = src;
	c->hs_deadline = loop_now(m->loop) + HANDSHAKE;
	c->hs_prev = m->hs_tail;
	if (m->hs_tail)
		m->hs_tail->hs_next = c;
	else
		m->hs_head = c;
	m->hs_tail = c;
	m->n_hs++;
	return c;
}

static void on_accept(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct master *m = u;

	(void) s;
	(void) events;
	for (;;) {
		int cfd = accept_next(fd, &m->spare_fd);
		struct mconn *c;

		if (cfd == -EMFILE) {
			refused(m, "out of file descriptors");
			continue;
		}
		if (cfd < 0)
			return;
		/* a node's Hello is usually here already: read it now, so a
		 * burst of connections is not counted against its address */
		c = adopt(m, cfd);
		if (c)
			conn_event(c->src, cfd, EPOLLIN, c);
	}
}

void master_feed(struct master *m, int fd)
{
	struct mconn *c = adopt(m, fd);

	if (!c)
		return;
	conn_event(c->src, fd, EPOLLIN, c);
	/* still open (it asked nothing wrong): the peer hangs up now */
	for (struct mconn *x = m->conns; x; x = x->next)
		if (x == c) {
			conn_close(c, NULL);
			break;
		}
}

int master_new(struct loop *l, const struct master_config *cfg, struct master **ret)
{
	struct master *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	m->loop = l;
	m->cfg = *cfg;
	m->standby = cfg->standby;
	m->listen_fd = m->spare_fd = -1;
	r = dir_init(&m->dir);
	if (r < 0)
		goto fail;
	r = net_listen(&cfg->listen, &m->listen_fd);
	if (r < 0)
		goto fail;
	r = net_local_port(m->listen_fd, &m->port);
	if (r < 0)
		goto fail;
	m->spare_fd = accept_spare(m->listen_fd);
	r = loop_add_io(l, m->listen_fd, EPOLLIN, on_accept, m, &m->listen_src);
	if (r < 0)
		goto fail;
	r = loop_add_timer(l, ttl_check, m, &m->ttl_timer);
	if (r < 0)
		goto fail;
	loop_timer_arm(m->ttl_timer, loop_now(l) + 250 * USEC_PER_MSEC);
	*ret = m;
	return 0;
fail:
	master_free(m);
	return r;
}

void master_free(struct master *m)
{
	if (!m)
		return;
	while (m->conns)
		conn_close(m->conns, "the master is stopping");
	loop_source_free(m->listen_src);
	loop_source_free(m->ttl_timer);
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	if (m->spare_fd >= 0)
		close(m->spare_fd);
	if (m->dir.b)
		dir_done(&m->dir);
	free(m);
}

void master_set_role(struct master *m, bool leading, uint64_t term)
{
	if (leading) {
		if (!m->standby && m->term == term)
			return;
		m->standby = false;
		m->term = term;
		m->terms++;
		return;
	}
	if (m->standby)
		return;
	m->standby = true;
	m->term = 0;
	m->stepdowns++;
	while (m->conns)
		conn_close(m->conns, "this master stepped down");
	for (int i = 0; i < MAX_NODES; i++)
		if (m->nodes[i].used)
			node_drop(m, i, "this master stepped down");
	/* the next leader's directory comes from the nodes: this one goes */
	dir_done(&m->dir);
	m->dir = (struct dir) { 0 };
	m->tomb_head = m->tomb_tail = NULL;
	memset(m->ptomb, 0, sizeof(m->ptomb));
	if (dir_init(&m->dir) < 0)
		log_error("no memory for an empty directory");
}

bool master_leading(const struct master *m)
{
	return !m->standby;
}

uint16_t master_port(const struct master *m)
{
	return m->port;
}
