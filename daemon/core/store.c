/* SPDX-License-Identifier: MIT */
/*
 * Object operations, whichever transport carried the request.  Everything a
 * client holds (reservations, views, buffers) is a slot of its holder, so a
 * hang-up gives it all back (holder.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "store.h"
#include "tier.h"
#include "values.h"

#define MSG(...) snprintf(msg, STORE_MSG_MAX, __VA_ARGS__)

static struct object *lookup(struct store *st, const void *key, size_t len)
{
	return index_find(&st->index, key, len, index_hash(key, len));
}

/* Memory tiers' watermarks, promotions, the tier below's spilling and the
 * index's growth: each step bounded (tier_maintain()). */
static bool maintain(void *userdata)
{
	bool did = tier_maintain(userdata);

	return shared_through_more(userdata) || did;
}

int store_new(struct config *cfg, struct loop *loop, int numa_node, struct store **ret)
{
	return store_new_warm(cfg, loop, numa_node, NULL, ret);
}

int store_new_warm(struct config *cfg, struct loop *loop, int numa_node,
		   const struct store_warm *warm, struct store **ret)
{
	struct store *st = calloc(1, sizeof(*st));
	usec_t t0 = mono_us();
	int r;

	*ret = NULL;
	if (!st) {
		store_warm_close(warm);
		return -ENOMEM;
	}
	st->cat.fd = -1;
	st->cfg = cfg;
	st->loop = loop;
	if (getrandom(&st->generation, sizeof(st->generation), 0) != sizeof(st->generation))
		st->generation = (uint64_t) getpid() << 32 ^ (uint64_t) time(NULL);
	st->numa_bound = numa_node >= 0;
	st->numa_node = numa_node >= 0 ? (unsigned) numa_node : 0;
	r = index_init(&st->index);
	if (r < 0) {
		free(st);
		store_warm_close(warm);
		return r;
	}
	r = loop_add_idle(loop, maintain, st, &st->maintain_src);
	if (r == 0)
		r = tiers_init(st, warm ? warm->dram_fd : -1, warm ? warm->device_fd : -1);
	else
		store_warm_close(warm);
	if (r == 0)
		r = warm_start(st, warm, t0);
	else if (warm && warm->catalog_fd >= 0)
		close(warm->catalog_fd);
	if (r < 0) {
		store_free(st);
		return r;
	}
	*ret = st;
	return 0;
}

/* What a backend left on an object is the backend's, gone before the
 * store: only the object and its fetch are core's to free. */
static void free_at_exit(void *u, struct object *o)
{
	o->below_io = NULL;
	free(o->fetch); /* its waiters went with their sessions */
	object_free(u, o);
}

void store_free(struct store *st)
{
	if (!st)
		return;
	if (st->index.buckets)
		index_walk(&st->index, free_at_exit, st);
	store_announced_done(st);
	store_wake_puts(st); /* waiters went with their sessions: frees the rest */
	if (st->reserving.buckets)
		index_done(&st->reserving);
	store_landing_done(st); /* empty: its backends went first */
	shared_through_done(st);
	tiers_done(st);
	catalog_done(&st->cat);
	index_done(&st->index);
	loop_source_free(st->maintain_src);
	free(st);
}

uint64_t store_key_hash(const void *key, size_t len)
{
	return index_hash(key, len);
}

const struct config *store_config(const struct store *st)
{
	return st->cfg;
}

struct loop *store_loop(const struct store *st)
{
	return st->loop;
}

struct stats *store_stats(struct store *st)
{
	return &st->stats;
}

void store_info(const struct store *st, struct store_info *ret)
{
	*ret = (struct store_info) {
		.generation = st->generation,
		.objects = st->index.n_objects,
		.hugepages = st->hugepages,
		.numa_bound = st->numa_bound,
		.numa_node = st->numa_node,
	};
}

unsigned store_segments(const struct store *st)
{
	return st->n_tiers;
}

