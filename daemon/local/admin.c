/* SPDX-License-Identifier: MIT */
/*
 * The daemon's admin answers (admin.h): what kvcachectl status, stats,
 * cluster, ls, evict, rm --prefix and push ask, and the figures /metrics
 * exports.  Each reads the store through store.h and the cluster through
 * its admin table; none walks the whole index in one turn.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "kvc-config.h"
#include "log.h"

#define LOG_TOPIC "session"

#define LIST_DEFAULT 1000u
#define LIST_MAX 4096u
/* a listing's slice of the index per request (with ListReq.slices): about
 * a millisecond of the loop, whatever the index holds */
#define LIST_SLICE_BUCKETS 16384
#define LIST_SLICE_OBJECTS 4096

int server_push(struct server *sv, const char *key, size_t len, const char *node, char *msg)
{
	const struct cluster_admin *a = sv->admin;
	int r;

	if (!a) {
		snprintf(msg, STORE_MSG_MAX, "not in a cluster (kvcached runs without --master)");
		return -ENOTCONN;
	}
	r = a->push(a->be, key, len, node);
	if (r == -EHOSTUNREACH)
		snprintf(msg, STORE_MSG_MAX, "no node %s is up in the cluster", node);
	else if (r == -EINVAL)
		snprintf(msg, STORE_MSG_MAX, "%s is this node", node);
	return r;
}

static uint64_t uptime_s(struct server *sv)
{
	return (loop_now(sv->loop) - sv->started) / USEC_PER_SEC;
}

/* The counters of the backends (the disk tier, the cluster, each peer), by
 * name, copied (a backend may build a name in one buffer).  Only n needs
 * setting before use. */
#define BELOW_MAX 512

struct below_stats {
	char name[BELOW_MAX][96];
	uint64_t value[BELOW_MAX];
	size_t n;
};

static void below_emit(void *u, const char *name, uint64_t v)
{
	struct below_stats *b = u;

	if (b->n < BELOW_MAX) {
		snprintf(b->name[b->n], sizeof(b->name[0]), "%s", name);
		b->value[b->n++] = v;
	}
}

static void below_stats(struct server *sv, struct below_stats *b)
{
	store_backend_stats(sv->st, below_emit, b);
	if (sv->more_stats)
		sv->more_stats(sv->more_stats_data, below_emit, b);
}

static uint64_t below_stat(const struct below_stats *b, const char *name)
{
	for (size_t i = 0; i < b->n; i++)
		if (strcmp(b->name[i], name) == 0)
			return b->value[i];
	return 0;
}

int admin_status(struct session *s, struct reply *rep)
{
	struct server *sv = s->sv;
	unsigned nt = store_tier_count(sv->st);
	Kvc__StatusResp *st = calloc(1, sizeof(*st));
	Kvc__TierStatus *ts = calloc(nt, sizeof(*ts));
	Kvc__TierStatus **tp = calloc(nt, sizeof(*tp));
	struct store_info info;

	store_info(sv->st, &info);
	if (!st || !ts || !tp) {
		free(st);
		free(ts);
		free(tp);
		return -ENOMEM;
	}
	kvc__status_resp__init(st);
	for (unsigned i = 0; i < nt; i++) {
		const struct tier *t = store_tier(sv->st, i);

		kvc__tier_status__init(&ts[i]);
		ts[i].name = (char *) t->name;
		ts[i].capacity = store_tier_capacity(t);
		ts[i].used = store_tier_used(t);
		ts[i].objects = t->objects;
		ts[i].high_watermark = t->high;
		tp[i] = &ts[i];
	}
	st->version = (char *) KVC_VERSION;
	st->uptime_s = uptime_s(sv);
	st->hugepages = info.hugepages;
	st->clients = sv->n_sessions;
	st->objects = info.objects;
	st->n_tiers = nt;
	st->tiers = tp;
	st->pid = (uint32_t) getpid();
	st->socket = sv->socket_path;
	st->protocol_major = KVC_PROTO_MAJOR;
	st->protocol_minor = KVC_PROTO_MINOR;
	st->layout_version = SHM_LAYOUT_VERSION;
	st->numa_bound = info.numa_bound;
	st->numa_node = info.numa_node;
	{
		struct below_stats b;

		b.n = 0;
		below_stats(sv, &b);
		st->recovering = below_stat(&b, "disk.recovering");
		st->recovered = below_stat(&b, "disk.recovered");
		st->recovery_total = below_stat(&b, "disk.recovery_total");
	}
	rep->resp.body_case = KVC__RESPONSE__BODY_STATUS;
	rep->resp.status = st;
	rep->free1 = ts;
	rep->free2 = tp;
	return 0;
}

