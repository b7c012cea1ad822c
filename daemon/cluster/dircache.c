/* SPDX-License-Identifier: MIT */
/*
 * Exists and prefix lookups of keys this node does not hold: what the
 * directory said lately.
 *
 * A cache of answers (present elsewhere or not), kept a short while: a
 * request whose keys are missing here is answered from it, or waits for
 * one Lookup per master covering every key it does not know, and then
 * reads the answers from it.  So every answer of one Lookup must stay
 * until its requests have read them: the cache is 8-way set associative
 * (direct-mapped, keys of one batch that collided overwrote each other's
 * answers: about one 64-key batch in ten lost a key), and a new answer evicts
 * an expired one, else the one that expires first (a "held nowhere"
 * before a "held elsewhere").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dircache.h"
#include "node-private.h"

#define DC_SLOTS 65536
#define DC_WAYS 8
#define DC_HIT (1000 * USEC_PER_MSEC) /* "held elsewhere" is believed this long */
#define DC_MISS (100 * USEC_PER_MSEC) /* "held nowhere" */
#define MAX_QUERIES 256

struct dslot {
	usec_t until;
	uint64_t len;   /* the value's */
	usec_t pend_since; /* pending: first heard of it then */
	bool present;
	bool pending;   /* not present: another node is storing it */
	uint16_t key_len;
	/* one allocation: the key, then with holders_off the other nodes
	 * holding it ("id,id"), with addrs_off their addresses in the same
	 * order (none when they did not fit), each NUL-terminated */
	uint16_t holders_off, addrs_off;
	char *mem;
};

/* The hashes apart from the slots: a set's eight share one cache line, so
 * a probe reads one line and the slot that matches (the answers of a
 * 64-key lookup are read five times over: a miss per slot was the cost). */
struct dcache {
	uint64_t tag[DC_SLOTS]; /* the key's hash (0 taken as 1); 0: free */
	struct dslot s[DC_SLOTS];
};

struct lpart {
	struct link *k;
	uint32_t seq;
	bool done;
	struct lquery *q;
	struct lpart *next, *prev; /* in n->dc.asked[its master] until done */
};

struct lquery {
	struct lquery *next, *prev;
	struct fetch f;          /* f.o NULL: waiters only */
	usec_t deadline;
	size_t n;
	char **keys;             /* into kbuf */
	size_t *lens;
	char *kbuf;
	struct lpart parts[MAX_MASTERS];
	unsigned n_parts, left;
	size_t found;            /* keys the answers named */
};

static uint64_t dc_tag(uint64_t h)
{
	return h ? h : 1;
}

static size_t dc_set(uint64_t h)
{
	return (size_t) (h & (DC_SLOTS / DC_WAYS - 1)) * DC_WAYS;
}

static const char *dc_holders(const struct dslot *d)
{
	return d->holders_off ? d->mem + d->holders_off : NULL;
}

static const char *dc_addrs(const struct dslot *d)
{
	return d->addrs_off ? d->mem + d->addrs_off : NULL;
}

/* The slot answering about key (h its store_key_hash()), fresh or not. */
static struct dslot *dc_slot(struct node *n, const char *key, size_t len, uint64_t h)
{
	struct dcache *c = n->dc.slots;
	size_t set = dc_set(h);
	uint64_t t = dc_tag(h);

	for (unsigned w = 0; w < DC_WAYS; w++)
		if (c->tag[set + w] == t && c->s[set + w].key_len == len &&
		    !memcmp(c->s[set + w].mem, key, len))
			return &c->s[set + w];
	return NULL;
}

/* The fresh answer about key, or NULL. */
static struct dslot *dc_find(struct node *n, const char *key, size_t len, uint64_t h)
{
	struct dslot *d = dc_slot(n, key, len, h);

	return d && d->until > loop_now(n->loop) ? d : NULL;
}

/* 1 present elsewhere, 0 not, 2 being stored elsewhere (wait and ask
 * again), -1 unknown. */
static int dc_get(struct node *n, const char *key, size_t len)
{
	const struct dslot *d = dc_find(n, key, len, store_key_hash(key, len));

	if (d && d->pending)
		return 2;
	return d ? d->present : -1;
}

/* A fresh answer naming holders: their addresses into rf, and the length;
 * false when there is none. */