void store_segment(const struct store *st, unsigned i, struct store_segment *ret)
{
	const struct tier *t = &st->tiers[i];

	*ret = (struct store_segment) {
		.index = t->segment,
		.kind = t->kind,
		.name = t->name,
		.fd = t->seg.fd,
		.base = t->seg.base,
		.size = t->seg.size,
		.hugepages = t->seg.hugepages,
	};
}

void store_remote_attach(struct store *st, const struct remote_ops *ops, void *be)
{
	st->remote = (struct remote) { ops, be };
}

void store_remote_detach(struct store *st, void *be)
{
	if (st->remote.be == be)
		st->remote = (struct remote) { 0 };
}

bool store_looks_elsewhere(const struct store *st)
{
	return st->remote.ops != NULL || st->shared.ops != NULL;
}

void store_backend_stats(const struct store *st,
			 void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	if (st->below.ops && st->below.ops->stats)
		st->below.ops->stats(st->below.be, emit, u);
	if (st->remote.ops && st->remote.ops->stats)
		st->remote.ops->stats(st->remote.be, emit, u);
	if (st->shared.ops && st->shared.ops->stats)
		st->shared.ops->stats(st->shared.be, emit, u);
}

int store_flush_below(struct store *st)
{
	if (!st->below.ops || !st->below.ops->flush)
		return -EOPNOTSUPP;
	return st->below.ops->flush(st->below.be);
}

static void set_extent(struct extent *e, uint64_t handle, const struct object *o)
{
	*e = (struct extent) {
		.handle = handle,
		.segment = o->tier->segment,
		.offset = o->block->offset,
		.len = o->len,
		.ver = o->ver,
		.summed = (o->flags & OBJ_SUMMED) != 0,
		.sum = o->sum,
	};
}

int store_reserve(struct holder *h, const struct put_args *a, struct extent *ret, char *msg)
{
	struct store *st = h->st;
	struct object *o;
	struct tier *t;
	uint64_t handle;
	int r;

	if (a->flags & ~(uint32_t) WIRE_PUT_KNOWN) {
		MSG("unknown put flags 0x%x", a->flags & ~(uint32_t) WIRE_PUT_KNOWN);
		return -EINVAL;
	}
	t = tier_for(st, a->tier);
	if (!t) {
		MSG("tier %d is not configured on this daemon", a->tier);
		return -EINVAL;
	}
	if (t->kind == SHM_TIER_DISK) {
		MSG("puts land in memory and spill to disk; ask for device or dram");
		return -EINVAL;
	}
	if (a->len > (UINT64_C(1) << 30) || a->len > t->alloc.size) {
		put_announced_failed(st, a->key, a->key_len);
		MSG("value of %llu bytes is larger than the %s tier can hold (%llu bytes)",
		    (unsigned long long) a->len, t->name, (unsigned long long) t->alloc.size);
		return -E2BIG;
	}
	if (!(a->flags & WIRE_PUT_REPLACE) && lookup(st, a->key, a->key_len))
		return -EEXIST;
	o = object_new(a->key, a->key_len);
	if (!o)
		return -ENOMEM;
	o->len = a->len;
	o->tier = t;
	if (a->flags & WIRE_PUT_SOFT_PIN) {
		o->flags |= OBJ_SOFT_PIN;
		o->pin_until = a->pin_ttl ? store_now(st) + a->pin_ttl : 0;
	}
	if (a->flags & WIRE_PUT_HARD_PIN)
		o->flags |= OBJ_HARD_PIN;
	if (a->parent && a->parent_len) {
		o->parent_key = malloc(a->parent_len);
		if (!o->parent_key) {
			free(o);
			return -ENOMEM;
		}
		memcpy(o->parent_key, a->parent, a->parent_len);
		o->parent_len = (uint32_t) a->parent_len;
	}
	r = tier_alloc(st, t, a->len, &o->block);
	if (r < 0) {
		object_free(st, o);
		if (r == -ENOSPC) {
			char why[200];

			put_announced_failed(st, a->key, a->key_len);
			tier_explain(st, t, why, sizeof(why));
			MSG("no space for %llu bytes in the %s tier: %s", (unsigned long long) a->len,
			    t->name, why);
		} else if (r == -EAGAIN)
			MSG("the %s tier is full of objects not yet written to the disk tier; "
			    "waited %llu ms for the spill (--spill-wait-ms)", t->name,
			    (unsigned long long) st->cfg->spill_wait_ms);
		return r;
	}
	r = holder_alloc(h, SLOT_RESERVE, o, &handle);
	if (r < 0) {
		object_free(st, o);
		MSG("too many outstanding reservations and views on this connection");
		return r;
	}
	h->slots[(uint32_t) handle - 1].replace = (a->flags & WIRE_PUT_REPLACE) != 0;
	st->stats.reserves++;
	if (st->cfg->lookup_wait_ms && (st->reserving.buckets || index_init(&st->reserving) == 0)) {
		if (st->remote.ops && !put_still_coming(st, a->key, a->key_len))
			put_tell_pending(st, a->key, a->key_len, true);
		index_insert(&st->reserving, o);
		o->flags |= OBJ_IN_FLIGHT;
		o->reserver = h;
	}
	set_extent(ret, handle, o);
	return 0;
}

