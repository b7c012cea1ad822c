/* SPDX-License-Identifier: MIT */
/*
 * Batches, scatter-gather, registered buffers and asynchronous operations:
 * everything that puts more than one descriptor in flight at a time.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client-private.h"

/* Keys per round trip: half the tags, so other threads are never starved. */
#define BATCH_CHUNK (CHAN_TAGS / 2)
#define MAX_IOV 64

static int64_t iov_sum(const struct kvc_iovec *iov, size_t n)
{
	uint64_t total = 0;

	if ((n && !iov) || n > 1024)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!iov[i].base && iov[i].len)
			return -EINVAL;
		total += iov[i].len;
		if (total > KVC_VALUE_MAX)
			return -E2BIG;
	}
	return (int64_t) total;
}

static void gather(void *dst, const struct kvc_iovec *iov, size_t n)
{
	uint8_t *p = dst;

	for (size_t i = 0; i < n; i++) {
		memcpy(p, iov[i].base, iov[i].len);
		p += iov[i].len;
	}
}

static void scatter(const void *src, size_t len, const struct kvc_iovec *iov, size_t n)
{
	const uint8_t *p = src;

	for (size_t i = 0; i < n && len; i++) {
		size_t k = iov[i].len < len ? iov[i].len : len;

		memcpy(iov[i].base, p, k);
		p += k;
		len -= k;
	}
}

static void tag_rearm(struct chan *ch, uint32_t t)
{
	__atomic_store_n(&ch->tags[t].state, TAG_SYNC, __ATOMIC_RELAXED);
}

/* opts as this daemon takes them: without push_to (a copy in *plain)
 * when its channels cannot push with the put; the caller then pushes
 * after the put, with kvc_push(). */
static const struct kvc_put_opts *opts_here(const struct kvc_client *c,
					    const struct kvc_put_opts *opts,
					    struct kvc_put_opts *plain)
{
	if (!c || !opts || !opts->push_to || (c->chan.features & SHM_CHAN_FEAT_PUSH))
		return opts;
	*plain = *opts;
	plain->push_to = NULL;
	return plain;
}

/* The parent keys[j] names: the one before it in a KVC_PUT_CHAIN batch. */
static const char *parent_of(const struct kvc_put_opts *opts, const char *const *keys, size_t j)
{
	if (!opts)
		return NULL;
	if ((opts->flags & KVC_PUT_CHAIN) && j > 0)
		return keys[j - 1];
	return opts->parent_key;
}