bool dc_addresses(struct node *n, const char *key, size_t len, uint64_t h,
		  char (*addr)[PEER_MAX_ID + 1], unsigned max, unsigned *n_addr, uint64_t *ret_len)
{
	struct dslot *d = dc_find(n, key, len, h);
	char copy[512], *save = NULL;

	if (!d || !d->present || !dc_addrs(d))
		return false;
	snprintf(copy, sizeof(copy), "%s", dc_addrs(d));
	for (char *t = strtok_r(copy, ",", &save); t && *n_addr < max;
	     t = strtok_r(NULL, ",", &save))
		snprintf(addr[(*n_addr)++], sizeof(addr[0]), "%s", t);
	*ret_len = d->len;
	return *n_addr > 0;
}

/* The answer about key: present elsewhere (held by ids, at addrs: either
 * may be NULL) with the value's length, or not. */
void dc_put(struct node *n, const char *key, size_t len, bool present, const char *ids,
	    const char *addrs, uint64_t vlen)
{
	uint64_t h = store_key_hash(key, len), now = loop_now(n->loop);
	struct dcache *c = n->dc.slots;
	size_t set = dc_set(h), li = ids ? strlen(ids) + 1 : 0, la = addrs ? strlen(addrs) + 1 : 0;
	struct dslot *d = dc_slot(n, key, len, h);
	char *mem;

	if (len + 1 + li + la > UINT16_MAX)
		return;
	mem = malloc(len + 1 + li + la);
	if (!mem)
		return;
	for (unsigned w = 0; w < DC_WAYS && !d; w++)
		if (!c->tag[set + w] || c->s[set + w].until <= now)
			d = &c->s[set + w];
	if (!d) {
		d = &c->s[set];
		for (unsigned w = 1; w < DC_WAYS; w++)
			if (c->s[set + w].until < d->until)
				d = &c->s[set + w];
	}
	memcpy(mem, key, len);
	mem[len] = '\0';
	if (ids)
		memcpy(mem + len + 1, ids, li);
	if (addrs)
		memcpy(mem + len + 1 + li, addrs, la);
	free(d->mem);
	*d = (struct dslot) {
		.until = now + (present ? DC_HIT : DC_MISS),
		.len = vlen,
		.present = present,
		.key_len = (uint16_t) len,
		.holders_off = (uint16_t) (ids ? len + 1 : 0),
		.addrs_off = (uint16_t) (addrs ? len + 1 + li : 0),
		.mem = mem,
	};
	c->tag[d - c->s] = dc_tag(h);
}

/* The answer about key: another node is storing it.  A lookup waits for
 * it --lookup-wait-ms from the first time this node heard so, asking
 * again every DC_PENDING_MS; after that it is absent. */
static void dc_pending(struct node *n, const char *key, size_t len)
{
	uint64_t h = store_key_hash(key, len), now = loop_now(n->loop);
	struct dslot *d = dc_slot(n, key, len, h);
	usec_t since = d && d->pending ? d->pend_since : now;

	dc_put(n, key, len, false, NULL, NULL, 0);
	d = dc_slot(n, key, len, h);
	if (!d || now >= since + n->cfg->lookup_wait_ms * USEC_PER_MSEC)
		return; /* waited long enough: absent */
	d->pending = true;
	d->pend_since = since;
	d->until = now + DC_PENDING;
}

_Static_assert(DC_MASTERS == MAX_MASTERS, "a list per master");

static void part_unlink(struct node *n, struct lpart *pt)
{
	unsigned m = pt->k->index;

	if (pt->prev)
		pt->prev->next = pt->next;
	else
		n->dc.asked[m] = pt->next;
	if (pt->next)
		pt->next->prev = pt->prev;
	else
		n->dc.asked_tail[m] = pt->prev;
	pt->done = true;
}

static void part_append(struct node *n, struct lquery *q, struct lpart *pt)
{
	unsigned m = pt->k->index;

	pt->q = q;
	pt->next = NULL;
	pt->prev = n->dc.asked_tail[m];
	if (pt->prev)
		pt->prev->next = pt;
	else
		n->dc.asked[m] = pt;
	n->dc.asked_tail[m] = pt;
}