/* The cluster as this node sees it (empty outside a cluster). */
int admin_cluster(struct session *s, struct reply *rep)
{
	const struct cluster_admin *a = s->sv->admin;
	struct cluster_view *v = calloc(1, sizeof(*v));
	struct {
		Kvc__ClusterResp resp;
		Kvc__ClusterNode nodes[CLUSTER_VIEW_MAX];
		Kvc__ClusterNode *np[CLUSTER_VIEW_MAX];
		char *masters[8];
	} *x = calloc(1, sizeof(*x));
	int r = 0;

	if (!v || !x) {
		free(v);
		free(x);
		return -ENOMEM;
	}
	kvc__cluster_resp__init(&x->resp);
	x->resp.self = "";
	if (a)
		r = a->describe(a->be, v);
	if (r < 0) {
		free(v);
		free(x);
		return r;
	}
	if (v->self) {
		/* strings stay the backend's until its next call: this reply is
		 * packed before the loop runs anything else */
		x->resp.self = (char *) v->self;
		for (unsigned i = 0; i < v->n_masters; i++)
			x->masters[i] = (char *) v->masters[i];
		x->resp.n_masters = v->n_masters;
		x->resp.masters = x->masters;
		x->resp.masters_up = v->masters_up;
		for (unsigned i = 0; i < v->n_members; i++) {
			Kvc__ClusterNode *n = &x->nodes[i];

			kvc__cluster_node__init(n);
			n->id = (char *) v->members[i].id;
			n->address = (char *) v->members[i].address;
			n->state = (char *) v->members[i].state;
			n->transport = (char *) v->members[i].transport;
			n->capacity = v->members[i].capacity;
			n->used = v->members[i].used;
			n->objects = v->members[i].objects;
			n->version = (char *) (v->members[i].version ? v->members[i].version : "");
			x->np[i] = n;
		}
		x->resp.n_nodes = v->n_members;
		x->resp.nodes = x->np;
	}
	rep->resp.body_case = KVC__RESPONSE__BODY_CLUSTER;
	rep->resp.cluster = &x->resp;
	rep->free1 = x;
	rep->free2 = v;
	return 0;
}

const uint64_t ophist_bounds_ns[OPHIST_BUCKETS - 1] = {
	1000,    2500,     5000,     10000,     25000,     50000,     100000,
	250000,  500000,   1000000,  2500000,   10000000,  100000000,
};

/* The backends' figures that are levels, not counts. */
static bool below_is_gauge(const char *name)
{
	static const char *const gauges[] = {
		"disk.records",         "disk.bytes",         "disk.raw_bytes",
		"disk.pending",         "disk.flush_pending", "disk.flush_unwritten",
		"disk.flush_error",     "disk.recovering",    "disk.recovery_total",
		"disk.direct_io",       "disk.compression",   "disk.compression_permille",
		"remote_fetching",      "remote_peer_connections", "remote_fetch_waiting",
		"sums_ahead_waiting",
		"shared.on",            "shared.writable",    "shared.size",
		"shared.bytes",         "shared.records",     "shared.scanned_dirs",
		"shared.write_queued_bytes",
	};

	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
		if (strcmp(name, gauges[i]) == 0)
			return true;
	return false;
}