int kvc_batch_put(struct kvc_client *c, size_t n, const char *const *keys,
		  const struct kvc_iovec *const *iov, const size_t *n_iov,
		  const struct kvc_put_opts *opts, int *ret_results)
{
	struct shm_sqe e[BATCH_CHUNK];
	uint32_t tags[BATCH_CHUNK];
	size_t idx[BATCH_CHUNK];
	void *ptr[BATCH_CHUNK];
	struct kvc_put_opts plain;
	const char *push = opts ? opts->push_to : NULL;
	bool push_after;
	int stored = 0;

	if (!c || (n && (!keys || !iov || !n_iov || !ret_results)))
		return -EINVAL;
	push_after = opts_here(c, opts, &plain) != opts;
	if (opts && opts->parent_key && client_check_key(opts->parent_key) < 0)
		return -EINVAL;
	for (size_t base = 0; base < n; base += BATCH_CHUNK) {
		size_t k = n - base < BATCH_CHUNK ? n - base : BATCH_CHUNK, m = 0;
		int64_t r;

		/* 1: reserve every valid key of the chunk in one submission */
		for (size_t i = 0; i < k; i++) {
			size_t j = base + i;
			int64_t len = iov_sum(iov[j], n_iov[j]);

			if (client_check_key(keys[j]) < 0 || len <= 0) {
				ret_results[j] = len < 0 ? (int) len : -EINVAL;
				continue;
			}
			r = chan_tag_get(c, TAG_SYNC, true, &tags[m]);
			if (r < 0)
				return (int) r;
			chan_prep_key(&c->chan, tags[m], &e[m], SHM_OP_RESERVE, keys[j],
				      parent_of(opts, keys, j));
			e[m].arg = (uint64_t) len;
			if (opts) {
				e[m].put_flags = client_wire_put_flags(opts->flags);
				e[m].pin_ttl_ms = opts->pin_ttl_ms;
				e[m].tier = (int8_t) opts->tier;
			}
			idx[m++] = j;
		}
		r = chan_submit(c, e, (uint32_t) m);
		if (r < 0)
			return (int) r;
		/* 2: copy into what was reserved, committing each as its copy
		 * ends: what it pushes goes while the next ones are copied (all
		 * committed at the end, a batch of 16 MiB values had its pushes
		 * start after the last copy) */
		for (size_t i = 0; i < m; i++) {
			struct shm_cqe cqe;

			r = chan_wait(c, tags[i]);
			if (r == -ECONNRESET && c->broken)
				return (int) r;
			cqe = c->chan.tags[tags[i]].cqe;
			ptr[i] = NULL;
			if (r == 0 && client_extent_ptr(c, cqe.segment, cqe.offset, cqe.len, &ptr[i]) < 0)
				r = -EPROTO;
			ret_results[idx[i]] = (int) r;
			if (r < 0)
				continue;
			client_map_ahead(c, ptr[i], cqe.len);
			gather(ptr[i], iov[idx[i]], n_iov[idx[i]]);
			tag_rearm(&c->chan, tags[i]);
			e[i] = (struct shm_sqe) {
				.opcode = SHM_OP_COMMIT,
				.user_data = tags[i],
				.arg = cqe.handle,
			};
			if (push && !push_after &&
			    chan_push_to(&c->chan, tags[i], &e[i], 0, push) < 0)
				push_after = true; /* (a bad id: kvc_push() says so) */
			r = chan_submit(c, &e[i], 1);
			if (r < 0)
				return (int) r;
		}
		for (size_t i = 0; i < m; i++) {
			if (ret_results[idx[i]] == 0) {
				r = chan_wait(c, tags[i]);
				if (r == -ECONNRESET && c->broken)
					return (int) r;
				ret_results[idx[i]] = (int) r;
				stored += r == 0;
			}
			chan_tag_put(&c->chan, tags[i]);
		}
	}
	if (push_after)
		for (size_t j = 0; j < n; j++)
			if (ret_results[j] == 0)
				ret_results[j] = kvc_push(c, keys[j], push);
	return stored;
}

/* The view of keys[j] copied into its pieces, then let go at once (a
 * batch larger than dram streams through it); 1 copied, 0 not (the
 * result says why), or -errno when the client is gone. */
static int copy_out(struct kvc_client *c, const struct shm_cqe *cqe,
		    const struct kvc_iovec *iov, size_t n_iov, ssize_t *ret)
{
	struct shm_sqe rel = {
		.opcode = SHM_OP_RELEASE,
		.flags = SHM_SQE_NO_CQE,
		.user_data = CHAN_NO_TAG,
		.arg = cqe->handle,
	};
	int loaded = 0;
	int64_t r;
	void *p;

	if (client_extent_ptr(c, cqe->segment, cqe->offset, cqe->len, &p) < 0)
		*ret = -EPROTO;
	else if ((int64_t) cqe->len > iov_sum(iov, n_iov))
		*ret = -ENOBUFS;
	else {
		scatter(p, cqe->len, iov, n_iov);
		*ret = (ssize_t) cqe->len;
		loaded = 1;
	}
	r = chan_submit_lazy(c, &rel, 1); /* the batch's end rings for it */
	if (r == 0)
		client_let_go(c);
	return r < 0 ? (int) r : loaded;
}

/*
 * A batch's requests in flight on sync tags, up to BATCH_CHUNK at a time:
 * the oldest is waited for first, and once half of those in flight are
 * answered the next ones are asked for, so the daemon (and a node it
 * fetches from) has the next requests before it runs out.  (Asked a chunk
 * at a time, each chunk's last fetches came in alone and the link stood
 * idle while the next chunk's were asked for.)  prep() fills the
 * descriptor of key j on tag t (1), or sets j's result and skips it (0),
 * or fails the batch (<0); done() takes j's answer (the tag's completion
 * is still readable) and may fail it.  Descriptors published without a
 * ring (chan_submit_lazy()) are rung for once, at the end.
 */
struct window_ops {
	int (*prep)(struct kvc_client *c, void *u, size_t j, uint32_t t, struct shm_sqe *e);
	int (*done)(struct kvc_client *c, void *u, size_t j, uint32_t t, int64_t r);
};

