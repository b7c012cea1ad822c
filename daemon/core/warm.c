/* SPDX-License-Identifier: MIT */
/*
 * Taking a previous run's memory tiers over (docs/warm-restart.rst).  The
 * catalog says where each object was; an object is kept only when its
 * place is inside a segment that was taken over, no other object claims
 * any of it, and its bytes still hash to the checksum its entry carries.
 * Everything runs before the daemon serves: no client or peer sees an
 * object before it was checked.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "tier.h"

#define LOG_TOPIC "warm"

struct found {
	uint64_t at;              /* the entry's place in the catalog */
	uint64_t offset, len, ver, sum;
	uint32_t tier;
	bool summed;
	bool conflict;            /* another entry claims some of its bytes */
	struct shm_block *cat;    /* its entry, kept */
	struct shm_block *block;  /* its bytes, taken */
};

struct scan {
	struct found *v;
	size_t n, cap;
	bool oom;
};

static void on_entry(void *u, const struct catalog_entry *e, uint64_t at)
{
	struct scan *s = u;

	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 4096;
		struct found *v = realloc(s->v, cap * sizeof(*v));

		if (!v) {
			s->oom = true;
			return;
		}
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct found) {
		.at = at, .offset = e->offset, .len = e->len, .ver = e->ver, .sum = e->sum,
		.tier = e->tier, .summed = e->flags & CATALOG_SUMMED,
	};
}