void server_export(struct server *sv, server_export_fn fn, void *u)
{
	const struct stats *x = store_stats(sv->st);
	uint64_t registered = 0, channels = 0;
	struct store_warm_report w;

	store_warm_report(sv->st, &w);
	const struct {
		const char *name;
		uint64_t value;
	} counters[] = {
		{ "puts", x->puts },
		{ "gets", x->gets },
		{ "hits", x->hits },
		{ "misses", x->misses },
		{ "exists", x->exists },
		{ "bytes_in", x->bytes_in },
		{ "bytes_out", x->bytes_out },
		{ "errors", x->errors },
		{ "protocol_errors", sv->stats.protocol_errors },
		{ "removes", x->removes },
		{ "evictions", x->evictions },
		{ "evicted_bytes", x->evicted_bytes },
		{ "promotions", x->promotions },
		{ "demotions", x->demotions },
		{ "bytes_moved", x->bytes_moved },
		{ "reserves", x->reserves },
		{ "aborts", x->aborts },
		{ "put_conflicts", x->put_conflicts },
		{ "connections", sv->stats.connections },
		{ "reclaimed_reservations", x->reclaimed_reservations },
		{ "reclaimed_views", x->reclaimed_views },
		{ "refused_clients", sv->stats.refused_clients },
		{ "refused_channels", sv->stats.refused_channels },
		{ "refused_buffers", sv->stats.refused_buffers },
		{ "evict_examined", x->evict_examined },
		{ "prefetches", x->prefetches },
		{ "lookup_waits", x->lookup_waits },
		{ "shared_through_waited", x->shared_through_waited },
		{ "shared_through_dropped", x->shared_through_dropped },
		{ "leases_broken", x->leases_broken },
		{ "prefaulted_bytes", store_prefaulted(sv->st) },
		{ "catalog_prefaulted_bytes", store_catalog_prefaulted(sv->st) },
		{ "buffer_prefaulted_bytes", buffer_warmed_bytes(sv) },
		{ "spill_waits", sv->stats.spill_waits },
		{ "copies_offloaded", sv->stats.copies_offloaded },
		{ "gets_streamed", sv->stats.gets_streamed },
		{ "warm_kept_objects", w.kept },
		{ "warm_kept_bytes", w.kept_bytes },
		{ "warm_dropped_objects", w.dropped },
		{ "warm_unverified_objects", w.unverified },
		{ "warm_mismatched_objects", w.mismatched },
		{ "warm_start_ms", w.took / USEC_PER_MSEC },
		{ "catalog_full", store_catalog_full(sv->st) },
	};
	static const char *const tier_names[] = {
		"capacity", "used", "high_watermark", "objects", "hits", "misses",
		"promotions", "demotions", "evictions", "evictions_capacity",
		"evictions_watermark", "evictions_manual", "evicted_bytes",
		"bytes_moved", "lease_protected",
	};
	struct below_stats below;
	const unsigned nt = store_tier_count(sv->st);

	for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
		fn(u, counters[i].name, NULL, EXPORT_COUNTER, counters[i].value);
	for (struct session *s = sv->sessions; s; s = s->next) {
		registered += s->buffer_bytes;
		channels += s->n_channels;
	}
	fn(u, "loop_longest_turn_us", NULL, EXPORT_GAUGE, loop_longest_turn_us(sv->loop));
	fn(u, "loop_longest_busy_us", NULL, EXPORT_GAUGE, loop_longest_busy_us(sv->loop));
	fn(u, "loop_blocked", NULL, EXPORT_COUNTER, loop_blocked(sv->loop));
	fn(u, "loop_spin_us", NULL, EXPORT_COUNTER, loop_spin_us(sv->loop));
	fn(u, "loop_steps_aside", NULL, EXPORT_COUNTER, loop_steps_aside(sv->loop));
	fn(u, "registered_bytes", NULL, EXPORT_GAUGE, registered);
	fn(u, "copies_in_flight", NULL, EXPORT_GAUGE, sv->copies_in_flight);
	fn(u, "channels", NULL, EXPORT_GAUGE, channels);
	for (unsigned i = 0; i < nt; i++) {
		const struct tier *t = store_tier(sv->st, i);
		const uint64_t v[] = {
			store_tier_capacity(t), store_tier_used(t), t->high, t->objects, t->st.hits,
			t->st.misses, t->st.promotions, t->st.demotions,
			t->st.evictions[0] + t->st.evictions[1] + t->st.evictions[2],
			t->st.evictions[EVICT_CAPACITY], t->st.evictions[EVICT_WATERMARK],
			t->st.evictions[EVICT_MANUAL], t->st.evicted_bytes, t->st.bytes_moved,
			/* leases not yet seen to expire count until they are */
			t->lists[OL_LEASED].n,
		};
		_Static_assert(sizeof(v) / sizeof(v[0]) == sizeof(tier_names) / sizeof(tier_names[0]),
			       "per-tier figures");
		for (size_t j = 0; j < sizeof(v) / sizeof(v[0]); j++)
			fn(u, tier_names[j], t->name, j < 4 || j == 14 ? EXPORT_GAUGE : EXPORT_COUNTER,
			   v[j]);
	}
	for (unsigned op = 1; op < SHM_OP_MAX; op++) {
		static const char *const ops[SHM_OP_MAX] = {
			NULL, "exists", "acquire", "release", "reserve", "commit", "abort", "remove",
			"batch_exists", "prefix_lookup", "get_into", "put_from",
		};
		char name[64];

		snprintf(name, sizeof(name), "op.%s.timed", ops[op]);
		fn(u, name, NULL, EXPORT_COUNTER, sv->ophist[op].count);
		snprintf(name, sizeof(name), "op.%s.ns", ops[op]);
		fn(u, name, NULL, EXPORT_COUNTER, sv->ophist[op].sum_ns);
	}
	below.n = 0;
	below_stats(sv, &below);
	for (size_t i = 0; i < below.n; i++)
		fn(u, below.name[i], NULL, below_is_gauge(below.name[i]) ? EXPORT_GAUGE : EXPORT_COUNTER,
		   below.value[i]);
}