static int window_run(struct kvc_client *c, size_t n, const struct window_ops *ops, void *u)
{
	struct shm_sqe e[BATCH_CHUNK];
	uint32_t tags[BATCH_CHUNK];
	size_t idx[BATCH_CHUNK], next = 0, head = 0, count = 0;
	int r = 0;

	while (r >= 0 && (next < n || count)) {
		if (next < n && count <= BATCH_CHUNK / 2) {
			uint32_t m = 0;

			while (next < n && count + m < BATCH_CHUNK) {
				size_t slot = (head + count + m) % BATCH_CHUNK;

				r = chan_tag_get(c, TAG_SYNC, true, &tags[slot]);
				if (r < 0)
					break;
				r = ops->prep(c, u, next, tags[slot], &e[m]);
				if (r <= 0) {
					chan_tag_put(&c->chan, tags[slot]);
					if (r < 0)
						break;
					next++;
					continue;
				}
				idx[slot] = next++;
				m++;
			}
			if (m && chan_submit(c, e, m) < 0)
				r = -ECONNRESET;
			count += m;
			if (r < 0)
				break;
		}
		if (count) {
			uint32_t t = tags[head];
			int64_t x = chan_wait(c, t);

			if (x == -ECONNRESET && c->broken)
				return -ECONNRESET; /* (tags are moot on a broken client) */
			r = ops->done(c, u, idx[head], t, x);
			chan_tag_put(&c->chan, t);
			head = (head + 1) % BATCH_CHUNK;
			count--;
		}
	}
	chan_kick(c);
	return r < 0 ? r : 0;
}

struct batch_get {
	const char *const *keys;
	const struct kvc_iovec *const *iov;
	const size_t *n_iov;
	ssize_t *res;
	const size_t *map;   /* j is keys[map[j]] (NULL: keys[j]) */
	size_t *again;       /* refused for room while others' views were held */
	size_t n_again, cap_again;
	int loaded;
};

static int get_prep(struct kvc_client *c, void *u, size_t j, uint32_t t, struct shm_sqe *e)
{
	struct batch_get *g = u;
	size_t k = g->map ? g->map[j] : j;
	int64_t cap = iov_sum(g->iov[k], g->n_iov[k]);

	if (client_check_key(g->keys[k]) < 0 || cap < 0) {
		g->res[k] = cap < 0 ? cap : -EINVAL;
		return 0;
	}
	memset(e, 0, sizeof(*e));
	chan_prep_key(&c->chan, t, e, SHM_OP_ACQUIRE, g->keys[k], NULL);
	return 1;
}

static int get_done(struct kvc_client *c, void *u, size_t j, uint32_t t, int64_t r)
{
	struct batch_get *g = u;
	size_t k = g->map ? g->map[j] : j;
	struct shm_cqe cqe = c->chan.tags[t].cqe;
	int x;

	if (r < 0) {
		g->res[k] = r;
		if (r == -ENOSPC && !g->map) {
			if (g->n_again == g->cap_again) {
				size_t cap = g->cap_again ? g->cap_again * 2 : 64;
				size_t *a = realloc(g->again, cap * sizeof(*a));

				if (!a)
					return 0; /* stays -ENOSPC */
				g->again = a;
				g->cap_again = cap;
			}
			g->again[g->n_again++] = k;
		}
		return 0;
	}
	x = copy_out(c, &cqe, g->iov[k], g->n_iov[k], &g->res[k]);
	if (x < 0)
		return x;
	g->loaded += x;
	return 0;
}

static const struct window_ops get_ops = { .prep = get_prep, .done = get_done };

/*
 * Each view is let go as soon as it is copied.  A batch larger than dram
 * (of objects on disk, say) finds no room for some read-backs while the
 * views in flight are held: those come back -ENOSPC and are asked for
 * again, one at a time, at the end, so a batch of any size streams through.
 */
int kvc_batch_get(struct kvc_client *c, size_t n, const char *const *keys,
		  const struct kvc_iovec *const *iov, const size_t *n_iov, ssize_t *ret_results)
{
	struct batch_get g = { .keys = keys, .iov = iov, .n_iov = n_iov, .res = ret_results };
	int r;

	if (!c || (n && (!keys || !iov || !n_iov || !ret_results)))
		return -EINVAL;
	r = window_run(c, n, &get_ops, &g);
	for (size_t i = 0; r == 0 && i < g.n_again; i++) {
		struct batch_get one = g;

		one.map = &g.again[i];
		one.loaded = 0;
		r = window_run(c, 1, &get_ops, &one);
		g.loaded += one.loaded;
	}
	free(g.again);
	return r < 0 ? r : g.loaded;
}