static int by_place(const void *a, const void *b)
{
	const struct found *x = a, *y = b;

	if (x->tier != y->tier)
		return x->tier < y->tier ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static struct tier *adopted_tier(struct store *st, uint32_t kind)
{
	for (unsigned i = 0; i < st->n_tiers; i++)
		if (st->tiers[i].kind == kind && st->tiers[i].adopted)
			return &st->tiers[i];
	return NULL;
}

void store_warm_close(const struct store_warm *w)
{
	if (!w)
		return;
	if (w->dram_fd >= 0)
		close(w->dram_fd);
	if (w->device_fd >= 0)
		close(w->device_fd);
	if (w->catalog_fd >= 0)
		close(w->catalog_fd);
}

static void drop(struct store *st, struct found *f, bool mismatched)
{
	if (f->block) {
		struct tier *t = adopted_tier(st, f->tier);

		shm_alloc_free(&t->alloc, f->block);
		f->block = NULL;
	}
	catalog_clear(&st->cat, f->at);
	shm_alloc_free(&st->cat.alloc, f->cat);
	f->cat = NULL;
	st->warm.dropped++;
	if (mismatched)
		st->warm.mismatched++;
	else if (!f->summed)
		st->warm.unverified++;
}

/* One entry whose place was taken and whose bytes checked: an object. */
static void keep(struct store *st, struct found *f)
{
	const struct catalog_entry *e = (const void *) (st->cat.base + f->at);
	struct tier *t = adopted_tier(st, f->tier);
	struct object *o, *old;

	old = index_find(&st->index, e->key, e->key_len, index_hash(e->key, e->key_len));
	if (old && old->ver >= f->ver) {
		drop(st, f, false); /* a crash between an entry's two writes */
		return;
	}
	o = object_new(e->key, e->key_len);
	if (!o) {
		drop(st, f, false);
		return;
	}
	if (old) { /* an older copy kept before this one: it goes */
		st->warm.kept--;
		st->warm.kept_bytes -= old->len;
		st->warm.dropped++;
		object_drop(st, old);
	}
	o->len = f->len;
	o->ver = f->ver;
	if (f->ver > st->version)
		st->version = f->ver; /* newer puts get newer versions */
	object_keep_sum(o, f->sum);
	o->tier = t;
	o->block = f->block;
	o->cat = f->cat;
	f->block = f->cat = NULL;
	object_publish(st, o);
	st->warm.kept++;
	st->warm.kept_bytes += o->len;
}

/* The entries whose places were taken: their bytes hashed all at once
 * (on every CPU), then kept or dropped. */
static void check_and_keep(struct store *st, const struct store_warm *w, struct scan *s)
{
	struct store_hash_job *jobs = calloc(s->n ? s->n : 1, sizeof(*jobs));
	size_t n = 0;

	for (size_t i = 0; i < s->n; i++) {
		struct found *f = &s->v[i];

		if (!f->cat)
			continue;
		if (!f->summed || !jobs) {
			drop(st, f, false);
			continue;
		}
		jobs[n++] = (struct store_hash_job) {
			.p = (const uint8_t *) adopted_tier(st, f->tier)->seg.base + f->offset,
			.len = f->len,
		};
	}
	if (n)
		w->hash(jobs, n);
	n = 0;
	for (size_t i = 0; i < s->n; i++) {
		struct found *f = &s->v[i];

		if (!f->cat)
			continue;
		if (jobs[n++].sum != f->sum)
			drop(st, f, true);
		else
			keep(st, f);
	}
	free(jobs);
}

static void take_over(struct store *st, const struct store_warm *w)
{
	struct scan s = { 0 };
	struct shm_block *cursor = NULL;
	struct tier *cur_tier = NULL;
	struct found *last = NULL;

	catalog_scan(&st->cat, on_entry, &s);
	if (s.oom)
		log_warn("out of memory reading the catalog: some objects are dropped");
	/* the entries' places in the catalog, in catalog order */
	for (size_t i = 0; i < s.n; i++)
		if (catalog_keep(&st->cat, s.v[i].at, &cursor, &s.v[i].cat) < 0)
			s.v[i].cat = NULL;
	/* then the bytes, segment by segment in ascending order: a place
	 * claimed twice is a catalog that cannot be trusted there, and
	 * neither claim is kept */
	if (s.n)
		qsort(s.v, s.n, sizeof(s.v[0]), by_place);
	cursor = NULL;
	for (size_t i = 0; i < s.n; i++) {
		struct found *f = &s.v[i];
		struct tier *t = adopted_tier(st, f->tier);
		int r = -EINVAL;

		if (!f->cat) {
			catalog_clear(&st->cat, f->at);
			st->warm.dropped++;
			st->warm.mismatched++;
			continue;
		}
		if (t != cur_tier) {
			cur_tier = t;
			cursor = NULL;
			last = NULL;
		}
		if (t && f->len)
			r = shm_alloc_take(&t->alloc, f->offset, f->len, &cursor, &f->block);
		if (r == 0) {
			last = f;
			continue;
		}
		if (r == -EBUSY && last)
			last->conflict = true;
		f->block = NULL;
		drop(st, f, t != NULL);
	}
	for (size_t i = 0; i < s.n; i++)
		if (s.v[i].cat && s.v[i].conflict)
			drop(st, &s.v[i], true);
	check_and_keep(st, w, &s);
	free(s.v);
}

int warm_start(struct store *st, const struct store_warm *w, usec_t t0)
{
	uint64_t size = st->cfg->dram_size / 16 + st->cfg->device_size / 16 + (UINT64_C(1) << 20);
	bool any = false;
	const char *why;
	int r;

	for (unsigned i = 0; i < st->n_tiers; i++)
		any = any || st->tiers[i].adopted;
	if (w && w->catalog_fd >= 0 && any) {
		r = catalog_adopt(&st->cat, w->catalog_fd, st->generation, &why);
		if (r == 0) {
			st->warm.warm = true;
			take_over(st, w);
			st->warm.took = mono_us() - t0;
			log_notice("warm start: kept %llu objects (%llu bytes) of the previous run, "
				   "dropped %llu (%llu without a checksum, %llu that did not check) "
				   "in %llu ms", (unsigned long long) st->warm.kept,
				   (unsigned long long) st->warm.kept_bytes,
				   (unsigned long long) st->warm.dropped,
				   (unsigned long long) st->warm.unverified,
				   (unsigned long long) st->warm.mismatched,
				   (unsigned long long) (st->warm.took / USEC_PER_MSEC));
			return 0;
		}
		log_warn("not taking over the previous run's catalog (%s): memory starts empty",
			 why ? why : strerror(-r));
	} else if (w && w->catalog_fd >= 0) {
		close(w->catalog_fd);
	}
	if (any)
		log_warn("the previous run's segments came without a usable catalog: "
			 "memory starts empty");
	r = catalog_new(&st->cat, size, st->generation);
	if (r < 0)
		log_warn("no catalog (%s): a warm start after this run keeps nothing",
			 strerror(-r));
	return 0;
}

void store_warm_report(const struct store *st, struct store_warm_report *ret)
{
	*ret = st->warm;
}

void store_warm_fds(const struct store *st, int fds[3])
{
	fds[0] = st->tiers[0].seg.fd;
	fds[1] = st->n_tiers > 1 ? st->tiers[1].seg.fd : -1;
	fds[2] = st->cat.fd;
}

uint64_t store_catalog_full(const struct store *st)
{
	return st->cat.full;
}

struct seal {
	struct object **v;
	size_t n, cap;
	bool oom;
};

static void seal_one(void *u, struct object *o)
{
	struct seal *s = u;

	if (!o->cat)
		return;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 4096;
		struct object **v = realloc(s->v, cap * sizeof(*v));

		if (!v) {
			s->oom = true;
			return;
		}
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = o;
}

uint64_t store_seal(struct store *st, store_hash_fn hash)
{
	struct seal s = { 0 };
	struct store_hash_job *jobs;
	size_t n = 0;

	if (!st->cat.base)
		return 0;
	index_walk(&st->index, seal_one, &s);
	if (s.oom)
		log_warn("out of memory sealing the catalog: some objects will not be kept");
	jobs = calloc(s.n ? s.n : 1, sizeof(*jobs));
	for (size_t i = 0; jobs && i < s.n; i++)
		if (!(s.v[i]->flags & OBJ_SUMMED))
			jobs[n++] = (struct store_hash_job) { .p = store_object_ptr(s.v[i]),
							      .len = s.v[i]->len };
	if (n)
		hash(jobs, n);
	n = 0;
	for (size_t i = 0; jobs && i < s.n; i++) {
		if (!(s.v[i]->flags & OBJ_SUMMED))
			object_keep_sum(s.v[i], jobs[n++].sum);
		catalog_rewrite(st, s.v[i]);
	}
	free(jobs);
	free(s.v);
	st->cat.sealed = true;
	return n;
}