static void query_free(struct node *n, struct lquery *q)
{
	for (unsigned i = 0; i < q->n_parts; i++)
		if (!q->parts[i].done)
			part_unlink(n, &q->parts[i]);
	if (q->prev)
		q->prev->next = q->next;
	else
		n->dc.queries = q->next;
	if (q->next)
		q->next->prev = q->prev;
	n->dc.n_queries--;
	free(q->kbuf);
	free(q->keys);
	free(q->lens);
	free(q);
}

/* Every part answered (or out of time): what was not found is absent
 * (when the answers named as many keys as were asked, none is). */
static void query_finish(struct node *n, struct lquery *q)
{
	for (size_t i = 0; q->found < q->n && i < q->n; i++)
		if (dc_get(n, q->keys[i], q->lens[i]) < 0)
			dc_put(n, q->keys[i], q->lens[i], false, NULL, NULL, 0);
	fetch_wake(&q->f, 0); /* each waiter asks again, settled */
	query_free(n, q);
	/* places came free: the requests that wait for one ask, oldest first
	 * (one that finds every answer cached leaves its place to the next) */
	n->dc.room_turn = true;
	while (n->dc.n_queries < MAX_QUERIES && fetch_wake_oldest(&n->dc.query_room, FETCH_AGAIN))
		;
	n->dc.room_turn = false;
}

void queries_expire(struct node *n, usec_t now)
{
	for (struct lquery *q = n->dc.queries, *next; q; q = next) {
		next = q->next;
		if (now >= q->deadline)
			query_finish(n, q);
	}
}

/* Appends ",s" (or s, first) to the NUL-terminated list in buf: false,
 * and nothing appended, when it does not fit. */
static bool join(char *buf, size_t cap, size_t *used, const char *s)
{
	size_t l = strlen(s), sep = *used ? 1 : 0;

	if (*used + sep + l + 1 > cap)
		return false;
	if (sep)
		buf[(*used)++] = ',';
	memcpy(buf + *used, s, l + 1);
	*used += l;
	return true;
}

bool queries_link_lost(struct node *n, const struct link *k)
{
	static const Kvc__Peer__LookupResp none = KVC__PEER__LOOKUP_RESP__INIT;

	struct lpart *pt = n->dc.asked[k->index];

	/* one at a time: an answer may end the query */
	return pt && query_answered(n, k, pt->seq, &none);
}

bool query_answered(struct node *n, const struct link *k, uint32_t seq,
		    const Kvc__Peer__LookupResp *resp)
{
	struct lquery *q;
	struct lpart *pt;

	/* the first asked of k, as k answers in order (past any whose answer
	 * never came), never one asked after seq (each link numbers its
	 * frames) */
	for (pt = n->dc.asked[k->index]; pt && pt->seq != seq && (int32_t) (seq - pt->seq) > 0;
	     pt = pt->next)
		;
	if (!pt || pt->seq != seq)
		return false;
	q = pt->q;
	part_unlink(n, pt);
	q->found += resp->n_locations;
	for (size_t x = 0; x < resp->n_locations; x++) {
		const Kvc__Peer__Location *l = resp->locations[x];
		char ids[512], addrs[512];
		size_t used = 0, aused = 0;
		bool fits = true;

		for (size_t h = 0; h < l->n_holders; h++) {
			if (!strcmp(l->holders[h], n->id))
				continue;
			fits = fits && join(ids, sizeof(ids), &used, l->holders[h]);
			fits = fits && join(addrs, sizeof(addrs), &aused, l->addresses[h]);
		}
		/* what does not fit is asked again at the fetch */
		if (!used && l->pending)
			dc_pending(n, (const char *) l->key.data, l->key.len);
		else
			dc_put(n, (const char *) l->key.data, l->key.len, used > 0,
			       used ? ids : NULL, used && fits ? addrs : NULL, l->len);
	}
	if (--q->left == 0)
		query_finish(n, q);
	return true;
}