/* ---- registered buffers ---- */

int kvc_buffer_alloc(struct kvc_client *c, size_t len, struct kvc_buffer *ret)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__BufferReq bq = KVC__BUFFER_REQ__INIT;
	Kvc__Response *resp;
	size_t n_fds = 0;
	int fd, r;
	void *base;
	uint64_t size, handle;

	if (!c || !ret || len == 0)
		return -EINVAL;
	bq.size = len;
	q.op = KVC__OP__OP_BUFFER_ALLOC;
	q.body_case = KVC__REQUEST__BODY_BUFFER;
	q.buffer = &bq;
	r = client_rpc_fds(c, &q, &resp, &fd, 1, &n_fds);
	if (r < 0)
		return r;
	size = resp->body_case == KVC__RESPONSE__BODY_EXTENT ? resp->extent->len : 0;
	handle = size ? resp->extent->handle : 0;
	kvc__response__free_unpacked(resp, NULL);
	if (n_fds != 1) {
		if (n_fds)
			close(fd);
		return -EPROTO;
	}
	if (size < len) {
		close(fd);
		return -EPROTO;
	}
	r = shm_memfd_map(fd, size, &base);
	if (r < 0)
		return r;
	*ret = (struct kvc_buffer) { .data = base, .len = len, .handle = handle };
	return 0;
}

int kvc_buffer_free(struct kvc_client *c, struct kvc_buffer *b)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__HandleReq hq = KVC__HANDLE_REQ__INIT;
	Kvc__Response *resp;
	int r;

	if (!c || !b || !b->handle)
		return -EINVAL;
	hq.handle = b->handle;
	q.op = KVC__OP__OP_BUFFER_FREE;
	q.body_case = KVC__REQUEST__BODY_HANDLE;
	q.handle = &hq;
	r = client_rpc(c, &q, &resp);
	if (r == 0)
		kvc__response__free_unpacked(resp, NULL);
	munmap(b->data, (b->len + 4095) & ~(size_t) 4095);
	*b = (struct kvc_buffer) { 0 };
	return r;
}

/* Fill descriptor e (tag t) for a GET_INTO or PUT_FROM op. */
static int prep_copy(struct kvc_client *c, uint32_t t, const struct kvc_op *op, struct shm_sqe *e)
{
	const struct kvc_put_opts *o = op->opcode == KVC_OP_PUT_FROM ? op->opts : NULL;
	struct kvc_iov one = { op->buf, op->offset, op->len };
	const struct kvc_iov *iov = op->n_iov ? op->iov : &one;
	size_t n = op->n_iov ? op->n_iov : 1;
	uint8_t *slot = chan_slot(&c->chan, t);
	uint32_t at;

	if (n > MAX_IOV || (op->n_iov && !op->iov))
		return -EINVAL;
	if (o && o->parent_key && client_check_key(o->parent_key) < 0)
		return -EINVAL;
	at = (uint32_t) chan_prep_key(&c->chan, t, e,
				      op->opcode == KVC_OP_PUT_FROM ? SHM_OP_PUT_FROM : SHM_OP_GET_INTO,
				      op->key, o ? o->parent_key : NULL);
	at = (at + 7) & ~7u;
	for (size_t i = 0; i < n; i++) {
		struct shm_iov v;

		if (!iov[i].buf || !iov[i].buf->handle)
			return -EINVAL;
		v = (struct shm_iov) { iov[i].buf->handle, iov[i].offset, iov[i].len };
		memcpy(slot + at + i * sizeof(v), &v, sizeof(v));
	}
	e->count = (uint32_t) n;
	e->list_off = chan_slot_off(t) + at;
	if (o) {
		e->put_flags = client_wire_put_flags(o->flags);
		e->pin_ttl_ms = o->pin_ttl_ms;
		e->tier = (int8_t) o->tier;
	}
	if (o && o->push_to) /* after the pieces; -EOPNOTSUPP: the daemon does not */
		return chan_push_to(&c->chan, t, e, at + (uint32_t) (n * sizeof(struct shm_iov)),
				    o->push_to);
	return 0;
}