int store_commit(struct holder *h, uint64_t handle, char *msg)
{
	struct store *st = h->st;
	struct object *o, *old;
	struct slot *sl;
	uint32_t i;
	bool replace;

	sl = holder_get(h, handle, SLOT_RESERVE, &i);
	if (!sl) {
		MSG("no such reservation");
		return -ESTALE;
	}
	o = sl->obj;
	replace = sl->replace;
	old = index_find(&st->index, o->key, o->key_len, o->hash);
	if (old && !replace) {
		/* Another client committed first: exactly one wins. */
		holder_release(h, i);
		st->stats.put_conflicts++;
		return -EEXIST;
	}
	if (old && old->lease_until > store_now(st)) {
		MSG("the object it would replace is leased for %llu ms more",
		    (unsigned long long) ((old->lease_until - store_now(st)) / USEC_PER_MSEC));
		holder_release(h, i);
		return -EBUSY;
	}
	if (old)
		object_drop(st, old); /* views on it keep their bytes until released */
	o->ver = store_version_next(st);
	if (replace)
		o->flags |= OBJ_REPLACED;
	holder_put(h, i);
	store_put_landed(st, o); /* before the index takes o->hnext */
	object_publish(st, o);
	shared_through(st, o);
	if (st->announced.buckets && st->announced.n_objects) {
		struct object *a = index_find(&st->announced, o->key, o->key_len, o->hash);

		if (a)
			put_announced_over(st, a, false); /* the put it announced is here */
	}
	st->stats.puts++;
	st->stats.bytes_in += o->len;
	return 0;
}

int store_reserved_key(struct holder *h, uint64_t handle, char *buf, size_t *ret_len)
{
	uint32_t i;
	struct slot *sl = holder_get(h, handle, SLOT_RESERVE, &i);

	if (!sl)
		return -ESTALE;
	memcpy(buf, sl->obj->key, sl->obj->key_len);
	buf[sl->obj->key_len] = '\0';
	*ret_len = sl->obj->key_len;
	return 0;
}

/* Give back what a handle of this kind names: 0, or -ESTALE. */
static int give_back(struct holder *h, uint64_t handle, uint8_t kind, const char *what, char *msg)
{
	uint32_t i;

	if (!holder_get(h, handle, kind, &i)) {
		MSG("no such %s", what);
		return -ESTALE;
	}
	holder_release(h, i);
	return 0;
}

int store_abort(struct holder *h, uint64_t handle, char *msg)
{
	int r = give_back(h, handle, SLOT_RESERVE, "reservation", msg);

	if (r == 0)
		h->st->stats.aborts++;
	return r;
}