int remote_where(void *be, const char *const *keys, const size_t *lens, size_t n_keys,
		 uint8_t *present, bool settle, struct fetch **ret)
{
	struct node *n = be;
	struct lquery *q = NULL;
	ProtobufCBinaryData *bk = NULL;
	size_t unknown = 0, bytes = 0, pending = 0;
	int r = 0;

	for (size_t i = 0; i < n_keys; i++) {
		int v = dc_get(n, keys[i], lens[i]);

		present[i] = v == 1;
		unknown += v < 0;
		pending += v == 2;
		bytes += v < 0 ? lens[i] : 0;
	}
	if (pending && (!unknown || settle)) {
		/* another node is storing some: ask again shortly (the
		 * directory cache's answer is old by then) */
		if (!n->dc.pend_poll.waiters) {
			n->dc.pend_poll_at = loop_now(n->loop) + DC_PENDING;
			loop_timer_arm_by(n->timer, n->dc.pend_poll_at);
		}
		n->dc.c.pending_waits++;
		*ret = &n->dc.pend_poll;
		return -EINPROGRESS;
	}
	if (!unknown || settle)
		return 0;
	/* too many questions out: wait for a place, after those waiting */
	if (n->dc.n_queries >= MAX_QUERIES || (n->dc.query_room.waiters && !n->dc.room_turn)) {
		n->dc.c.lookup_waited++;
		*ret = &n->dc.query_room;
		return -EINPROGRESS;
	}
	q = calloc(1, sizeof(*q));
	bk = calloc(unknown, sizeof(*bk));
	if (!q || !bk)
		goto fail;
	q->f.far = true;
	q->keys = calloc(unknown, sizeof(*q->keys));
	q->lens = calloc(unknown, sizeof(*q->lens));
	q->kbuf = malloc(bytes ? bytes : 1);
	if (!q->keys || !q->lens || !q->kbuf)
		goto fail;
	for (size_t i = 0, at = 0; i < n_keys; i++) {
		if (present[i] || dc_get(n, keys[i], lens[i]) >= 0)
			continue;
		q->keys[q->n] = q->kbuf + at;
		memcpy(q->keys[q->n], keys[i], lens[i]);
		at += lens[i];
		q->lens[q->n++] = lens[i];
	}
	/* one Lookup per master, each with the keys it owns */
	for (unsigned m = 0; m < n->links.n; m++) {
		struct link *k = &n->links.l[m];
		size_t nk = 0;

		for (size_t i = 0; i < q->n; i++)
			if (node_owner(n, q->keys[i], q->lens[i]) == k)
				bk[nk++] = (ProtobufCBinaryData) { .len = q->lens[i],
								   .data = (uint8_t *) q->keys[i] };
		if (!nk)
			continue;
		if (node_lookup_many(k, bk, nk, &q->parts[q->n_parts].seq) < 0)
			continue; /* that master is down: its keys are misses */
		q->parts[q->n_parts].k = k;
		part_append(n, q, &q->parts[q->n_parts++]);
	}
	free(bk);
	bk = NULL;
	if (!q->n_parts)
		goto fail;
	q->left = q->n_parts;
	q->deadline = loop_now(n->loop) + n->timeout;
	q->next = n->dc.queries;
	if (q->next)
		q->next->prev = q;
	n->dc.queries = q;
	n->dc.n_queries++;
	loop_timer_arm_by(n->timer, q->deadline);
	*ret = &q->f;
	return -EINPROGRESS;
fail:
	if (q) {
		free(q->kbuf);
		free(q->keys);
		free(q->lens);
		free(q);
	}
	free(bk);
	return r;
}

int remote_holders(void *be, const char *key, size_t len, char *buf, size_t cap, bool settle,
		   struct fetch **ret)
{
	struct node *n = be;
	uint64_t h = store_key_hash(key, len);
	struct dslot *d = dc_find(n, key, len, h);

	if (!settle) {
		/* kvcachectl where: the directory's list now, not the cache's */
		uint8_t present;
		int r;

		if (d)
			d->until = 0;
		r = remote_where(be, &key, &len, 1, &present, false, ret);
		if (r < 0)
			return r;
		d = dc_find(n, key, len, h);
	}
	snprintf(buf, cap, "%s", d && d->present && dc_holders(d) ? dc_holders(d) : "");
	return 0;
}

int dircache_init(struct node *n)
{
	n->dc.slots = calloc(1, sizeof(*n->dc.slots));
	return n->dc.slots ? 0 : -ENOMEM;
}

void dircache_done(struct node *n)
{
	while (n->dc.queries)
		query_free(n, n->dc.queries); /* no waiter is left */
	if (n->dc.slots)
		for (size_t i = 0; i < DC_SLOTS; i++)
			free(n->dc.slots->s[i].mem);
	free(n->dc.slots);
	n->dc.slots = NULL;
}