/* kvcachectl stats: server_export()'s figures, tiers' as "<tier>.<name>". */
#define STAT_NAME_MAX 128
struct stats_acc {
	Kvc__Counter *cs;
	Kvc__Counter **cp;
	char *names;
	size_t n, cap;
};

static void stats_add(void *u, const char *name, const char *tier, enum export_kind kind,
		      uint64_t value)
{
	struct stats_acc *a = u;

	(void) kind;
	if (a->n == a->cap)
		return;
	kvc__counter__init(&a->cs[a->n]);
	a->cs[a->n].name = a->names + a->n * STAT_NAME_MAX;
	if (tier)
		snprintf(a->cs[a->n].name, STAT_NAME_MAX, "%s.%s", tier, name);
	else
		snprintf(a->cs[a->n].name, STAT_NAME_MAX, "%s", name);
	a->cs[a->n].value = value;
	a->cp[a->n] = &a->cs[a->n];
	a->n++;
}

static void count_one(void *u, const char *name, const char *tier, enum export_kind kind,
		      uint64_t value)
{
	(void) name, (void) tier, (void) kind, (void) value;
	(*(size_t *) u)++;
}

int admin_stats(struct session *s, struct reply *rep)
{
	struct stats_acc a = { 0 };
	Kvc__StatsResp *st;

	server_export(s->sv, count_one, &a.cap);
	st = calloc(1, sizeof(*st));
	a.cs = calloc(a.cap, sizeof(*a.cs));
	a.cp = calloc(a.cap, sizeof(*a.cp));
	a.names = calloc(a.cap, STAT_NAME_MAX);
	if (!st || !a.cs || !a.cp || !a.names) {
		free(st);
		free(a.cs);
		free(a.cp);
		free(a.names);
		return -ENOMEM;
	}
	kvc__stats_resp__init(st);
	server_export(s->sv, stats_add, &a);
	st->n_counters = a.n;
	st->counters = a.cp;
	rep->resp.body_case = KVC__RESPONSE__BODY_STATS;
	rep->resp.stats = st;
	rep->free1 = a.cs;
	rep->free2 = a.names; /* cp goes with st in reply_free() */
	return 0;
}

struct list_acc {
	Kvc__ListResp *l;
	Kvc__KeyInfo *infos;
	Kvc__KeyInfo **ptrs;
	uint32_t limit;
	const ProtobufCBinaryData *prefix;
	bool exact;
};

static void list_add(struct list_acc *a, const struct object *o, uint32_t state)
{
	if (a->prefix->len &&
	    (o->key_len < a->prefix->len || memcmp(o->key, a->prefix->data, a->prefix->len) != 0))
		return;
	if (a->exact && o->key_len != a->prefix->len)
		return;
	a->l->total++;
	if (a->l->n_keys < a->limit) {
		Kvc__KeyInfo *k = &a->infos[a->l->n_keys];

		kvc__key_info__init(k);
		k->key = (ProtobufCBinaryData) { .len = o->key_len, .data = (uint8_t *) o->key };
		k->size = o->len;
		k->state = state;
		k->tier = o->tier->kind;
		k->on_disk = o->below_ref != 0;
		a->ptrs[a->l->n_keys++] = k;
	}
}

