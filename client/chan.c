/* SPDX-License-Identifier: MIT */
/*
 * The client's half of a shared-memory channel.
 *
 * Requests are fixed-size descriptors in the submission ring; whatever they
 * point at (keys, key lists, iovecs, result arrays) lives in the arena slot
 * of the tag that the request holds, so concurrent requests never share
 * arena bytes.  A request holds its tag until its completion is consumed, and
 * there are as many tags as ring entries, so completions always fit.
 *
 * Any thread may reap: it moves completions to their tags (or to the async
 * queue) and wakes threads asleep on the completion futex if it finished
 * something of theirs.  Waiting spins first (the daemon answers in well under
 * a microsecond while it spins too), then sleeps on the futex with a timeout
 * that doubles as a check that the daemon is still alive.
 */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client-private.h"
#include "clock.h"

#define SPIN 50                   /* us: spin this long before sleeping */
#define SPIN_SHORT 2              /* us: ...after a wait that outlasted that */
#define SLEEP_MAX (100 * USEC_PER_MSEC) /* then check the daemon is alive */

int chan_open(struct kvc_client *c)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	struct chan *ch = &c->chan;
	const struct shm_chan_header *h;
	Kvc__Response *resp;
	int fds[2];
	size_t n_fds = 0;
	void *base;
	int r;

	q.op = KVC__OP__OP_CHANNEL_OPEN;
	r = client_rpc_fds(c, &q, &resp, fds, 2, &n_fds);
	if (r < 0)
		return r;
	kvc__response__free_unpacked(resp, NULL);
	if (n_fds != 2) {
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		return -EPROTO;
	}
	r = shm_memfd_map(fds[0], SHM_CHAN_SIZE, &base);
	if (r < 0) {
		close(fds[1]);
		return r;
	}
	h = base;
	if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_CHAN_MAGIC ||
	    h->version != SHM_CHAN_VERSION || h->entries != SHM_CHAN_ENTRIES ||
	    h->arena_slot != SHM_CHAN_ARENA_SLOT || h->size != SHM_CHAN_SIZE) {
		munmap(base, SHM_CHAN_SIZE);
		close(fds[1]);
		return -EPROTONOSUPPORT;
	}
	ch->base = base;
	ch->features = h->features;
	ch->efd = fds[1];
	ch->arena = ch->base + SHM_CHAN_ARENA_OFF;
	ring_side_init(&ch->sq, (struct shm_ring *) (ch->base + SHM_CHAN_SQ_OFF),
		       ch->base + SHM_CHAN_SQES_OFF, sizeof(struct shm_sqe), SHM_CHAN_ENTRIES, 0);
	ring_side_init(&ch->cq, (struct shm_ring *) (ch->base + SHM_CHAN_CQ_OFF),
		       ch->base + SHM_CHAN_CQES_OFF, sizeof(struct shm_cqe), SHM_CHAN_ENTRIES, 0);
	pthread_mutex_init(&ch->sq_lock, NULL);
	pthread_mutex_init(&ch->cq_lock, NULL);
	pthread_mutex_init(&ch->cfd_lock, NULL);
	pthread_cond_init(&ch->cfd_cond, NULL);
	ch->cfd = -1;
	for (uint32_t i = 0; i < CHAN_TAGS; i++)
		ch->free_tags[i] = CHAN_TAGS - 1 - i;
	ch->n_free = CHAN_TAGS;
	return 0;
}

void chan_close(struct chan *ch)
{
	if (!ch->base)
		return;
	munmap(ch->base, SHM_CHAN_SIZE);
	close(ch->efd);
	pthread_mutex_destroy(&ch->sq_lock);
	pthread_mutex_destroy(&ch->cq_lock);
	pthread_mutex_destroy(&ch->cfd_lock);
	pthread_cond_destroy(&ch->cfd_cond);
	ch->base = NULL;
}