static int prep_op(struct kvc_client *c, uint32_t t, const struct kvc_op *op, struct shm_sqe *e)
{
	if (client_check_key(op->key) < 0)
		return -EINVAL;
	switch (op->opcode) {
	case KVC_OP_GET_INTO:
	case KVC_OP_PUT_FROM:
		return prep_copy(c, t, op, e);
	case KVC_OP_EXISTS:
		chan_prep_key(&c->chan, t, e, SHM_OP_EXISTS, op->key, NULL);
		return 0;
	case KVC_OP_REMOVE:
		chan_prep_key(&c->chan, t, e, SHM_OP_REMOVE, op->key, NULL);
		return 0;
	default:
		return -EINVAL;
	}
}

ssize_t kvc_get_into(struct kvc_client *c, const char *key, const struct kvc_buffer *buf,
		     uint64_t offset, size_t cap)
{
	struct kvc_op op = { .opcode = KVC_OP_GET_INTO, .key = key, .buf = buf,
			     .offset = offset, .len = cap };
	struct shm_sqe e;
	uint32_t t;
	int r;

	if (!c || !buf)
		return -EINVAL;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return r;
	r = prep_op(c, t, &op, &e);
	if (r < 0) {
		chan_tag_put(&c->chan, t);
		return r;
	}
	return chan_call(c, &e, t, NULL);
}

int kvc_put_from(struct kvc_client *c, const char *key, const struct kvc_buffer *buf,
		 uint64_t offset, size_t len, const struct kvc_put_opts *opts)
{
	struct kvc_op op = { .opcode = KVC_OP_PUT_FROM, .key = key, .buf = buf,
			     .offset = offset, .len = len };
	struct kvc_put_opts plain;
	struct shm_sqe e;
	uint32_t t;
	int r;

	if (!c || !buf || len == 0)
		return -EINVAL;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return r;
	op.opts = opts_here(c, opts, &plain);
	r = prep_op(c, t, &op, &e);
	if (r < 0) {
		chan_tag_put(&c->chan, t);
		return r;
	}
	r = (int) chan_call(c, &e, t, NULL);
	if (r == 0 && op.opts != opts)
		r = kvc_push(c, key, opts->push_to);
	return r;
}

/* Registered-buffer copies for many keys, on sync tags. */
struct batch_copy {
	int opcode;
	const char *const *keys;
	const struct kvc_iov *const *iov;
	const size_t *n_iov;
	const struct kvc_put_opts *opts;
	const char *first_parent;
	int64_t *res;
	int ok;
};

static int copy_prep(struct kvc_client *c, void *u, size_t j, uint32_t t, struct shm_sqe *e)
{
	struct batch_copy *b = u;
	struct kvc_put_opts mine;
	struct kvc_op op = { .opcode = b->opcode, .key = b->keys[j], .iov = b->iov[j],
			     .n_iov = b->n_iov[j], .opts = b->opts };
	int r;

	if (b->opts && (b->opts->flags & KVC_PUT_CHAIN)) {
		mine = *b->opts;
		mine.parent_key = j ? b->keys[j - 1] : b->first_parent;
		op.opts = &mine;
	}
	if (b->n_iov[j] == 0) {
		b->res[j] = -EINVAL;
		return 0;
	}
	r = prep_op(c, t, &op, e);
	if (r < 0) {
		b->res[j] = r;
		return 0;
	}
	e->flags &= (uint8_t) ~SHM_SQE_WANT_MSG;
	return 1;
}

static int copy_done(struct kvc_client *c, void *u, size_t j, uint32_t t, int64_t r)
{
	struct batch_copy *b = u;

	(void) c;
	(void) t;
	b->res[j] = r;
	b->ok += r >= 0;
	return 0;
}

static const struct window_ops copy_ops = { .prep = copy_prep, .done = copy_done };

/* first_parent: keys[0]'s parent in a KVC_PUT_CHAIN batch (the caller's
 * key before this chunk, or parent_key). */
static int batch_copy(struct kvc_client *c, int opcode, size_t n, const char *const *keys,
		      const struct kvc_iov *const *iov, const size_t *n_iov,
		      const struct kvc_put_opts *opts, const char *first_parent, int64_t *res)
{
	struct batch_copy b = { .opcode = opcode, .keys = keys, .iov = iov, .n_iov = n_iov,
				.opts = opts, .first_parent = first_parent, .res = res };
	int r;

	if (!c || (n && (!keys || !iov || !n_iov || !res)))
		return -EINVAL;
	r = window_run(c, n, &copy_ops, &b);
	return r < 0 ? r : b.ok;
}