int store_acquire(struct holder *h, const void *key, size_t key_len, bool local_only,
		  struct extent *ret, struct fetch **ret_fetch, char *msg)
{
	struct store *st = h->st;
	struct object *o = lookup(st, key, key_len);
	uint64_t handle;
	int r;

	st->stats.gets++;
	if (!o) {
		const struct remote *rb = &st->remote;

		if (!local_only && rb->ops && rb->ops->locate &&
		    rb->ops->locate(rb->be, key, key_len, ret_fetch) == 0)
			return -EINPROGRESS; /* another node has it: it comes here */
		if (!local_only && shared_locate(st, key, key_len, ret_fetch) == 0)
			return -EINPROGRESS; /* perhaps in the shared tier */
		st->stats.misses++;
		for (struct tier *t = st->fastest; t; t = t->below)
			t->st.misses++;
		return -ENOENT;
	}
	if (o->where == OBJ_BELOW || o->where == OBJ_FETCHING) {
		/* below memory: bring it back; the caller waits on the fetch */
		object_hit(st, o, true, true);
		r = store_fetch(st, o, ret_fetch);
		if (r < 0) {
			MSG("failed to read the object back from disk");
			return r;
		}
		return -EINPROGRESS;
	}
	r = holder_alloc(h, SLOT_VIEW, o, &handle);
	if (r < 0) {
		MSG("too many outstanding reservations and views on this connection");
		return r;
	}
	o->views++;
	object_hit(st, o, true, true);
	st->stats.hits++;
	st->stats.bytes_out += o->len;
	set_extent(ret, handle, o);
	return 0;
}

int store_release(struct holder *h, uint64_t handle, char *msg)
{
	return give_back(h, handle, SLOT_VIEW, "view", msg);
}

int store_release_summed(struct holder *h, uint64_t handle, uint64_t sum, char *msg)
{
	struct object *o;
	uint32_t i;

	if (!holder_get(h, handle, SLOT_VIEW, &i)) {
		MSG("no such view");
		return -ESTALE;
	}
	o = h->slots[i].obj;
	if (!(o->flags & OBJ_SUMMED)) {
		object_keep_sum(o, sum);
		catalog_rewrite(h->st, o);
	}
	holder_release(h, i);
	return 0;
}

uint64_t store_version_next(struct store *st)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
	st->version = now > st->version ? now : st->version + 1;
	return st->version;
}

void store_version_seen(struct store *st, uint64_t v)
{
	if (v > st->version)
		st->version = v;
}

static void removed_elsewhere(struct store *st, const void *key, size_t len, bool prefix)
{
	store_emit_removed(st, key, len, prefix);
}

int store_remove(struct store *st, const void *key, size_t key_len, bool force, bool local,
		 char *msg)
{
	struct object *o = lookup(st, key, key_len);

	if (!o) {
		if (!local)
			removed_elsewhere(st, key, key_len, false);
		return -ENOENT;
	}
	if (object_readers(o)) {
		MSG("object is held by %u view(s)", object_readers(o));
		return -EBUSY;
	}
	if (!force && o->lease_until > store_now(st)) {
		MSG("object is leased for %llu ms more",
		    (unsigned long long) ((o->lease_until - store_now(st)) / USEC_PER_MSEC));
		return -EBUSY;
	}
	object_drop(st, o);
	st->stats.removes++;
	if (!local)
		removed_elsewhere(st, key, key_len, false);
	return 0;
}

int store_pin(struct store *st, const void *key, size_t key_len, bool hard, usec_t ttl,
	    char *msg)
{
	struct object *o = lookup(st, key, key_len);

	if (!o)
		return -ENOENT;
	if (hard) {
		o->flags |= OBJ_HARD_PIN;
	} else {
		o->flags |= OBJ_SOFT_PIN;
		o->pin_until = ttl ? store_now(st) + ttl : 0;
	}
	object_place(st, o, false);
	return 0;
}