static void list_committed(void *u, struct object *o)
{
	list_add(u, o, WIRE_STATE_COMMITTED);
}

int admin_list(struct session *s, const Kvc__ListReq *lq, struct reply *rep)
{
	struct server *sv = s->sv;
	struct list_acc a = { .prefix = &lq->prefix, .exact = lq->exact };

	a.limit = lq->limit ? lq->limit : LIST_DEFAULT;
	if (a.limit > LIST_MAX)
		a.limit = LIST_MAX;
	if (lq->count_only)
		a.limit = 0;
	a.l = calloc(1, sizeof(*a.l));
	a.infos = calloc(a.limit, sizeof(*a.infos));
	a.ptrs = calloc(a.limit, sizeof(*a.ptrs));
	if (!a.l || !a.infos || !a.ptrs) {
		free(a.l);
		free(a.infos);
		free(a.ptrs);
		return -ENOMEM;
	}
	kvc__list_resp__init(a.l);
	a.l->keys = a.ptrs;
	if (lq->exact) {
		/* one key: found, not walked for */
		struct object *o = store_find(sv->st, lq->prefix.data, lq->prefix.len);

		if (o && (o->flags & OBJ_COMMITTED))
			list_committed(&a, o);
	} else if (lq->slices) {
		uint64_t next = store_walk(sv->st, lq->cursor, LIST_SLICE_BUCKETS,
					   LIST_SLICE_OBJECTS, list_committed, &a);

		a.l->more = next != UINT64_MAX;
		a.l->cursor = a.l->more ? next : 0;
	} else {
		/* a client that does not ask for slices (protocol 1.0) */
		for (uint64_t c = 0; c != UINT64_MAX;)
			c = store_walk(sv->st, c, SIZE_MAX, SIZE_MAX, list_committed, &a);
	}
	if (lq->slices && lq->cursor) /* reservations: with the first slice */
		goto done;
	for (struct session *x = sv->sessions; x; x = x->next)
		for (uint32_t i = 0; i < x->h.n_slots; i++)
			if (x->h.slots[i].kind == SLOT_RESERVE)
				list_add(&a, x->h.slots[i].obj, WIRE_STATE_RESERVED);
done:
	rep->resp.body_case = KVC__RESPONSE__BODY_LIST;
	rep->resp.list = a.l;
	rep->free1 = a.infos;
	return 0;
}

int admin_evict(struct session *s, const Kvc__EvictReq *eq, struct reply *rep)
{
	struct server *sv = s->sv;
	Kvc__EvictResp *er = calloc(1, sizeof(*er));

	if (!er)
		return -ENOMEM;
	kvc__evict_resp__init(er);
	if (store_evict(sv->st, eq->tier, eq->bytes, eq->all, &er->bytes, &er->objects) < 0) {
		snprintf(rep->msg, sizeof(rep->msg), "tier %d is not configured on this daemon",
			 eq->tier);
		free(er);
		return -EINVAL;
	}
	log_info("client[pid=%d]: evicted %llu objects, %llu bytes", (int) s->pid,
		 (unsigned long long) er->objects, (unsigned long long) er->bytes);
	rep->resp.body_case = KVC__RESPONSE__BODY_EVICT;
	rep->resp.evict = er;
	return 0;
}

int admin_remove_prefix(struct session *s, const Kvc__RemoveReq *rq, struct reply *rep)
{
	Kvc__RemoveResp *rr = calloc(1, sizeof(*rr));
	uint64_t next;

	if (!rr)
		return -ENOMEM;
	kvc__remove_resp__init(rr);
	next = store_remove_prefix(s->sv->st, rq->prefix.data, rq->prefix.len,
				 rq->flags & WIRE_REMOVE_FORCE, rq->flags & WIRE_REMOVE_LOCAL, rq->cursor,
				 &rr->removed, &rr->skipped);
	rr->done = next == UINT64_MAX;
	rr->cursor = rr->done ? 0 : next;
	if (rr->removed)
		log_info("client[pid=%d]: removed %llu objects by prefix", (int) s->pid,
			 (unsigned long long) rr->removed);
	rep->resp.body_case = KVC__RESPONSE__BODY_REMOVE;
	rep->resp.remove = rr;
	return 0;
}
