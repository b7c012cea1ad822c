/* SPDX-License-Identifier: MIT */
/*
 * Shared-memory channels: the fast path.  A client submits fixed-size
 * descriptors into its submission ring; the daemon's loop drains every
 * channel, runs the operations, and posts completions.  Neither side makes a
 * system call while the other is awake: the daemon rings a client's futex only
 * when that client said it sleeps, and a client writes the channel's eventfd
 * only when the daemon said it sleeps.
 *
 * Everything read from a channel is client-written: descriptors are copied
 * before use, and every offset, length, count and opcode is checked against
 * the channel's own bounds.  A client that breaks the rules gets errors, or
 * has its channel stopped; it cannot reach past its own memory.
 */
#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "handoff.h"
#include "log.h"
#include "ring.h"
#include "buffer.h"
#include "channel.h"
#include "copier.h"

#define LOG_TOPIC "channel"

/* Requests run per channel per round, so one busy client cannot starve the
 * others; and the keys they name (a batch exists or prefix lookup is one
 * request of hundreds: a client's 4096-key batch exists, nine requests
 * sent at once, kept the loop 2.5-3.5 ms in one round when they asked
 * another node). */
#define ROUND_BUDGET 64
#define ROUND_KEYS 1024

/* A request waiting for its object to come back from disk, or (space) a
 * put waiting for a spill to make room. */
struct parked {
	struct waiter w;             /* first: the fetch hands this back */
	struct parked *next, *prev;  /* in its channel */
	/* space: on sv->space_head; put_wait: on sv->put_wait_head */
	struct parked *snext, *sprev;
	bool space;
	bool put_wait;               /* a lookup waiting for a put in flight */
	bool far;                    /* waiting on another node */
	bool streamed;               /* told where its object lands (SHM_CQE_MORE) */
	usec_t deadline;             /* space: give up with -EAGAIN; put_wait: miss */
	struct channel *ch;
	struct shm_sqe e;
};

struct channel {
	struct channel *next, *prev; /* all channels of the daemon */
	bool settle;                 /* running a parked request again */
	bool put_waited;             /* ...that waited for a put: it waits no more */
	struct loop_source *bell;    /* efd in the loop: wakes it when it sleeps */
	struct parked *parked;
	unsigned n_far;              /* of them, waiting on another node */
	struct shm_cqe *backlog;     /* completions that found the ring full */
	size_t n_backlog, cap_backlog;
	struct session *s;
	int memfd, efd;
	uint8_t *base;
	struct ring_side sq, cq;     /* daemon: consumer of sq, producer of cq */
	uint8_t *arena;
	bool broken;
	bool cq_dirty;               /* completions posted since the last wake check */
};

static int channel_fail(struct channel *ch, const char *why)
{
	if (!ch->broken)
		log_notice("client[pid=%d,%s]: %s; channel stopped", (int) ch->s->pid, ch->s->name, why);
	ch->broken = true;
	ch->s->sv->stats.protocol_errors++;
	return -EPROTO;
}

/*
 * A channel's shared memory: a sealed memfd, mapped, its header written.
 * The mapping is made ahead of time on the mapper thread (mapper.h: an
 * mmap() on the loop waited 2-20 ms for page faults elsewhere in the
 * daemon), so a client that opens a channel finds one ready; only when
 * several open at once does the loop make one itself.
 */
#define SPARE_CHANNELS 2

struct chan_mem {
	struct chan_mem *next;
	struct server *sv;
	int memfd;
	uint8_t *base;
};