static void wake_sleepers(struct chan *ch)
{
	if (__atomic_load_n(&ch->waiters, __ATOMIC_SEQ_CST) == 0)
		return;
	ring_set_need_wakeup(ch->cq.r, false);
	__atomic_add_fetch(&ch->cq.r->futex, 1, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &ch->cq.r->futex, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* cq_lock held */
static bool reap_locked(struct kvc_client *c)
{
	struct chan *ch = &c->chan;
	bool others = false;
	int64_t n = ring_ready(&ch->cq);

	if (n <= 0)
		return false;
	for (int64_t i = 0; i < n; i++) {
		const struct shm_cqe *e = ring_entry(&ch->cq, ch->cq.pos + (uint32_t) i);
		struct tag *t;

		if (e->user_data == CHAN_NO_TAG || e->user_data >= CHAN_TAGS) {
			ch->dropped_errors++;
			continue;
		}
		t = &ch->tags[e->user_data];
		if (e->flags & SHM_CQE_MORE) {
			/* news for a streamed request; only a waiting thread
			 * asks for it */
			if (__atomic_load_n(&t->state, __ATOMIC_RELAXED) == TAG_SYNC) {
				t->more = *e;
				__atomic_add_fetch(&t->more_seq, 1, __ATOMIC_RELEASE);
				others = true;
			}
			continue;
		}
		t->cqe = *e;
		if (__atomic_load_n(&t->state, __ATOMIC_RELAXED) == TAG_ASYNC) {
			ch->done_q[ch->done_tail++ % CHAN_TAGS] = (uint32_t) e->user_data;
			others = true; /* someone may wait in kvc_wait() */
		} else {
			__atomic_store_n(&t->state, TAG_DONE, __ATOMIC_RELEASE);
			others = true;
		}
	}
	ring_consume(&ch->cq, (uint32_t) n);
	if (others)
		wake_sleepers(ch);
	return true;
}

bool chan_reap(struct kvc_client *c)
{
	bool r;

	if (pthread_mutex_trylock(&c->chan.cq_lock) != 0)
		return false;
	r = reap_locked(c);
	pthread_mutex_unlock(&c->chan.cq_lock);
	return r;
}

/* Is the daemon still there?  Only asked after a long sleep.  POLLRDHUP
 * tells a hang-up even while an unread reply is still queued before it. */
static bool daemon_gone(struct kvc_client *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLRDHUP };

	if (c->broken)
		return true;
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
		c->broken = true;
	return c->broken;
}

/* Sleep until something happens on the completion ring, or for `most`. */
static void sleep_on_cq(struct kvc_client *c, bool (*ready)(struct kvc_client *, uint32_t),
			uint32_t arg, usec_t most)
{
	struct chan *ch = &c->chan;
	struct timespec ts = { (time_t) (most / USEC_PER_SEC),
			       (long) (most % USEC_PER_SEC * NSEC_PER_USEC) };
	uint32_t seq;

	__atomic_add_fetch(&ch->waiters, 1, __ATOMIC_SEQ_CST);
	seq = __atomic_load_n(&ch->cq.r->futex, __ATOMIC_SEQ_CST);
	ring_set_need_wakeup(ch->cq.r, true);
	/* re-check after announcing: the daemon either saw the flag or
	 * published before our check */
	if (!ready(c, arg) && ring_ready(&ch->cq) == 0)
		syscall(SYS_futex, &ch->cq.r->futex, FUTEX_WAIT, seq, &ts, NULL, 0);
	__atomic_sub_fetch(&ch->waiters, 1, __ATOMIC_SEQ_CST);
}

/*
 * Spin (reaping), then sleep, until ready(c, arg).  While any of the
 * channel's requests wait on another node (the daemon counts them in the
 * completion ring) the spin is SPIN_SHORT: a client streaming a batch
 * from another node waited out each answer's whole spin, on a two-CPU node
 * the CPU the transfers needed.
 */
static int wait_until(struct kvc_client *c, bool (*ready)(struct kvc_client *, uint32_t),
		      uint32_t arg, int64_t timeout_us)
{
	struct chan *ch = &c->chan;
	usec_t start = mono_us(), spin = SPIN, now, most;
	uint64_t slept = 0;

	for (unsigned spins = 0;; spins++) {
		if (ready(c, arg))
			return 0;
		if (chan_reap(c) && ready(c, arg))
			return 0;
		if (spins < 64) {
			cpu_relax();
			continue;
		}
		/* looked at on each pass: the daemon counts the request
		 * when it takes it, microseconds after it was sent */
		if (spin != SPIN_SHORT && __atomic_load_n(&ch->cq.r->far, __ATOMIC_RELAXED))
			spin = SPIN_SHORT;
		now = mono_us();
		if (timeout_us >= 0 && now - start >= (uint64_t) timeout_us)
			return -ETIMEDOUT;
		if (now - start < spin) {
			cpu_relax();
			continue;
		}
		most = SLEEP_MAX;
		if (timeout_us >= 0 && (uint64_t) timeout_us - (now - start) < most)
			most = (uint64_t) timeout_us - (now - start);
		sleep_on_cq(c, ready, arg, most);
		if (++slept % 4 == 0 && !ready(c, arg) && daemon_gone(c))
			return -ECONNRESET;
	}
}

static bool tag_done(struct kvc_client *c, uint32_t t)
{
	return __atomic_load_n(&c->chan.tags[t].state, __ATOMIC_ACQUIRE) == TAG_DONE;
}

static bool tag_free(struct kvc_client *c, uint32_t unused)
{
	(void) unused;
	return __atomic_load_n(&c->chan.n_free, __ATOMIC_ACQUIRE) > 0;
}

int chan_tag_get(struct kvc_client *c, enum tag_state kind, bool wait, uint32_t *ret)
{
	struct chan *ch = &c->chan;

	for (;;) {
		pthread_mutex_lock(&ch->sq_lock);
		if (ch->n_free) {
			uint32_t t = ch->free_tags[--ch->n_free];

			__atomic_store_n(&ch->tags[t].state, kind, __ATOMIC_RELAXED);
			__atomic_store_n(&ch->tags[t].more_seq, 0, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&ch->sq_lock);
			*ret = t;
			return 0;
		}
		pthread_mutex_unlock(&ch->sq_lock);
		if (!wait)
			return -EAGAIN;
		if (wait_until(c, tag_free, 0, -1) < 0)
			return -ECONNRESET;
	}
}

void chan_tag_put(struct chan *ch, uint32_t t)
{
	pthread_mutex_lock(&ch->sq_lock);
	__atomic_store_n(&ch->tags[t].state, TAG_FREE, __ATOMIC_RELAXED);
	ch->free_tags[ch->n_free++] = t;
	pthread_mutex_unlock(&ch->sq_lock);
}

/* With its requests the client tells the daemon the CPU it runs on
 * (shm-layout.h, sq.cpu); glibc's sched_getcpu() reads it from rseq,
 * without a system call. */
static void tell_cpu(struct chan *ch)
{
	int cpu = sched_getcpu();
	uint32_t v = cpu >= 0 ? (uint32_t) cpu + 1 : 0;

	if (__atomic_load_n(&ch->sq.r->cpu, __ATOMIC_RELAXED) != v)
		__atomic_store_n(&ch->sq.r->cpu, v, __ATOMIC_RELAXED);
}

static int submit(struct kvc_client *c, const struct shm_sqe *e, uint32_t n, bool lazy)
{
	struct chan *ch = &c->chan;
	uint32_t gf = __atomic_load_n(&c->get_flags, __ATOMIC_RELAXED);
	uint32_t extra = ((gf & KVC_LOCAL_ONLY) ? SHM_SQE_LOCAL_ONLY : 0) |
			 ((gf & KVC_PEEK) ? SHM_SQE_PEEK : 0);
	uint32_t done = 0;

	if (c->broken)
		return -ECONNRESET;
	pthread_mutex_lock(&ch->sq_lock);
	while (done < n) {
		uint32_t space = ring_space(&ch->sq), k;

		if (space == 0) {
			/* the daemon drains the ring unless the completion ring
			 * is full: reap so it can go on */
			pthread_mutex_unlock(&ch->sq_lock);
			if (!chan_reap(c))
				cpu_relax();
			if (daemon_gone(c))
				return -ECONNRESET;
			pthread_mutex_lock(&ch->sq_lock);
			continue;
		}
		k = n - done < space ? n - done : space;
		for (uint32_t i = 0; i < k; i++) {
			struct shm_sqe *d = ring_entry(&ch->sq, ch->sq.pos + i);

			memcpy(d, &e[done + i], sizeof(*e));
			d->flags |= extra;
		}
		ring_publish(&ch->sq, k);
		tell_cpu(ch);
		done += k;
		if (lazy && done == n) {
			ch->lazy = true;
			break;
		}
		ch->lazy = false; /* this ring wakes it for those too */
		if (ring_peer_sleeping(ch->sq.r)) {
			uint64_t one = 1;

			/* the daemon sleeps in epoll: one write wakes it */
			if (write(ch->efd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
				pthread_mutex_unlock(&ch->sq_lock);
				return -ECONNRESET;
			}
		}
	}
	pthread_mutex_unlock(&ch->sq_lock);
	return 0;
}

int chan_submit(struct kvc_client *c, const struct shm_sqe *e, uint32_t n)
{
	return submit(c, e, n, false);
}

int chan_submit_lazy(struct kvc_client *c, const struct shm_sqe *e, uint32_t n)
{
	return submit(c, e, n, true);
}

void chan_kick(struct kvc_client *c)
{
	struct chan *ch = &c->chan;
	uint64_t one = 1;

	pthread_mutex_lock(&ch->sq_lock);
	if (ch->lazy && ring_peer_sleeping(ch->sq.r) && write(ch->efd, &one, sizeof(one)) < 0 &&
	    errno != EAGAIN)
		c->broken = true;
	ch->lazy = false;
	pthread_mutex_unlock(&ch->sq_lock);
}

int64_t chan_wait(struct kvc_client *c, uint32_t t)
{
	int r = wait_until(c, tag_done, t, -1);

	if (r < 0)
		return r;
	return c->chan.tags[t].cqe.res;
}

int chan_prep_key(struct chan *ch, uint32_t t, struct shm_sqe *e, uint8_t op, const char *key,
		  const char *parent)
{
	uint8_t *slot = chan_slot(ch, t);
	size_t klen = strlen(key), plen = parent ? strlen(parent) : 0;

	memset(e, 0, sizeof(*e));
	e->opcode = op;
	e->flags = SHM_SQE_WANT_MSG;
	e->user_data = t;
	e->key_off = chan_slot_off(t);
	e->key_len = (uint16_t) klen;
	memcpy(slot, key, klen);
	if (parent) {
		e->key2_off = chan_slot_off(t) + (uint32_t) klen;
		e->key2_len = (uint16_t) plen;
		memcpy(slot + klen, parent, plen);
	}
	e->msg_off = chan_slot_off(t) + CHAN_SLOT_USABLE;
	slot[CHAN_SLOT_USABLE] = '\0';
	return (int) (klen + plen);
}

int chan_push_to(struct chan *ch, uint32_t t, struct shm_sqe *e, uint32_t at, const char *node)
{
	size_t len = strlen(node);

	if (len == 0 || len > WIRE_MAX_NODE || at + len > CHAN_SLOT_USABLE)
		return -EINVAL;
	if (!(ch->features & SHM_CHAN_FEAT_PUSH))
		return -EOPNOTSUPP;
	memcpy(chan_slot(ch, t) + at, node, len);
	e->flags |= SHM_SQE_PUSH;
	e->push_off = chan_slot_off(t) + at;
	e->push_len = (uint32_t) len;
	return 0;
}

int64_t chan_call(struct kvc_client *c, struct shm_sqe *e, uint32_t t, struct shm_cqe *ret_cqe)
{
	int64_t r = chan_submit(c, e, 1);

	if (r == 0)
		r = chan_wait(c, t);
	return chan_call_end(c, t, r, ret_cqe);
}

int64_t chan_call_end(struct kvc_client *c, uint32_t t, int64_t r, struct shm_cqe *ret_cqe)
{
	if (r == 0)
		r = c->chan.tags[t].cqe.res;
	if (r == -ECONNRESET && c->broken) {
		/* the tag may still be in the daemon's hands: never reuse it */
		client_set_msg("the daemon went away");
		return r;
	}
	if (r < 0) {
		const char *m = (const char *) chan_slot(&c->chan, t) + CHAN_SLOT_USABLE;

		client_set_msg(strnlen(m, SHM_MSG_MAX) < SHM_MSG_MAX ? m : "");
	} else
		client_set_msg(NULL);
	if (ret_cqe)
		*ret_cqe = c->chan.tags[t].cqe;
	chan_tag_put(&c->chan, t);
	return r;
}

bool chan_tag_done(struct kvc_client *c, uint32_t t)
{
	return tag_done(c, t) || (chan_reap(c) && tag_done(c, t));
}

uint32_t chan_more(struct kvc_client *c, uint32_t t, struct shm_cqe *ret)
{
	struct chan *ch = &c->chan;
	uint32_t seq;

	if (!__atomic_load_n(&ch->tags[t].more_seq, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&ch->cq_lock);
	seq = ch->tags[t].more_seq;
	*ret = ch->tags[t].more;
	pthread_mutex_unlock(&ch->cq_lock);
	return seq;
}

/* arg: the tag, and the low 16 bits of the news seen */
static bool done_or_more(struct kvc_client *c, uint32_t arg)
{
	uint32_t t = arg & 0xffff;

	return tag_done(c, t) ||
	       (__atomic_load_n(&c->chan.tags[t].more_seq, __ATOMIC_ACQUIRE) & 0xffff) != arg >> 16;
}

int chan_wait_more(struct kvc_client *c, uint32_t t, uint32_t seen, int64_t timeout_us)
{
	return wait_until(c, done_or_more, t | (seen & 0xffff) << 16, timeout_us);
}

/* ---- asynchronous completions ---- */

static bool async_ready(struct kvc_client *c, uint32_t unused);

/* After a pop: once nothing waits to be reaped, the fd stops being
 * readable and the helper thread watches for the next completion. */
static void completion_fd_drained(struct kvc_client *c)
{
	struct chan *ch = &c->chan;
	uint64_t v;

	pthread_mutex_lock(&ch->cfd_lock);
	if (ch->cfd_signalled && !async_ready(c, 0)) {
		if (read(ch->cfd, &v, sizeof(v)) < 0) {
			/* EAGAIN: nothing to drain */
		}
		ch->cfd_signalled = false;
		pthread_cond_signal(&ch->cfd_cond);
	}
	pthread_mutex_unlock(&ch->cfd_lock);
}

/* Readable while async completions wait: wait for one, signal, wait until
 * they are reaped, again.  Short waits, so that stopping is prompt. */
static void *completion_fd_thread(void *arg)
{
	struct kvc_client *c = arg;
	struct chan *ch = &c->chan;
	uint64_t one = 1;

	for (;;) {
		int r = chan_wait_async(c, 20 * USEC_PER_MSEC);

		pthread_mutex_lock(&ch->cfd_lock);
		if (ch->cfd_stop) {
			pthread_mutex_unlock(&ch->cfd_lock);
			break;
		}
		if (r == 0 || r == -ECONNRESET) {
			/* a dead daemon wakes the caller too: its next call says so */
			if (!ch->cfd_signalled && write(ch->cfd, &one, sizeof(one)) == sizeof(one))
				ch->cfd_signalled = true;
			while (ch->cfd_signalled && !ch->cfd_stop)
				pthread_cond_wait(&ch->cfd_cond, &ch->cfd_lock);
		}
		pthread_mutex_unlock(&ch->cfd_lock);
		if (r == -ECONNRESET)
			break;
	}
	return NULL;
}

int kvc_completion_fd(struct kvc_client *c)
{
	struct chan *ch;
	int fd, r = 0;

	if (!c)
		return -EINVAL;
	ch = &c->chan;
	pthread_mutex_lock(&ch->cfd_lock);
	if (ch->cfd >= 0) {
		r = ch->cfd;
		goto out;
	}
	fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	fd = client_fd_above_stdio(fd);
	if (fd < 0) {
		r = fd;
		goto out;
	}
	ch->cfd_stop = false;
	ch->cfd_signalled = false;
	__atomic_store_n(&ch->cfd, fd, __ATOMIC_RELEASE);
	r = -pthread_create(&ch->cfd_thread, NULL, completion_fd_thread, c);
	if (r < 0) {
		__atomic_store_n(&ch->cfd, -1, __ATOMIC_RELEASE);
		close(fd);
		goto out;
	}
	ch->cfd_running = true;
	r = fd;
out:
	pthread_mutex_unlock(&ch->cfd_lock);
	return r;
}

void chan_completion_fd_done(struct kvc_client *c)
{
	struct chan *ch = &c->chan;
	bool running;

	if (!ch->base)
		return;
	pthread_mutex_lock(&ch->cfd_lock);
	ch->cfd_stop = true;
	running = ch->cfd_running;
	pthread_cond_signal(&ch->cfd_cond);
	pthread_mutex_unlock(&ch->cfd_lock);
	if (running) {
		wake_sleepers(ch); /* the thread may sleep on the completion futex */
		pthread_join(ch->cfd_thread, NULL);
	}
	if (ch->cfd >= 0)
		close(ch->cfd);
	ch->cfd = -1;
	ch->cfd_running = false;
}

static bool async_ready(struct kvc_client *c, uint32_t unused)
{
	(void) unused;
	return __atomic_load_n(&c->chan.done_tail, __ATOMIC_ACQUIRE) !=
	       __atomic_load_n(&c->chan.done_head, __ATOMIC_ACQUIRE);
}

int chan_pop_async(struct kvc_client *c, struct kvc_completion *ret, size_t max)
{
	struct chan *ch = &c->chan;
	uint32_t tags[CHAN_TAGS];
	size_t n = 0;

	pthread_mutex_lock(&ch->cq_lock);
	reap_locked(c);
	while (n < max && n < CHAN_TAGS && ch->done_head != ch->done_tail) {
		uint32_t t = ch->done_q[ch->done_head++ % CHAN_TAGS];

		ret[n] = (struct kvc_completion) {
			.user_data = ch->tags[t].user_data,
			.res = ch->tags[t].cqe.res,
		};
		tags[n++] = t;
	}
	pthread_mutex_unlock(&ch->cq_lock);
	for (size_t i = 0; i < n; i++)
		chan_tag_put(ch, tags[i]);
	if (n && __atomic_load_n(&ch->cfd, __ATOMIC_ACQUIRE) >= 0)
		completion_fd_drained(c);
	return (int) n;
}

int chan_wait_async(struct kvc_client *c, int64_t timeout_us)
{
	return wait_until(c, async_ready, 0, timeout_us);
}