int kvc_batch_get_into(struct kvc_client *c, size_t n, const char *const *keys,
		       const struct kvc_iov *const *iov, const size_t *n_iov, ssize_t *ret_results)
{
	int ok;

	_Static_assert(sizeof(ssize_t) == sizeof(int64_t), "ssize_t results");
	ok = batch_copy(c, KVC_OP_GET_INTO, n, keys, iov, n_iov, NULL, NULL,
			(int64_t *) ret_results);
	/* a batch larger than dram: the read-backs that found no room while
	 * the others were copied go again, one at a time (as kvc_batch_get) */
	for (size_t j = 0; ok >= 0 && j < n; j++)
		if (ret_results[j] == -ENOSPC) {
			int r = batch_copy(c, KVC_OP_GET_INTO, 1, &keys[j], &iov[j], &n_iov[j], NULL,
					   NULL, (int64_t *) &ret_results[j]);

			ok = r < 0 ? r : ok + r;
		}
	return ok;
}

int kvc_batch_put_from(struct kvc_client *c, size_t n, const char *const *keys,
		       const struct kvc_iov *const *iov, const size_t *n_iov,
		       const struct kvc_put_opts *opts, int *ret_results)
{
	struct kvc_put_opts plain;
	const struct kvc_put_opts *here;
	bool push_after;
	int64_t *res;
	int ok;

	if (!ret_results && n)
		return -EINVAL;
	here = opts_here(c, opts, &plain);
	push_after = here != opts;
	res = calloc(n ? n : 1, sizeof(*res));
	if (!res)
		return -ENOMEM;
	ok = batch_copy(c, KVC_OP_PUT_FROM, n, keys, iov, n_iov, here,
			opts ? opts->parent_key : NULL, res);
	for (size_t i = 0; ok >= 0 && i < n; i++) {
		ret_results[i] = (int) res[i];
		if (push_after && res[i] == 0)
			ret_results[i] = kvc_push(c, keys[i], opts->push_to);
	}
	free(res);
	return ok;
}

/* ---- asynchronous operations ---- */

int kvc_submit(struct kvc_client *c, const struct kvc_op *ops, size_t n)
{
	struct shm_sqe e[64];
	size_t done = 0;

	if (!c || (n && !ops))
		return -EINVAL;
	while (done < n) {
		size_t m = 0;
		int r;

		while (done + m < n && m < 64) {
			const struct kvc_op *op = &ops[done + m];
			uint32_t t;

			r = chan_tag_get(c, TAG_ASYNC, false, &t);
			if (r < 0)
				break;
			r = prep_op(c, t, op, &e[m]);
			if (r < 0) {
				chan_tag_put(&c->chan, t);
				if (done + m == 0)
					return r;
				n = done + m; /* stop before the malformed one */
				break;
			}
			e[m].flags &= (uint8_t) ~SHM_SQE_WANT_MSG;
			c->chan.tags[t].user_data = op->user_data;
			m++;
		}
		if (m == 0)
			break;
		r = chan_submit(c, e, (uint32_t) m);
		if (r < 0)
			return done ? (int) done : r;
		done += m;
	}
	return done ? (int) done : -EAGAIN;
}

int kvc_poll(struct kvc_client *c, struct kvc_completion *ret, size_t max)
{
	if (!c || (max && !ret))
		return -EINVAL;
	return chan_pop_async(c, ret, max);
}

int kvc_wait(struct kvc_client *c, struct kvc_completion *ret, size_t min, size_t max,
	     int timeout_ms)
{
	usec_t deadline = 0;
	size_t got = 0;

	if (!c || !ret || min > max || max == 0)
		return -EINVAL;
	if (timeout_ms >= 0)
		deadline = mono_us() + (uint64_t) timeout_ms * USEC_PER_MSEC;
	for (;;) {
		int r = chan_pop_async(c, ret + got, max - got);
		int64_t left = -1;

		got += (size_t) r;
		if (got >= min && (got > 0 || min == 0))
			return (int) got;
		if (timeout_ms >= 0) {
			left = (int64_t) (deadline - mono_us());
			if (left <= 0)
				return got ? (int) got : -ETIMEDOUT;
		}
		r = chan_wait_async(c, left);
		if (r == -ECONNRESET)
			return got ? (int) got : r;
	}
}