int store_unpin(struct store *st, const void *key, size_t key_len, char *msg)
{
	struct object *o = lookup(st, key, key_len);

	if (!o)
		return -ENOENT;
	o->flags &= ~(OBJ_SOFT_PIN | OBJ_HARD_PIN);
	o->pin_until = 0;
	object_place(st, o, false);
	return 0;
}

bool store_exists(struct store *st, const void *key, size_t key_len, bool prefetch, bool peek)
{
	struct object *o = lookup(st, key, key_len);

	st->stats.exists++;
	if (!o)
		return false;
	if (peek)
		return true;
	object_hit(st, o, true, false);
	/* a prefix hit on disk: the engine will want it next */
	if (prefetch && o->where == OBJ_BELOW) {
		struct fetch *f;

		store_fetch(st, o, &f);
	}
	return true;
}

int store_prefetch(struct store *st, const void *key, size_t key_len)
{
	struct object *o = lookup(st, key, key_len);
	const struct remote *rb = &st->remote;
	struct fetch *f;

	if (o) {
		if ((o->where != OBJ_BELOW && o->where != OBJ_FETCHING) || store_fetch(st, o, &f) < 0)
			return 0;
		st->stats.prefetches++;
		return 1;
	}
	if ((rb->ops && rb->ops->locate && rb->ops->locate(rb->be, key, key_len, &f) == 0) ||
	    shared_locate(st, key, key_len, &f) == 0) {
		st->stats.prefetches++;
		return 1; /* nobody waits: it lands as a replica */
	}
	return 0;
}

int store_where(struct store *st, const char *const *keys, const size_t *lens, size_t n,
		uint8_t *present, bool settle, struct fetch **ret)
{
	const struct remote *rb = &st->remote;
	struct fetch *later = NULL;
	int r = 0, s;

	if (!n)
		return 0;
	if (rb->ops && rb->ops->where)
		r = rb->ops->where(rb->be, keys, lens, n, present, settle, ret);
	if (r < 0 && r != -EINPROGRESS)
		return r;
	/* the shared tier for what no node holds (while the cluster is
	 * asked, it is asked too: both answers are in by the next round) */
	s = shared_where(st, keys, lens, n, present, settle, r == 0 ? ret : &later);
	return r == 0 ? s : r;
}

struct remove_walk {
	struct store *st;
	const void *prefix;
	size_t prefix_len;
	bool force;
	uint64_t removed, skipped;
};

static void remove_matching(void *u, struct object *o)
{
	struct remove_walk *w = u;

	if (w->prefix_len && (o->key_len < w->prefix_len || memcmp(o->key, w->prefix, w->prefix_len) != 0))
		return;
	if (object_readers(o) || (!w->force && o->lease_until > store_now(w->st))) {
		w->skipped++;
		return;
	}
	object_drop(w->st, o);
	w->st->stats.removes++;
	w->removed++;
}

/* A bounded slice of the index per call: the loop never stops for a whole
 * walk (16384 buckets, or about 256 objects: dropping one costs about
 * 1.5 us, so a call stays under half a millisecond).  Keys stored behind the cursor meanwhile are not
 * seen. */
#define REMOVE_BUCKETS_PER_CALL 16384
#define REMOVE_OBJECTS_PER_CALL 256

uint64_t store_remove_prefix(struct store *st, const void *prefix, size_t len, bool force,
			   bool local, uint64_t cursor, uint64_t *ret_removed,
			   uint64_t *ret_skipped)
{
	struct remove_walk w = { .st = st, .prefix = prefix, .prefix_len = len, .force = force };
	uint64_t next;

	if (cursor == 0 && !local) /* the first slice: once a removal */
		removed_elsewhere(st, prefix, len, true);
	next = index_walk_some(&st->index, cursor, REMOVE_BUCKETS_PER_CALL,
					REMOVE_OBJECTS_PER_CALL, remove_matching, &w);

	*ret_removed = w.removed;
	*ret_skipped = w.skipped;
	return next;
}