static int chan_mem_new(const struct config *cfg, int *ret_fd, uint8_t **ret_base)
{
	struct shm_chan_header *h;
	int r = shm_memfd_new("kvcache-channel", SHM_CHAN_SIZE, false, ret_fd, (void **) ret_base);

	if (r < 0)
		return r;
	h = (struct shm_chan_header *) *ret_base;
	*h = (struct shm_chan_header) {
		.version = SHM_CHAN_VERSION,
		/* tests: a daemon without them, as before SHM_SQE_PUSH or
		 * SHM_SQE_STREAM */
		.features = (cfg->test.no_channel_push ? 0 : SHM_CHAN_FEAT_PUSH) |
			    (cfg->test.no_channel_stream ? 0 : SHM_CHAN_FEAT_STREAM),
		.entries = SHM_CHAN_ENTRIES,
		.arena_slot = SHM_CHAN_ARENA_SLOT,
		.size = SHM_CHAN_SIZE,
		.sq_off = SHM_CHAN_SQ_OFF,
		.cq_off = SHM_CHAN_CQ_OFF,
		.sqes_off = SHM_CHAN_SQES_OFF,
		.cqes_off = SHM_CHAN_CQES_OFF,
		.arena_off = SHM_CHAN_ARENA_OFF,
		.arena_size = SHM_CHAN_ARENA_SIZE,
	};
	__atomic_store_n(&h->magic, SHM_CHAN_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/* Mapper thread: one spare; handed back even when it failed (base NULL),
 * so the loop knows the request ended. */
static void make_spare(void *arg)
{
	struct chan_mem *cm = arg;

	if (chan_mem_new(cm->sv->cfg, &cm->memfd, &cm->base) < 0)
		cm->base = NULL;
	handoff_push(&cm->sv->spares_ready, cm, next);
}

/* Loop: ask for spares up to SPARE_CHANNELS. */
static void ask_spares(struct server *sv)
{
	while (sv->n_spares + sv->spares_asked < SPARE_CHANNELS) {
		struct chan_mem *cm = calloc(1, sizeof(*cm));

		if (!cm)
			return;
		cm->sv = sv;
		cm->memfd = -1;
		if (mapper_call(sv->mapper, make_spare, cm) < 0) {
			free(cm);
			return;
		}
		sv->spares_asked++;
	}
}

/* Loop: a spare if the mapper made one, else one made here. */
static int chan_mem_take(struct server *sv, int *ret_fd, uint8_t **ret_base)
{
	struct chan_mem *l = handoff_take(&sv->spares_ready), *cm;
	int r;

	while (l) {
		cm = l;
		l = cm->next;
		sv->spares_asked--;
		if (!cm->base) {
			free(cm);
			continue;
		}
		cm->next = sv->spares;
		sv->spares = cm;
		sv->n_spares++;
	}
	cm = sv->spares;
	if (cm) {
		sv->spares = cm->next;
		sv->n_spares--;
		*ret_fd = cm->memfd;
		*ret_base = cm->base;
		free(cm);
		r = 0;
	} else
		r = chan_mem_new(sv->cfg, ret_fd, ret_base);
	ask_spares(sv);
	return r;
}

/* After the mapper stopped: the spares left are unmapped. */
void channel_spares_free(struct server *sv)
{
	struct chan_mem *l = handoff_take(&sv->spares_ready), *cm;

	while (l || sv->spares) {
		if (!l) {
			l = sv->spares;
			sv->spares = NULL;
		}
		cm = l;
		l = cm->next;
		if (cm->base) {
			munmap(cm->base, SHM_CHAN_SIZE);
			close(cm->memfd);
		}
		free(cm);
	}
	sv->n_spares = sv->spares_asked = 0;
}

int channel_open(struct session *s, int *ret_fds, char *msg)
{
	struct channel *ch;
	int r;

	if (s->n_channels == SESSION_MAX_CHANNELS) {
		snprintf(msg, STORE_MSG_MAX, "at most %d channels per connection", SESSION_MAX_CHANNELS);
		return -EMFILE;
	}
	if (s->sv->n_channels >= s->sv->cfg->max_channels) {
		snprintf(msg, STORE_MSG_MAX, "kvcached has %u channels open, its limit (--max-channels)",
			 s->sv->n_channels);
		s->sv->stats.refused_channels++;
		return -EMFILE;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->s = s;
	ch->efd = ch->memfd = -1;
	r = chan_mem_take(s->sv, &ch->memfd, &ch->base);
	if (r < 0)
		goto fail;
	ch->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ch->efd < 0) {
		r = -errno;
		goto fail;
	}
	ring_side_init(&ch->sq, (struct shm_ring *) (ch->base + SHM_CHAN_SQ_OFF),
		       ch->base + SHM_CHAN_SQES_OFF, sizeof(struct shm_sqe), SHM_CHAN_ENTRIES, 0);
	ring_side_init(&ch->cq, (struct shm_ring *) (ch->base + SHM_CHAN_CQ_OFF),
		       ch->base + SHM_CHAN_CQES_OFF, sizeof(struct shm_cqe), SHM_CHAN_ENTRIES, 0);
	ch->arena = ch->base + SHM_CHAN_ARENA_OFF;
	r = loop_add_doorbell(s->sv->loop, ch->efd, &ch->bell);
	if (r < 0)
		goto fail;
	/* Start awake: the client's first request needs no doorbell if the
	 * loop is spinning, and the loop sets the flag before it sleeps. */
	s->channels[s->n_channels++] = ch;
	s->sv->n_channels++;
	ch->next = s->sv->channels;
	if (ch->next)
		ch->next->prev = ch;
	s->sv->channels = ch;
	ret_fds[0] = ch->memfd;
	ret_fds[1] = ch->efd;
	return 0;
fail:
	if (ch->efd >= 0)
		close(ch->efd);
	if (ch->base)
		unmap_later(s->sv->mapper, ch->base, SHM_CHAN_SIZE, ch->memfd);
	free(ch);
	return r;
}

/* The server's lists of waiting requests (puts waiting for space, lookups
 * waiting for a put), on snext/sprev: a request is on one at most. */
static void plist_unlink(struct parked **head, struct parked **tail, struct parked *p)
{
	if (p->sprev)
		p->sprev->snext = p->snext;
	else
		*head = p->snext;
	if (p->snext)
		p->snext->sprev = p->sprev;
	else
		*tail = p->sprev;
	p->snext = p->sprev = NULL;
}

static void plist_append(struct parked **head, struct parked **tail, struct parked *p)
{
	p->snext = NULL;
	p->sprev = *tail;
	if (*tail)
		(*tail)->snext = p;
	else
		*head = p;
	*tail = p;
}

static void space_unlink(struct server *sv, struct parked *p)
{
	plist_unlink(&sv->space_head, &sv->space_tail, p);
}

static void space_append(struct server *sv, struct parked *p)
{
	plist_append(&sv->space_head, &sv->space_tail, p);
}

static void put_wait_unlink(struct server *sv, struct parked *p)
{
	plist_unlink(&sv->put_wait_head, &sv->put_wait_tail, p);
}

void channel_close(struct channel *ch)
{
	while (ch->parked) {
		struct parked *p = ch->parked;

		ch->parked = p->next;
		if (p->space) {
			space_unlink(ch->s->sv, p);
		} else {
			if (p->put_wait)
				put_wait_unlink(ch->s->sv, p);
			fetch_unwait(&p->w);
		}
		free(p);
	}
	free(ch->backlog);
	ch->s->sv->n_channels--;
	if (ch->prev)
		ch->prev->next = ch->next;
	else
		ch->s->sv->channels = ch->next;
	if (ch->next)
		ch->next->prev = ch->prev;
	loop_source_free(ch->bell);
	close(ch->efd);
	unmap_later(ch->s->sv->mapper, ch->base, SHM_CHAN_SIZE, ch->memfd);
	free(ch);
}

/* The bytes [off, off + len) of the arena, or NULL when out of bounds. */
static const uint8_t *arena_span(struct channel *ch, uint64_t off, uint64_t len)
{
	if (off > SHM_CHAN_ARENA_SIZE || len > SHM_CHAN_ARENA_SIZE - off)
		return NULL;
	return ch->arena + off;
}

/* Copy a key out of the arena, so the client cannot change it under us. */
static int arena_key(struct channel *ch, uint32_t off, uint32_t len, char *buf)
{
	const uint8_t *p;

	if (len == 0 || len > WIRE_MAX_KEY)
		return -EINVAL;
	p = arena_span(ch, off, len);
	if (!p)
		return -EFAULT;
	memcpy(buf, p, len);
	buf[len] = '\0';
	if (memchr(buf, '\0', len))
		return -EINVAL;
	return 0;
}

/* With SHM_SQE_PUSH: the node id it names, NUL-terminated, into buf. */
static int arena_node(struct channel *ch, const struct shm_sqe *e, char buf[WIRE_MAX_NODE + 1])
{
	const uint8_t *p;

	if (!(e->flags & SHM_SQE_PUSH))
		return 0;
	if (e->opcode != SHM_OP_COMMIT && e->opcode != SHM_OP_PUT_FROM)
		return -EINVAL;
	if (e->push_len == 0 || e->push_len > WIRE_MAX_NODE)
		return -EINVAL;
	p = arena_span(ch, e->push_off, e->push_len);
	if (!p)
		return -EFAULT;
	memcpy(buf, p, e->push_len);
	buf[e->push_len] = '\0';
	return memchr(buf, '\0', e->push_len) ? -EINVAL : 0;
}

/* A put that named a node to push to, once stored (r 0): the push's
 * result, with the put standing whatever it is. */
static int64_t then_push(struct channel *ch, const struct shm_sqe *e, const char *key,
			 size_t key_len, int64_t r, char *msg)
{
	char node[WIRE_MAX_NODE + 1];

	if (r != 0 || !(e->flags & SHM_SQE_PUSH))
		return r;
	r = arena_node(ch, e, node); /* checked before the put: still good */
	return r < 0 ? r : server_push(ch->s->sv, key, key_len, node, msg);
}

static int run_keys(struct channel *ch, const struct shm_sqe *e, bool prefix,
		    struct fetch **ret_fetch)
{
	struct shm_key_ref refs[64];
	char key[WIRE_MAX_KEY + 1], *mkeys = NULL;
	const char **mkp = NULL;
	size_t *mlens = NULL;
	uint8_t *out = NULL, *here = NULL;
	uint32_t *missing = NULL, n_missing = 0;
	uint32_t count = 0;
	bool cluster = store_looks_elsewhere(ch->s->sv->st) && !(e->flags & SHM_SQE_LOCAL_ONLY);
	int r = 0;

	if (e->count > WIRE_MAX_BATCH)
		return -EINVAL;
	if (!arena_span(ch, e->list_off, (uint64_t) e->count * sizeof(refs[0])))
		return -EFAULT;
	if (!prefix) {
		out = (uint8_t *) arena_span(ch, e->out_off, e->count);
		if (!out)
			return -EFAULT;
	}
	if (cluster) {
		here = calloc(e->count ? e->count : 1, 1);
		missing = calloc(e->count ? e->count : 1, sizeof(*missing));
		/* the keys missing here, kept for the question to the cluster */
		mkeys = malloc((size_t) (e->count ? e->count : 1) * (WIRE_MAX_KEY + 1));
		mkp = malloc((size_t) (e->count ? e->count : 1) * sizeof(*mkp));
		mlens = malloc((size_t) (e->count ? e->count : 1) * sizeof(*mlens));
		if (!here || !missing || !mkeys || !mkp || !mlens) {
			r = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0; i < e->count; i += 64) {
		uint32_t k = e->count - i < 64 ? e->count - i : 64;

		memcpy(refs, ch->arena + e->list_off + (uint64_t) i * sizeof(refs[0]), k * sizeof(refs[0]));
		for (uint32_t j = 0; j < k; j++) {
			bool hit;

			r = arena_key(ch, refs[j].off, refs[j].len, key);
			if (r < 0)
				goto out;
			hit = store_exists(ch->s->sv->st, key, refs[j].len, prefix,
					   e->flags & SHM_SQE_PEEK);
			if (!hit && !ch->settle && !ch->put_waited &&
			    store_put_in_flight(ch->s->sv->st, key, refs[j].len, &ch->s->h,
					ret_fetch) == 0) {
				r = -EINPROGRESS; /* being stored: wait for its commit */
				goto out;
			}
			if (cluster) {
				here[i + j] = hit;
				if (!hit) {
					char *mk = mkeys + (size_t) n_missing * (WIRE_MAX_KEY + 1);

					memcpy(mk, key, refs[j].len + 1u);
					mkp[n_missing] = mk;
					mlens[n_missing] = refs[j].len;
					missing[n_missing++] = i + j;
				}
				continue;
			}
			count += hit;
			if (out)
				out[i + j] = hit;
			else if (!hit) {
				r = (int) count;
				goto out;
			}
		}
	}
	if (!cluster) {
		r = (int) count;
		goto out;
	}
	if (n_missing) {
		/* one question for every key missing here: 0 with there[]
		 * filled, or -EINPROGRESS with *ret_fetch to wait on */
		uint8_t *there = calloc(n_missing, 1);

		r = there ? store_where(ch->s->sv->st, mkp, mlens, n_missing, there, ch->settle,
					ret_fetch)
			  : -ENOMEM;
		for (uint32_t m = 0; r == 0 && m < n_missing; m++)
			here[missing[m]] = there[m];
		free(there);
		if (r < 0)
			goto out;
	}
	for (uint32_t i = 0; i < e->count; i++) {
		if (out)
			out[i] = here[i];
		else if (!here[i])
			break;
		count += here[i];
	}
	r = (int) count;
out:
	free(here);
	free(missing);
	free(mkeys);
	free(mkp);
	free(mlens);
	return r;
}

#define MAX_IOVS 1024

/*
 * The iov list of a get_into/put_from, copied out of the arena once: the
 * client may rewrite the arena at any time, so the list that sized the
 * object must be the list that fills it.  *ret_total is its byte count.
 */
static int load_iovs(struct channel *ch, const struct shm_sqe *e, struct shm_iov *iovs,
		     uint64_t *ret_total)
{
	uint64_t total = 0;

	if (e->count == 0 || e->count > MAX_IOVS)
		return -EINVAL;
	if (!arena_span(ch, e->list_off, (uint64_t) e->count * sizeof(*iovs)))
		return -EFAULT;
	memcpy(iovs, ch->arena + e->list_off, (size_t) e->count * sizeof(*iovs));
	for (uint32_t i = 0; i < e->count; i++) {
		if (iovs[i].len > (UINT64_C(1) << 30) || total + iovs[i].len > (UINT64_C(1) << 30))
			return -E2BIG;
		total += iovs[i].len;
	}
	*ret_total = total;
	return 0;
}

/* The registered-buffer pieces of an iov list that cover obj_len bytes,
 * each checked: 0, or -EFAULT when they do not cover every byte. */
static int resolve_pieces(struct channel *ch, const struct shm_iov *iovs, uint32_t n,
			  uint64_t obj_len, struct copy_piece *pieces, uint32_t *ret_n)
{
	uint64_t done = 0;
	uint32_t k = 0;

	for (uint32_t i = 0; i < n && done < obj_len; i++) {
		uint64_t len = iovs[i].len < obj_len - done ? iovs[i].len : obj_len - done;
		struct buffer *b = NULL;
		uint8_t *p = buffer_span(ch->s, iovs[i].buffer, iovs[i].off, len, &b);

		if (!p)
			return -EFAULT;
		pieces[k++] = (struct copy_piece) { p, len, b };
		done += len;
	}
	*ret_n = k;
	return done == obj_len ? 0 : -EFAULT;
}

/* Loop thread only: one list at a time. */
static struct shm_iov iov_scratch[MAX_IOVS];
static struct copy_piece piece_scratch[MAX_IOVS];

/* Copy between an object and registered-buffer pieces, here on the loop;
 * every byte of the object or -EFAULT. */
static int copy_iovs(struct channel *ch, const struct shm_iov *iovs, uint32_t n, uint8_t *obj,
		     uint64_t obj_len, bool to_obj)
{
	uint32_t k;
	int r = resolve_pieces(ch, iovs, n, obj_len, piece_scratch, &k);

	if (r == 0)
		copy_pieces(piece_scratch, k, obj, to_obj);
	return r;
}

/*
 * A copy of obj_len bytes for the copier: the pieces of the iov list that
 * cover them, each checked and its buffer counted; -EFAULT as copy_iovs(),
 * or -ENOMEM.  The caller fills in the handle and submits it.
 */
static void channel_copy_done(struct copy_job *j, int64_t r, const char *msg);

static int copy_job_new(struct channel *ch, const struct shm_sqe *e, const struct shm_iov *iovs,
			uint8_t *obj, uint64_t obj_len, bool put, struct copy_job **ret)
{
	struct copy_job *j = calloc(1, sizeof(*j) + e->count * sizeof(j->pieces[0]));

	if (!j)
		return -ENOMEM;
	if (resolve_pieces(ch, iovs, e->count, obj_len, j->pieces, &j->n) < 0) {
		free(j);
		return -EFAULT;
	}
	for (uint32_t i = 0; i < j->n; i++)
		j->pieces[i].b->copies++;
	j->s = ch->s;
	j->answer = channel_copy_done;
	j->ch = ch;
	j->e = *e;
	j->put = put;
	j->obj = obj;
	j->len = obj_len;
	*ret = j;
	return 0;
}

/* A job made but not submitted. */
static void copy_job_drop(struct copy_job *j)
{
	for (uint32_t i = 0; i < j->n; i++)
		j->pieces[i].b->copies--;
	free(j);
}

/* Whether a copy of len bytes goes to the copier (session.h); if not, the
 * loop counts it. */
static bool offload(struct server *sv, uint64_t len)
{
	if (len >= COPY_OFFLOAD || (len >= COPY_MIN && sv->copied_inline >= COPY_TURN_BUDGET))
		return true;
	sv->copied_inline += len;
	return false;
}

/* run()'s result for a request the copier answers (no errno). */
#define COPYING ((int64_t) -0x10000)

static int64_t run_get_into(struct channel *ch, const struct shm_sqe *e, const char *key,
			    struct fetch **ret_fetch, char *msg)
{
	struct session *s = ch->s;
	struct server *sv = s->sv;
	struct copy_job *j = NULL;
	struct extent x, y;
	struct fetch *f = NULL;
	uint64_t cap;
	int64_t r;

	r = load_iovs(ch, e, iov_scratch, &cap);
	if (r < 0)
		return r;
	r = store_acquire(&s->h, key, e->key_len, e->flags & SHM_SQE_LOCAL_ONLY, &x, ret_fetch, msg);
	if (r < 0)
		return r;
	if (x.len > cap) {
		store_release(&s->h, x.handle, msg);
		return -ENOBUFS;
	}
	/* large: the copier's, under a view of its own that no client handle
	 * names (the object is here now: the second acquire is a hit) */
	if (offload(sv, x.len) &&
	    copy_job_new(ch, e, iov_scratch, store_extent_ptr(sv->st, &x), x.len, false, &j) == 0) {
		if (store_acquire(&sv->copy_h, key, e->key_len, true, &y, &f, msg) == 0 &&
		    y.segment == x.segment && y.offset == x.offset && y.len == x.len) {
			store_release(&s->h, x.handle, msg);
			j->handle = y.handle;
			copier_submit(sv, j);
			return COPYING;
		}
		copy_job_drop(j);
	}
	r = copy_iovs(ch, iov_scratch, e->count, store_extent_ptr(sv->st, &x), x.len, false);
	store_release(&s->h, x.handle, msg);
	return r < 0 ? r : (int64_t) x.len;
}

static int64_t run_put_from(struct channel *ch, const struct shm_sqe *e, const char *key,
			    const char *parent, char *msg)
{
	struct session *s = ch->s;
	struct put_args a = {
		.key = key,
		.key_len = e->key_len,
		.flags = e->put_flags,
		.parent = parent,
		.parent_len = parent ? e->key2_len : 0,
		.pin_ttl = e->pin_ttl_ms * USEC_PER_MSEC,
		.tier = e->tier,
	};
	struct extent x;
	int64_t r;

	r = load_iovs(ch, e, iov_scratch, &a.len);
	if (r < 0)
		return r;
	if (a.len == 0)
		return -EINVAL;
	if (offload(s->sv, a.len)) {
		/* large: the copier's, the reservation held where no client
		 * handle can abort or commit it meanwhile */
		struct copy_job *j;

		r = copy_job_new(ch, e, iov_scratch, NULL, a.len, true, &j);
		if (r < 0)
			return r;
		r = store_reserve(&s->sv->copy_h, &a, &x, msg);
		if (r < 0) {
			copy_job_drop(j);
			return r;
		}
		j->obj = store_extent_ptr(s->sv->st, &x);
		j->handle = x.handle;
		copier_submit(s->sv, j);
		return COPYING;
	}
	r = store_reserve(&s->h, &a, &x, msg);
	if (r < 0)
		return r;
	r = copy_iovs(ch, iov_scratch, e->count, store_extent_ptr(s->sv->st, &x), x.len, true);
	if (r < 0) {
		store_abort(&s->h, x.handle, msg);
		return r;
	}
	r = store_commit(&s->h, x.handle, msg);
	return then_push(ch, e, key, e->key_len, r, msg);
}

/* Run one descriptor (already copied out of the ring).  -EINPROGRESS:
 * *ret_fetch is what it waits for (the object comes back from below). */
static int64_t run(struct channel *ch, const struct shm_sqe *e, struct shm_cqe *c,
		   struct fetch **ret_fetch, char *msg)
{
	struct session *s = ch->s;
	char key[WIRE_MAX_KEY + 1], parent[WIRE_MAX_KEY + 1];
	bool has_parent = false;
	struct extent x;
	int64_t r;

	switch (e->opcode) {
	case SHM_OP_EXISTS:
	case SHM_OP_ACQUIRE:
	case SHM_OP_RESERVE:
	case SHM_OP_REMOVE:
	case SHM_OP_GET_INTO:
	case SHM_OP_PUT_FROM:
		r = arena_key(ch, e->key_off, e->key_len, key);
		if (r < 0)
			return r;
		if (e->key2_len) {
			r = arena_key(ch, e->key2_off, e->key2_len, parent);
			if (r < 0)
				return r;
			has_parent = true;
		}
		break;
	default:
		break;
	}
	if (e->flags & SHM_SQE_PUSH) {
		char node[WIRE_MAX_NODE + 1];

		r = arena_node(ch, e, node); /* a bad one refuses the put */
		if (r < 0)
			return r;
	}

	switch (e->opcode) {
	case SHM_OP_NOP:
		return 0;
	case SHM_OP_EXISTS: {
		uint8_t there = 0;
		size_t len = e->key_len;
		const char *kp = key;

		if (store_exists(s->sv->st, key, e->key_len, false, e->flags & SHM_SQE_PEEK))
			return 1;
		if (!ch->settle && !ch->put_waited &&
		    store_put_in_flight(s->sv->st, key, e->key_len, &s->h, ret_fetch) == 0)
			return -EINPROGRESS; /* being stored: wait for its commit */
		if (!store_looks_elsewhere(s->sv->st) || (e->flags & SHM_SQE_LOCAL_ONLY))
			return 0; /* a single node, or this one alone: a miss is a miss */
		r = store_where(s->sv->st, &kp, &len, 1, &there, ch->settle, ret_fetch);
		return r < 0 ? r : there;
	}
	case SHM_OP_ACQUIRE:
		r = store_acquire(&s->h, key, e->key_len, e->flags & SHM_SQE_LOCAL_ONLY, &x, ret_fetch, msg);
		break;
	case SHM_OP_RELEASE:
		return store_release(&s->h, e->arg, msg);
	case SHM_OP_RESERVE: {
		struct put_args a = {
			.key = key,
			.key_len = e->key_len,
			.len = e->arg,
			.flags = e->put_flags,
			.parent = has_parent ? parent : NULL,
			.parent_len = has_parent ? e->key2_len : 0,
			.pin_ttl = e->pin_ttl_ms * USEC_PER_MSEC,
			.tier = e->tier,
		};

		if (e->arg == 0)
			return -EINVAL;
		r = store_reserve(&s->h, &a, &x, msg);
		break;
	}
	case SHM_OP_COMMIT: {
		char k[WIRE_MAX_KEY + 1];
		size_t klen = 0;

		if ((e->flags & SHM_SQE_PUSH) && store_reserved_key(&s->h, e->arg, k, &klen) < 0)
			return store_commit(&s->h, e->arg, msg); /* says why */
		r = store_commit(&s->h, e->arg, msg);
		return then_push(ch, e, k, klen, r, msg);
	}
	case SHM_OP_ABORT:
		return store_abort(&s->h, e->arg, msg);
	case SHM_OP_REMOVE:
		if (e->arg & ~(uint64_t) WIRE_REMOVE_KNOWN)
			return -EINVAL;
		return store_remove(s->sv->st, key, e->key_len, e->arg & WIRE_REMOVE_FORCE,
				    e->flags & SHM_SQE_LOCAL_ONLY, msg);
	case SHM_OP_BATCH_EXISTS:
		return run_keys(ch, e, false, ret_fetch);
	case SHM_OP_PREFIX_LOOKUP:
		return run_keys(ch, e, true, ret_fetch);
	case SHM_OP_GET_INTO:
		return run_get_into(ch, e, key, ret_fetch, msg);
	case SHM_OP_PUT_FROM:
		return run_put_from(ch, e, key, has_parent ? parent : NULL, msg);
	default:
		return -EOPNOTSUPP;
	}
	if (r == 0) {
		c->handle = x.handle;
		c->segment = x.segment;
		c->offset = x.offset;
		c->len = x.len;
	}
	return r;
}

static void ophist_add(struct ophist *h, uint64_t ns)
{
	unsigned i = 0;

	while (i < OPHIST_BUCKETS - 1 && ns > ophist_bounds_ns[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum_ns += ns;
}

static void wake_client(struct channel *ch)
{
	if (ch->cq_dirty && ring_peer_sleeping(ch->cq.r)) {
		/* The client sleeps on cq.futex: clear its flag (each sleeper
		 * sets it again, then re-checks), bump the word, wake it. */
		ring_set_need_wakeup(ch->cq.r, false);
		__atomic_add_fetch(&ch->cq.r->futex, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &ch->cq.r->futex, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
	}
	ch->cq_dirty = false;
}

static void post(struct channel *ch, const struct shm_cqe *c)
{
	if (ch->n_backlog == 0 && ring_space(&ch->cq) > 0) {
		memcpy(ring_entry(&ch->cq, ch->cq.pos), c, sizeof(*c));
		ring_publish(&ch->cq, 1);
		ch->cq_dirty = true;
		return;
	}
	if (ch->n_backlog == ch->cap_backlog) {
		size_t cap = ch->cap_backlog ? ch->cap_backlog * 2 : 16;
		struct shm_cqe *b = realloc(ch->backlog, cap * sizeof(*b));

		if (!b) {
			channel_fail(ch, "out of memory for completions");
			return;
		}
		ch->backlog = b;
		ch->cap_backlog = cap;
	}
	ch->backlog[ch->n_backlog++] = *c;
}

static void drain_backlog(struct channel *ch)
{
	size_t done = 0;

	while (done < ch->n_backlog && ring_space(&ch->cq) > 0) {
		memcpy(ring_entry(&ch->cq, ch->cq.pos), &ch->backlog[done++], sizeof(struct shm_cqe));
		ring_publish(&ch->cq, 1);
		ch->cq_dirty = true;
	}
	if (done) {
		memmove(ch->backlog, ch->backlog + done, (ch->n_backlog - done) * sizeof(*ch->backlog));
		ch->n_backlog -= done;
	}
}

static void complete(struct channel *ch, const struct shm_sqe *e, struct shm_cqe *c, int64_t r,
		     const char *msg)
{
	if (r < 0 && r != -ENOENT && r != -EEXIST)
		store_stats(ch->s->sv->st)->errors++;
	if (r < 0 && msg[0] && (e->flags & SHM_SQE_WANT_MSG) && arena_span(ch, e->msg_off, SHM_MSG_MAX))
		snprintf((char *) ch->arena + e->msg_off, SHM_MSG_MAX, "%s", msg);
	if (r >= 0 && (e->flags & SHM_SQE_NO_CQE))
		return;
	c->user_data = e->user_data;
	c->res = r;
	post(ch, c);
}

static void park(struct channel *ch, const struct shm_sqe *e, struct fetch *f);

static void unpark(struct parked *p)
{
	struct channel *ch = p->ch;

	if (p->prev)
		p->prev->next = p->next;
	else
		ch->parked = p->next;
	if (p->next)
		p->next->prev = p->prev;
	if (p->far)
		__atomic_store_n(&ch->cq.r->far, --ch->n_far, __ATOMIC_RELAXED);
}


/* The object a parked request waited for is in dram (res 0) or is not
 * coming (res < 0), or a place to ask the directory came free
 * (FETCH_AGAIN), or the put a lookup waited for landed (FETCH_PUT_LANDED;
 * also when its wait is over): run the request again, or fail it. */
static void unparked(struct waiter *w, int res)
{
	struct parked *p = (struct parked *) w;
	struct channel *ch = p->ch;
	char msg[STORE_MSG_MAX] = "";
	struct shm_cqe c = { 0 };
	struct fetch *f = NULL;
	int64_t r = res;

	if (res == FETCH_PUT_LANDED && p->put_wait) {
		/* the put landed within the wait: the lookup runs again and
		 * waits in its place for the next put in flight it meets,
		 * until the same deadline; a prefill storing a prompt's blocks
		 * one commit at a time is found whole, not its first block */
		r = run(ch, &p->e, &c, &f, msg);
		if (r == -EINPROGRESS && f && f->o && (f->o->flags & OBJ_IN_FLIGHT)) {
			fetch_wait(f, &p->w);
			return;
		}
		unpark(p);
		put_wait_unlink(ch->s->sv, p);
	} else {
		unpark(p);
		if (p->put_wait)
			put_wait_unlink(ch->s->sv, p);
		if (res == 0 || res == FETCH_AGAIN || res == FETCH_PUT_LANDED) {
			/* a directory question is asked once per request (it
			 * waited for a place to ask it in: it asks now); a
			 * lookup whose wait for a put is over waits for none
			 * again */
			ch->settle = res == 0;
			ch->put_waited = res == FETCH_PUT_LANDED;
			r = run(ch, &p->e, &c, &f, msg);
			ch->settle = ch->put_waited = false;
		} else if (res == -EBADMSG)
			snprintf(msg, sizeof(msg),
				 "the object's record on disk is damaged; it was dropped");
		else if (fetch_error_msg(res))
			snprintf(msg, sizeof(msg), "%s", fetch_error_msg(res));
	}
	if (r == -EINPROGRESS && f)
		park(ch, &p->e, f); /* evicted again before it ran: wait again */
	else if (r != COPYING) /* else the copier answers */
		complete(ch, &p->e, &c, r == -EINPROGRESS ? -EIO : r, msg);
	free(p);
	wake_client(ch);
	/* a client with more requests waiting on another node waits for
	 * those, not for the loop: no window to spin in (on a two-CPU node
	 * the spin took the CPU the fetches' threads and the client needed) */
	if (!ch->n_far)
		loop_client_turn(ch->s->sv->loop, LOOP_CLIENT_ANSWERED, ch);
}

/* A request that waits: on the channel's list, or completed with -ENOMEM
 * (NULL). */
static struct parked *parked_new(struct channel *ch, const struct shm_sqe *e)
{
	struct parked *p = calloc(1, sizeof(*p));

	if (!p) {
		struct shm_cqe c = { 0 };

		complete(ch, e, &c, -ENOMEM, "");
		return NULL;
	}
	p->ch = ch;
	p->e = *e;
	p->next = ch->parked;
	if (p->next)
		p->next->prev = p;
	ch->parked = p;
	return p;
}

/* An acquire asked with SHM_SQE_STREAM: where its object lands, and the
 * word that counts its bytes in, so the client copies behind them. */
static void parked_landing(struct waiter *w, const struct fetch *f)
{
	struct parked *p = (struct parked *) w;
	struct channel *ch = p->ch;
	struct shm_cqe c = {
		.user_data = p->e.user_data,
		.flags = SHM_CQE_MORE,
		.segment = f->stream.segment,
		.offset = f->stream.offset,
		.len = f->stream.len,
		.reserved = { f->stream.slot, f->stream.word0 },
	};

	if (p->streamed || ch->broken)
		return;
	p->streamed = true;
	post(ch, &c);
	ch->s->sv->stats.gets_streamed++;
	wake_client(ch);
}

static void park(struct channel *ch, const struct shm_sqe *e, struct fetch *f)
{
	struct server *sv = ch->s->sv;
	struct parked *p = parked_new(ch, e);

	if (!p)
		return;
	p->w.done = unparked;
	p->far = f->far;
	if (p->far)
		__atomic_store_n(&ch->cq.r->far, ++ch->n_far, __ATOMIC_RELAXED);
	fetch_wait(f, &p->w);
	if (p->far && e->opcode == SHM_OP_ACQUIRE && (e->flags & SHM_SQE_STREAM) &&
	    !(e->flags & SHM_SQE_NO_CQE)) {
		p->w.landing = parked_landing;
		if (f->stream.on)
			parked_landing(&p->w, f);
	}
	if (f->o && (f->o->flags & OBJ_IN_FLIGHT)) {
		/* a lookup waiting for a put: a miss at its deadline (the same
		 * wait for every one: the list stays in deadline order) */
		p->put_wait = true;
		p->deadline = store_now(sv->st) + sv->cfg->lookup_wait_ms * USEC_PER_MSEC;
		plist_append(&sv->put_wait_head, &sv->put_wait_tail, p);
		if (sv->put_wait_head == p && sv->put_wait_timer)
			loop_timer_arm(sv->put_wait_timer, p->deadline);
	}
}

/* Lookups whose put did not land in time: they miss (they run again, and
 * wait no more). */
static unsigned expire_put_waits(struct server *sv)
{
	unsigned n = 0;

	while (sv->put_wait_head && sv->put_wait_head->deadline <= store_now(sv->st)) {
		struct parked *p = sv->put_wait_head;

		put_wait_unlink(sv, p);
		p->put_wait = false;
		fetch_unwait(&p->w);
		unparked(&p->w, FETCH_PUT_LANDED);
		n++;
	}
	if (sv->put_wait_timer) /* the first deadline now (the head may have changed) */
		loop_timer_arm(sv->put_wait_timer, sv->put_wait_head ? sv->put_wait_head->deadline : 0);
	return n;
}

static bool is_put(const struct shm_sqe *e)
{
	return e->opcode == SHM_OP_RESERVE || e->opcode == SHM_OP_PUT_FROM;
}

/* A put that must wait for a spill (back-pressure from the disk tier). */
static void park_space(struct channel *ch, const struct shm_sqe *e)
{
	struct server *sv = ch->s->sv;
	struct parked *p = parked_new(ch, e);

	if (!p)
		return;
	p->space = true;
	p->deadline = store_now(sv->st) + sv->cfg->spill_wait_ms * USEC_PER_MSEC;
	sv->stats.spill_waits++;
	space_append(sv, p);
	if (!sv->space_head->snext)
		loop_timer_arm(sv->space_timer, p->deadline); /* wake a sleeping loop then */
}

/* Puts waiting for space: run again after a spill ended, in arrival order;
 * give up at their deadline. */
static unsigned retry_space(struct server *sv)
{
	struct parked *list = sv->space_head;
	unsigned n = 0;

	if (!list || (!sv->space_freed && store_now(sv->st) < list->deadline))
		return 0;
	sv->space_freed = false;
	sv->space_head = sv->space_tail = NULL;
	while (list) {
		struct parked *p = list;
		struct channel *ch = p->ch;
		char msg[STORE_MSG_MAX] = "";
		struct shm_cqe c = { 0 };
		struct fetch *f = NULL; /* puts never wait on one */
		int64_t r;

		list = p->snext;
		p->snext = p->sprev = NULL;
		r = run(ch, &p->e, &c, &f, msg);
		if (r == -EAGAIN && store_now(sv->st) < p->deadline) {
			space_append(sv, p);
			continue;
		}
		unpark(p);
		if (r != COPYING) /* else the copier answers */
			complete(ch, &p->e, &c, r, msg);
		free(p);
		wake_client(ch);
		loop_client_turn(sv->loop, LOOP_CLIENT_ANSWERED, ch);
		n++;
	}
	loop_timer_arm(sv->space_timer, sv->space_head ? sv->space_head->deadline : 0);
	return n;
}

/* Drain one channel, within the round's budget. */
static unsigned poll_channel(struct channel *ch)
{
	char msg[STORE_MSG_MAX];
	unsigned done = 0, keys = 0;
	bool waits = false;
	int64_t ready;

	if (ch->broken)
		return 0;
	if (ch->n_backlog)
		drain_backlog(ch);
	ready = ring_ready(&ch->sq);
	if (ready < 0) {
		channel_fail(ch, "submission ring tail out of range");
		return 0;
	}
	while (ready > 0 && done < ROUND_BUDGET && keys < ROUND_KEYS) {
		struct shm_sqe e;
		struct shm_cqe c = { 0 };
		struct fetch *f;
		int64_t r;

		/* Every request may need a completion slot; wait for one rather
		 * than drop it.  A client that never reaps stalls only itself. */
		if (ring_space(&ch->cq) == 0 || ch->n_backlog)
			break;
		memcpy(&e, ring_entry(&ch->sq, ch->sq.pos), sizeof(e));
		ring_consume(&ch->sq, 1);
		ready--;
		if (e.opcode == SHM_OP_BATCH_EXISTS || e.opcode == SHM_OP_PREFIX_LOOKUP)
			keys += e.count < ROUND_KEYS ? e.count : ROUND_KEYS;
		else
			keys++;
		msg[0] = '\0';
		f = NULL;
		if (++ch->s->sv->ophist_tick % OPHIST_SAMPLE == 0 && e.opcode < SHM_OP_MAX) {
			uint64_t t0 = mono_ns();

			r = run(ch, &e, &c, &f, msg);
			ophist_add(&ch->s->sv->ophist[e.opcode], mono_ns() - t0);
		} else {
			r = run(ch, &e, &c, &f, msg);
		}
		/* waits: its client now waits far longer than a wake-up
		 * (another node, room for a put, a copy on the copier); a disk
		 * read is short enough to spin through */
		waits = true;
		if (r == -EINPROGRESS && f) {
			park(ch, &e, f);
			waits = f->far;
		} else if (r == -EAGAIN && is_put(&e) && ch->s->sv->cfg->spill_wait_ms) {
			park_space(ch, &e);
		} else if (r == COPYING) {
			; /* the copier answers */
		} else {
			complete(ch, &e, &c, r == -EINPROGRESS ? -EIO : r, msg);
			waits = false;
		}
		done++;
	}
	/* its last request decides; a client with requests waiting on
	 * another node waits for those (see unparked()) */
	if (done)
		loop_client_turn(ch->s->sv->loop,
				 waits || ch->n_far ? LOOP_CLIENT_WAITS : LOOP_CLIENT_ASKED, ch);
	if (done && !waits) {
		/* answered at once, to a client that spins for it: the CPU it
		 * said it asked from, the loop's own? (loop_client_cpu(); only
		 * a hint, whatever it says).  A client whose request waited
		 * sleeps meanwhile, and shares no CPU with the loop's turns. */
		uint32_t cpu = __atomic_load_n(&ch->sq.r->cpu, __ATOMIC_RELAXED);

		loop_client_cpu(ch->s->sv->loop, cpu ? (int) (cpu - 1) : -1);
	}
	wake_client(ch);
	return done;
}

unsigned channel_poll_all(struct server *sv)
{
	unsigned n;

	sv->copied_inline = 0;
	n = retry_space(sv);
	store_expire_announced(sv->st); /* none: one test */
	n += store_wake_puts(sv->st);
	n += expire_put_waits(sv);

	for (struct channel *ch = sv->channels; ch; ch = ch->next)
		n += poll_channel(ch);
	return n + store_wake_puts(sv->st); /* puts committed in this round */
}

void channel_set_sleeping(struct server *sv, bool sleeping)
{
	for (struct channel *ch = sv->channels; ch; ch = ch->next)
		ring_set_need_wakeup(ch->sq.r, sleeping);
}

static bool poll_channels(void *userdata)
{
	return channel_poll_all(userdata) > 0;
}

static void channels_sleeping(void *userdata, bool sleeping)
{
	channel_set_sleeping(userdata, sleeping);
}

/* Puts waiting for a spill give up at a deadline: this timer only wakes a
 * sleeping loop for it; retry_space() does the rest. */
static void space_deadline(struct loop_source *s, void *userdata)
{
}

/* Likewise for lookups waiting for a put: expire_put_waits(). */
static void put_wait_deadline(struct loop_source *s, void *userdata)
{
}

/* A copy ended (copier.c); r is the request's result. */
static void channel_copy_done(struct copy_job *j, int64_t r, const char *msg)
{
	struct channel *ch = j->ch;
	const struct shm_sqe *e = &j->e;
	struct shm_cqe c = { 0 };
	char m[STORE_MSG_MAX], key[WIRE_MAX_KEY + 1];

	if (r == 0 && e->opcode == SHM_OP_PUT_FROM && (e->flags & SHM_SQE_PUSH)) {
		/* the request holds its arena slot until it is answered */
		snprintf(m, sizeof(m), "%s", msg);
		r = arena_key(ch, e->key_off, e->key_len, key);
		if (r == 0)
			r = then_push(ch, e, key, e->key_len, 0, m);
		msg = m;
	}
	complete(ch, e, &c, r, msg);
	wake_client(ch);
	loop_client_turn(ch->s->sv->loop, LOOP_CLIENT_ANSWERED, ch);
}

static void on_space_freed(void *data)
{
	((struct server *) data)->space_freed = true;
}

/* Puts parked for space hear when a copy below ends. */
static const struct store_events server_events = {
	.version = STORE_EVENTS_VERSION,
	.space_freed = on_space_freed,
};

int channel_init(struct server *sv)
{
	int r = loop_add_poller(sv->loop, poll_channels, channels_sleeping, sv, &sv->channels_src);

	store_add_listener(sv->st, &sv->space_listener, &server_events, sv);
	if (sv->cfg->test.no_channel_stream)
		log_warn("KVCACHE_TEST_NO_CHANNEL_STREAM: channels offer no SHM_SQE_STREAM");

	if (r == 0)
		r = loop_add_timer(sv->loop, space_deadline, sv, &sv->space_timer);
	if (r == 0)
		r = loop_add_timer(sv->loop, put_wait_deadline, sv, &sv->put_wait_timer);
	if (r == 0)
		r = mapper_start(sv->loop, &sv->mapper);
	if (r == 0)
		ask_spares(sv);
	if (r == 0)
		r = buffer_init(sv);
	return r < 0 ? r : copier_init(sv);
}
