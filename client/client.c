/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvcache/kvcache.h"
#include "shmem.h"
#include "client-private.h"

/* The public names of wire values are the wire's (proto/values.h). */
#define SAME(a, b) ((int) (a) == (int) (b))
_Static_assert(SAME(KVC_PUT_REPLACE, WIRE_PUT_REPLACE) && SAME(KVC_PUT_SOFT_PIN, WIRE_PUT_SOFT_PIN) &&
	       SAME(KVC_PUT_HARD_PIN, WIRE_PUT_HARD_PIN), "put flags");
_Static_assert(SAME(KVC_TIER_DEFAULT, WIRE_TIER_DEFAULT) && SAME(KVC_TIER_DEVICE, WIRE_TIER_DEVICE) &&
	       SAME(KVC_TIER_DRAM, WIRE_TIER_DRAM) && SAME(KVC_TIER_DISK, WIRE_TIER_DISK), "tiers");
_Static_assert(SAME(KVC_STATE_RESERVED, WIRE_STATE_RESERVED) &&
	       SAME(KVC_STATE_COMMITTED, WIRE_STATE_COMMITTED), "key states");
_Static_assert(SAME(KVC_REMOVE_FORCE, WIRE_REMOVE_FORCE), "remove flags");
_Static_assert(SAME(KVC_EVICT_ALL, WIRE_EVICT_ALL), "evict flags");
#undef SAME

static __thread char last_msg[256];

const char *kvc_last_error_msg(void)
{
	return last_msg;
}

void client_set_msg(const char *m)
{
	snprintf(last_msg, sizeof(last_msg), "%s", m ? m : "");
}

int client_check_key(const char *key)
{
	size_t n;

	if (!key)
		return -EINVAL;
	n = strnlen(key, KVC_KEY_MAX + 1);
	return n == 0 || n > KVC_KEY_MAX ? -EINVAL : 0;
}

/*
 * Never keep one of fds 0-2: a program started with stdin or stdout closed
 * would otherwise read its "input" from the daemon's socket, or write its
 * output into it.  Returns the fd to use (the original is closed).
 */
int client_fd_above_stdio(int fd)
{
	int n;

	if (fd < 0 || fd > 2)
		return fd;
	n = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	close(fd);
	return n < 0 ? -errno : n;
}

/* Read exactly len bytes; fds that arrive are stored in fds[], each above
 * stdio. */
static int recv_exact(int fd, void *buf, size_t len, int *fds, size_t max_fds, size_t *n_fds)
{
	size_t had = fds ? *n_fds : 0;
	int r = wire_recv_exact(fd, buf, len, fds, max_fds, n_fds);

	/* a failed dup leaves -errno in its place: callers see an unusable
	 * fd and fail the request */
	for (size_t i = had; fds && i < *n_fds; i++)
		fds[i] = client_fd_above_stdio(fds[i]);
	return r;
}

/* Receive one frame of the expected type; the payload is malloc'd. */
static int recv_frame(struct kvc_client *c, uint16_t type, struct wire_hdr *ret_hdr,
		      uint8_t **ret_payload, int *fds, size_t *n_fds)
{
	struct wire_hdr h;
	uint8_t *payload;
	size_t dummy = 0;
	int r;

	if (!n_fds)
		n_fds = &dummy;
	r = recv_exact(c->fd, &h, sizeof(h), fds, fds ? WIRE_MAX_FDS : 0, n_fds);
	if (r < 0)
		return r;
	r = wire_hdr_check(&h, WIRE_MAX_PAYLOAD);
	if (r < 0 || h.type != type || h.n_fds != *n_fds) {
		r = -EPROTO;
		goto fail_fds;
	}
	payload = malloc(h.len ? h.len : 1);
	if (!payload) {
		r = -ENOMEM;
		goto fail_fds;
	}
	r = recv_exact(c->fd, payload, h.len, NULL, 0, NULL);
	if (r < 0) {
		free(payload);
		goto fail_fds;
	}
	*ret_hdr = h;
	*ret_payload = payload;
	return 0;
fail_fds:
	for (size_t i = 0; fds && i < *n_fds; i++)
		close(fds[i]);
	return r;
}

/* One request, one response.  A transport failure breaks the client for
 * good: the stream may be out of step and the daemon has already dropped
 * whatever this connection held. */
int client_rpc(struct kvc_client *c, Kvc__Request *q, Kvc__Response **ret)
{
	return client_rpc_fds(c, q, ret, NULL, 0, NULL);
}

static int64_t handle_call(struct kvc_client *c, uint8_t op, uint64_t handle);

/*
 * Views this client let go without waiting are gone before a socket
 * request is read: the daemon takes a channel's requests in order, but
 * its socket may be read first, and a kvc_remove_all() right after a
 * kvc_get() found the get's view still held and kept the object.  A NOP
 * on the channel, answered, means every release before it was taken in;
 * only when some were made since the last one.
 */
static void client_settle(struct kvc_client *c)
{
	uint64_t n = __atomic_load_n(&c->let_go, __ATOMIC_ACQUIRE);

	if (n == __atomic_load_n(&c->let_go_settled, __ATOMIC_RELAXED) || c->broken)
		return;
	if (handle_call(c, SHM_OP_NOP, 0) >= 0)
		__atomic_store_n(&c->let_go_settled, n, __ATOMIC_RELAXED);
}

int client_rpc_fds(struct kvc_client *c, Kvc__Request *q, Kvc__Response **ret, int *ret_fds,
		   size_t max_fds, size_t *ret_n_fds)
{
	Kvc__Response *resp = NULL;
	struct wire_hdr h;
	uint8_t *buf = NULL, *payload = NULL;
	int fds[WIRE_MAX_FDS];
	size_t len, n_fds = 0;
	uint32_t seq;
	int r;

	if (q->op != KVC__OP__OP_CHANNEL_OPEN)
		client_settle(c);
	pthread_mutex_lock(&c->lock);
	if (c->broken) {
		r = -ECONNRESET;
		goto out;
	}
	seq = ++c->seq;
	r = wire_frame_pack(WIRE_REQUEST, seq, 0, &q->base, &buf, &len);
	if (r < 0)
		goto out;
	r = wire_send_all(c->fd, buf, len, NULL, 0);
	if (r < 0) {
		r = r == -EPIPE ? -ECONNRESET : r;
		c->broken = true;
		goto out;
	}
	r = recv_frame(c, WIRE_RESPONSE, &h, &payload, fds, &n_fds);
	if (r < 0) {
		c->broken = true;
		goto out;
	}
	if (n_fds > max_fds) {
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		n_fds = 0;
		r = -EPROTO;
		c->broken = true;
		goto out;
	}
	if (h.seq != seq) {
		r = -EPROTO;
		c->broken = true;
		goto out;
	}
	resp = kvc__response__unpack(NULL, h.len, payload);
	if (!resp) {
		r = -EPROTO;
		c->broken = true;
		goto out;
	}
out:
	pthread_mutex_unlock(&c->lock);
	free(buf);
	free(payload);
	if (r < 0) {
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		return r;
	}
	if (resp->error != 0) {
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		r = resp->error > 0 && resp->error < 4096 ? -resp->error : -EPROTO;
		client_set_msg(resp->error_msg);
		kvc__response__free_unpacked(resp, NULL);
		return r;
	}
	client_set_msg(NULL);
	for (size_t i = 0; i < n_fds; i++)
		ret_fds[i] = fds[i];
	if (ret_n_fds)
		*ret_n_fds = n_fds;
	*ret = resp;
	return 0;
}

/* The daemon says where bytes are; still check that it is inside a mapping. */
int client_extent_ptr(struct kvc_client *c, uint32_t segment, uint64_t offset, uint64_t len,
		      void **ret)
{
	const struct shm_segment *s;

	if (segment >= c->n_segs)
		return -EPROTO;
	s = &c->segs[segment];
	if (offset < SHM_HEADER_SIZE || offset > s->size || len > s->size - offset)
		return -EPROTO;
	*ret = (uint8_t *) s->base + offset;
	return 0;
}

uint32_t kvc_set_get_flags(struct kvc_client *c, uint32_t flags)
{
	if (!c)
		return 0;
	return __atomic_exchange_n(&c->get_flags, flags & (KVC_LOCAL_ONLY | KVC_PEEK),
				   __ATOMIC_RELAXED);
}

int kvc_segments(struct kvc_client *c, struct kvc_segment *ret, size_t max)
{
	if (!c || (max && !ret))
		return -EINVAL;
	for (size_t i = 0; i < c->n_segs && i < max; i++)
		ret[i] = (struct kvc_segment) { c->segs[i].base, c->segs[i].size };
	return (int) c->n_segs;
}

int kvc_socket_path(const char *socket_path, char *buf, size_t len)
{
	if (!buf)
		return -EINVAL;
	return shm_socket_path(socket_path, buf, len);
}

int kvc_parse_size(const char *s, uint64_t *ret)
{
	if (!s || !ret)
		return -EINVAL;
	return shm_parse_size(s, ret);
}

static int handshake(struct kvc_client *c)
{
	Kvc__Hello hello = KVC__HELLO__INIT;
	Kvc__Welcome *w = NULL;
	struct wire_hdr h;
	uint8_t *buf = NULL, *payload = NULL;
	int fds[WIRE_MAX_FDS];
	size_t len, n_fds = 0;
	int r;

	hello.major = KVC_PROTO_MAJOR;
	hello.minor = KVC_PROTO_MINOR;
	hello.client_name = program_invocation_short_name;
	r = wire_frame_pack(WIRE_HELLO, 0, 0, &hello.base, &buf, &len);
	if (r < 0)
		return r;
	r = wire_send_all(c->fd, buf, len, NULL, 0);
	free(buf);
	if (r < 0)
		return r == -EPIPE ? -ECONNRESET : r;
	r = recv_frame(c, WIRE_WELCOME, &h, &payload, fds, &n_fds);
	if (r < 0)
		return r;
	w = kvc__welcome__unpack(NULL, h.len, payload);
	free(payload);
	if (!w) {
		r = -EPROTO;
		goto out;
	}
	if (w->error) {
		r = w->error > 0 && w->error < 4096 ? -w->error : -EPROTO;
		client_set_msg(w->error_msg);
		goto out;
	}
	if (w->major != KVC_PROTO_MAJOR) {
		r = -EPROTONOSUPPORT;
		goto out;
	}
	if (w->n_segments > MAX_SEGMENTS) {
		r = -EPROTO;
		goto out;
	}
	for (size_t i = 0; i < w->n_segments; i++) {
		const Kvc__SegmentInfo *si = w->segments[i];

		if (si->index != i || si->fd_index >= n_fds || fds[si->fd_index] < 0) {
			r = -EPROTO;
			goto out;
		}
		/* 0: a daemon of an earlier minor, which does not say; the
		 * major already matched */
		if (si->layout_version && si->layout_version != SHM_LAYOUT_VERSION) {
			client_set_msg("the daemon's shared-memory layout differs from this library's");
			r = -EPROTONOSUPPORT;
			goto out;
		}
		if (si->data_offset && (si->data_offset < SHM_HEADER_SIZE || si->data_offset > si->size)) {
			r = -EPROTO;
			goto out;
		}
		r = shm_segment_map(&c->segs[i], fds[si->fd_index], si->size);
		if (r == 0)
			c->segs[i].hugepages = si->hugepages;
		fds[si->fd_index] = -1; /* consumed, even on failure */
		if (r < 0)
			goto out;
		c->n_segs++;
	}
	c->client_id = w->client_id;
	c->max_value = w->max_value_size;
	r = 0;
out:
	for (size_t i = 0; i < n_fds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (w)
		kvc__welcome__free_unpacked(w, NULL);
	return r;
}

/*
 * Warming the mappings.  A process pays for the first access to each page
 * of a mapping it has not touched before, even when another process
 * filled the memory long ago (a fault per 4 KiB page, and in a VM an exit
 * to the host as well): a fresh engine's first loads ran at a tenth of a
 * copy once warm.  A library thread, at nice 19, touches every page
 * of the daemon's segments once after connect -- an atomic add of 0, a
 * write fault that changes no byte, even under a concurrent writer -- so
 * the engine pays it off its critical path.  KVCACHE_WARM=0 turns it off.
 *
 * It touches only while the client is quiet: a slice at a time, when it
 * waits for nothing (every tag free) and submitted nothing in the last
 * WARM_QUIET_NS (its submission ring's tail did not move).  A low
 * priority is not enough where the CPUs are the limit: a fresh client's
 * fetches from another node ran at two thirds of their speed while its
 * warming took the moments the daemons' threads were waiting for it.  An
 * engine connects long before it loads (it loads its model first), so its
 * warming is over by its first request.
 */
#define WARM_SLICE (2u << 20)
#define WARM_QUIET_NS 2000000

static uint32_t warm_sq_tail(struct kvc_client *c)
{
	return __atomic_load_n(&c->chan.sq.r->tail, __ATOMIC_RELAXED);
}

/* Until the client is quiet; false: stop. */
static bool warm_wait_quiet(struct kvc_client *c, uint32_t *seen)
{
	const struct timespec quiet = { 0, WARM_QUIET_NS };

	for (;;) {
		uint32_t now = warm_sq_tail(c);

		if (__atomic_load_n(&c->warm_stop, __ATOMIC_RELAXED))
			return false;
		if (now == *seen &&
		    __atomic_load_n(&c->chan.n_free, __ATOMIC_RELAXED) == CHAN_TAGS)
			return true;
		*seen = now;
		nanosleep(&quiet, NULL);
	}
}

static void *warm_main(void *arg)
{
	struct kvc_client *c = arg;
	uint32_t seen = warm_sq_tail(c);

	/* nice 19, not SCHED_IDLE: an idle thread waits for an idle CPU, and
	 * beside CPU-bound neighbours it warmed nothing (docs/performance.rst) */
	(void) setpriority(PRIO_PROCESS, (id_t) syscall(SYS_gettid), 19);
	for (size_t i = 0; i < c->n_segs; i++) {
		uint8_t *base = c->segs[i].base;
		uint64_t step = c->segs[i].hugepages ? 2u << 20 : 4096;

		for (uint64_t off = 0; off < c->segs[i].size; off += step) {
			if ((off & (WARM_SLICE - 1)) == 0 && !warm_wait_quiet(c, &seen))
				return NULL;
			__atomic_fetch_add(base + off, 0, __ATOMIC_RELAXED);
			__atomic_fetch_add(&c->warmed, step, __ATOMIC_RELAXED);
		}
	}
	return NULL;
}

/*
 * Mapping ahead of a copy in.  A put's copy into a range the warm thread
 * has not reached yet (a fresh client, or one never quiet since connect)
 * pays a write fault for each 4 KiB page on its way: 2.7 GB/s here.  One
 * MADV_POPULATE_READ over the range first maps it in a single call (0.08
 * ms a MiB; shared memory mapped by a read is mapped writable), after
 * which the copy runs at memory speed: 5.9 GB/s for the two.  Copies out
 * need nothing: a read fault maps 16 pages at once (fault-around), and
 * populating first made them no faster.  Where the kernel has no
 * MADV_POPULATE_READ (before 5.14) the copy pays as before.
 */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define MAP_AHEAD_MIN (64u << 10)

void client_map_ahead(struct kvc_client *c, const void *p, size_t len)
{
	uint64_t order = 0, warmed;

	if (len < MAP_AHEAD_MIN || __atomic_load_n(&c->no_populate, __ATOMIC_RELAXED))
		return;
	warmed = __atomic_load_n(&c->warmed, __ATOMIC_RELAXED);
	for (size_t i = 0; i < c->n_segs; order += c->segs[i].size, i++) {
		const uint8_t *base = c->segs[i].base;
		uintptr_t start, end;

		if ((const uint8_t *) p < base || (const uint8_t *) p + len > base + c->segs[i].size)
			continue;
		if (c->segs[i].hugepages || order + ((const uint8_t *) p - base) + len <= warmed)
			return; /* few faults, or warm already */
		start = (uintptr_t) p & ~(uintptr_t) 4095;
		end = ((uintptr_t) p + len + 4095) & ~(uintptr_t) 4095;
		if (madvise((void *) start, end - start, MADV_POPULATE_READ) < 0 && errno == EINVAL)
			__atomic_store_n(&c->no_populate, true, __ATOMIC_RELAXED);
		return;
	}
}

static void warm_start(struct kvc_client *c)
{
	const char *e = getenv("KVCACHE_WARM");

	if (e && !strcmp(e, "0"))
		return;
	if (pthread_create(&c->warm_th, NULL, warm_main, c) == 0)
		c->warm_pid = getpid();
}

static void warm_stop(struct kvc_client *c)
{
	/* only the process that started it has the thread (not a fork) */
	if (!c->warm_pid || c->warm_pid != getpid())
		return;
	__atomic_store_n(&c->warm_stop, true, __ATOMIC_RELAXED);
	pthread_join(c->warm_th, NULL);
	c->warm_pid = 0;
}

bool kvc_connection_lost(const struct kvc_client *c)
{
	return c && __atomic_load_n(&c->broken, __ATOMIC_RELAXED);
}

uint64_t kvc_warmed_bytes(struct kvc_client *c)
{
	return c ? __atomic_load_n(&c->warmed, __ATOMIC_RELAXED) : 0;
}

int kvc_connect(const char *socket_path, struct kvc_client **ret)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvc_client *c;
	int r;

	if (!ret)
		return -EINVAL;
	r = shm_socket_path(socket_path, sa.sun_path, sizeof(sa.sun_path));
	if (r < 0)
		return r;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	for (size_t i = 0; i < MAX_SEGMENTS; i++)
		c->segs[i] = (struct shm_segment) SHM_SEGMENT_INIT;
	c->fd = client_fd_above_stdio(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	if (c->fd < 0) {
		r = -errno;
		goto fail;
	}
	if (connect(c->fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		r = -errno;
		goto fail;
	}
	r = handshake(c);
	if (r < 0)
		goto fail;
	r = chan_open(c);
	if (r < 0)
		goto fail;
	warm_start(c);
	*ret = c;
	return 0;
fail:
	kvc_disconnect(c);
	return r;
}

void kvc_disconnect(struct kvc_client *c)
{
	if (!c)
		return;
	warm_stop(c); /* before the segments go */
	chan_completion_fd_done(c);
	/* Closing the socket is the release: the daemon drops this
	 * connection's reservations and views when it sees the hang-up. */
	if (c->fd >= 0)
		close(c->fd);
	chan_close(&c->chan);
	for (size_t i = 0; i < c->n_segs; i++)
		shm_segment_done(&c->segs[i]);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static void set_put_opts(struct shm_sqe *e, const struct kvc_put_opts *opts)
{
	if (!opts)
		return;
	e->put_flags = client_wire_put_flags(opts->flags);
	e->pin_ttl_ms = opts->pin_ttl_ms;
	e->tier = (int8_t) opts->tier;
}

static int check_opts(const struct kvc_put_opts *opts)
{
	if (!opts)
		return 0;
	if (opts->parent_key && client_check_key(opts->parent_key) < 0)
		return -EINVAL;
	if (opts->tier < KVC_TIER_DEFAULT || opts->tier > KVC_TIER_DISK)
		return -EINVAL;
	if (opts->push_to && (!*opts->push_to || strlen(opts->push_to) > WIRE_MAX_NODE))
		return -EINVAL;
	return 0;
}

int kvc_reserve(struct kvc_client *c, const char *key, size_t len,
		const struct kvc_put_opts *opts, struct kvc_buf *ret)
{
	struct shm_sqe e;
	struct shm_cqe cqe;
	uint32_t t;
	void *p;
	int64_t r;

	if (!c || !ret || client_check_key(key) < 0 || len == 0 || check_opts(opts) < 0)
		return -EINVAL;
	if (len > KVC_VALUE_MAX)
		return -E2BIG;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return (int) r;
	chan_prep_key(&c->chan, t, &e, SHM_OP_RESERVE, key, opts ? opts->parent_key : NULL);
	e.arg = len;
	set_put_opts(&e, opts);
	r = chan_call(c, &e, t, &cqe);
	if (r < 0)
		return (int) r;
	if (cqe.len != len || client_extent_ptr(c, cqe.segment, cqe.offset, cqe.len, &p) < 0)
		return -EPROTO;
	*ret = (struct kvc_buf) { .data = p, .len = len, .handle = cqe.handle };
	return 0;
}

/* A descriptor that names only a handle (and with node, the node to push
 * to once stored). */
static int64_t handle_call_to(struct kvc_client *c, uint8_t op, uint64_t handle, const char *node)
{
	struct shm_sqe e = { .opcode = op, .flags = SHM_SQE_WANT_MSG, .arg = handle };
	uint32_t t;
	int r;

	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return r;
	e.user_data = t;
	e.msg_off = chan_slot_off(t) + CHAN_SLOT_USABLE;
	chan_slot(&c->chan, t)[CHAN_SLOT_USABLE] = '\0';
	if (node && (r = chan_push_to(&c->chan, t, &e, 0, node)) < 0) {
		chan_tag_put(&c->chan, t);
		return r;
	}
	return chan_call(c, &e, t, NULL);
}

static int64_t handle_call(struct kvc_client *c, uint8_t op, uint64_t handle)
{
	return handle_call_to(c, op, handle, NULL);
}

/* Commit b and push it to node in one request: -EOPNOTSUPP (b still
 * reserved) when the daemon does not take that. */
static int commit_push(struct kvc_client *c, struct kvc_buf *b, const char *node)
{
	int r;

	if (!(c->chan.features & SHM_CHAN_FEAT_PUSH))
		return -EOPNOTSUPP;
	r = (int) handle_call_to(c, SHM_OP_COMMIT, b->handle, node);
	*b = (struct kvc_buf) { 0 };
	return r;
}

int kvc_commit(struct kvc_client *c, struct kvc_buf *b)
{
	int r;

	if (!c || !b || !b->handle)
		return -EINVAL;
	/* Committed or refused, the reservation is gone either way. */
	r = (int) handle_call(c, SHM_OP_COMMIT, b->handle);
	*b = (struct kvc_buf) { 0 };
	return r;
}

int kvc_abort(struct kvc_client *c, struct kvc_buf *b)
{
	int r;

	if (!c || !b || !b->handle)
		return -EINVAL;
	r = (int) handle_call(c, SHM_OP_ABORT, b->handle);
	*b = (struct kvc_buf) { 0 };
	return r;
}

int kvc_put(struct kvc_client *c, const char *key, const void *val, size_t len,
	    const struct kvc_put_opts *opts)
{
	struct kvc_buf b;
	int r;

	if (!val)
		return -EINVAL;
	r = kvc_reserve(c, key, len, opts, &b);
	if (r < 0)
		return r;
	client_map_ahead(c, b.data, len);
	memcpy(b.data, val, len);
	if (opts && opts->push_to) {
		r = commit_push(c, &b, opts->push_to);
		if (r != -EOPNOTSUPP)
			return r;
	}
	r = kvc_commit(c, &b);
	if (r == 0 && opts && opts->push_to)
		r = kvc_push(c, key, opts->push_to); /* a daemon without SHM_SQE_PUSH */
	return r;
}

/* One key, one answer. */
static int64_t key_call(struct kvc_client *c, uint8_t op, const char *key, struct shm_cqe *ret)
{
	struct shm_sqe e;
	uint32_t t;
	int r;

	if (!c || client_check_key(key) < 0)
		return -EINVAL;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return r;
	chan_prep_key(&c->chan, t, &e, op, key, NULL);
	return chan_call(c, &e, t, ret);
}

int kvc_acquire(struct kvc_client *c, const char *key, struct kvc_view *ret)
{
	struct shm_cqe cqe;
	void *p;
	int64_t r;

	if (!ret)
		return -EINVAL;
	r = key_call(c, SHM_OP_ACQUIRE, key, &cqe);
	if (r < 0)
		return (int) r;
	if (client_extent_ptr(c, cqe.segment, cqe.offset, cqe.len, &p) < 0)
		return -EPROTO;
	*ret = (struct kvc_view) { .data = p, .len = cqe.len, .handle = cqe.handle };
	return 0;
}

int kvc_release(struct kvc_client *c, struct kvc_view *v)
{
	int r;

	if (!c || !v || !v->handle)
		return -EINVAL;
	r = (int) handle_call(c, SHM_OP_RELEASE, v->handle);
	*v = (struct kvc_view) { 0 };
	return r;
}

/* Release without waiting: a failure (which would be our own bug) is
 * counted by the reaper, never reported to the caller. */
static int release_async(struct kvc_client *c, uint64_t handle)
{
	struct shm_sqe e = {
		.opcode = SHM_OP_RELEASE,
		.flags = SHM_SQE_NO_CQE,
		.user_data = CHAN_NO_TAG,
		.arg = handle,
	};
	int r = chan_submit(c, &e, 1);

	if (r == 0)
		client_let_go(c);
	return r;
}

/*
 * A get of an object that comes from another node copies behind its
 * bytes as they land (SHM_SQE_STREAM): the daemon says where they land
 * and which progress word counts them in; what is in by the acquire's
 * answer is copied already.  The copy so far stands only if the word
 * still shows the landing it began on, never restarted, and the answer
 * names the same place; else the whole copy is made again from the
 * answer, as without streaming.
 */
#define STREAM_NAP 100                    /* us: sleep between looks at the word */
#define STREAM_IDLE (10 * USEC_PER_MSEC)  /* nothing new this long: just wait */

struct stream {
	const uint8_t *src;
	const uint64_t *word; /* NULL: not (or no longer) copying behind */
	uint64_t word0, len, copied;
};

/* Where a get's bytes go: buf of cap bytes, or (alloc) one made once the
 * length is known, made again if the length changes. */
struct get_dest {
	uint8_t *buf;
	size_t cap;
	kvc_alloc_fn alloc;
	void *ctx;
};

/* Room for len bytes: 0, or -ENOBUFS (a buffer too small), -ENOMEM (alloc
 * made none). */
static int dest_fit(struct get_dest *d, size_t len)
{
	if (!d->alloc)
		return len <= d->cap ? 0 : -ENOBUFS;
	if (d->buf && d->cap == len)
		return 0;
	d->buf = d->alloc(d->ctx, len);
	d->cap = d->buf ? len : 0;
	return d->buf ? 0 : -ENOMEM;
}

/* The daemon's news of where the object lands: copy behind it if it is
 * sound (inside the mappings, a word in a header, a length that fits). */
static void stream_from(struct kvc_client *c, const struct shm_cqe *m, struct get_dest *d,
			struct stream *s)
{
	void *p;

	*s = (struct stream) { 0 };
	if (m->reserved[0] >= SHM_SEG_PROGRESS_SLOTS ||
	    (m->reserved[1] & (SHM_PROGRESS_BYTES | SHM_PROGRESS_RESTART)) ||
	    client_extent_ptr(c, m->segment, m->offset, m->len, &p) < 0 ||
	    dest_fit(d, m->len) < 0)
		return;
	s->src = p;
	s->len = m->len;
	s->word0 = m->reserved[1];
	s->word = (const uint64_t *) ((const uint8_t *) c->segs[m->segment].base +
				      SHM_SEG_PROGRESS_OFF) + m->reserved[0];
}

/* Bytes in now, or the copy so far is void (s->word NULL). */
static uint64_t stream_in(struct stream *s)
{
	uint64_t w = __atomic_load_n(s->word, __ATOMIC_ACQUIRE);

	if ((w & ~SHM_PROGRESS_BYTES) != s->word0) {
		s->word = NULL; /* started over, or the landing is over */
		return 0;
	}
	w &= SHM_PROGRESS_BYTES;
	return w < s->len ? w : s->len;
}

static int64_t get_streamed(struct kvc_client *c, const char *key, struct get_dest *d,
			    struct shm_cqe *ret, uint64_t *ret_copied)
{
	struct stream s = { 0 };
	struct shm_sqe e;
	struct shm_cqe m;
	uint32_t t, seen = 0;
	usec_t idle;
	int64_t r;
	void *p;

	if (client_check_key(key) < 0)
		return -EINVAL;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return r;
	chan_prep_key(&c->chan, t, &e, SHM_OP_ACQUIRE, key, NULL);
	e.flags |= SHM_SQE_STREAM;
	r = chan_submit(c, &e, 1);
	idle = mono_us();
	while (r == 0 && !chan_tag_done(c, t)) {
		uint32_t k = chan_more(c, t, &m);
		uint64_t in;

		if (k != seen) { /* (a later one: it lands elsewhere now) */
			seen = k;
			stream_from(c, &m, d, &s);
		}
		if (s.word && (in = stream_in(&s)) > s.copied) {
			memcpy(d->buf + s.copied, s.src + s.copied, in - s.copied);
			s.copied = in;
			idle = mono_us();
			continue;
		}
		r = chan_wait_more(c, t, seen, mono_us() - idle > STREAM_IDLE ? -1 : STREAM_NAP);
		if (r == -ETIMEDOUT)
			r = 0;
	}
	r = chan_call_end(c, t, r, ret);
	if (r < 0)
		return r;
	/* the copy so far is the answer's, from its only landing */
	if (s.word && s.copied)
		stream_in(&s); /* (no word any more if it started over) */
	if (s.word && s.copied && ret->len == s.len &&
	    client_extent_ptr(c, ret->segment, ret->offset, ret->len, &p) == 0 && p == s.src)
		*ret_copied = s.copied;
	return r;
}

static ssize_t get_to(struct kvc_client *c, const char *key, struct get_dest *d)
{
	struct shm_cqe cqe;
	uint64_t copied = 0;
	ssize_t n;
	void *p;
	int64_t r;
	int rr;

	if (c && (c->chan.features & SHM_CHAN_FEAT_STREAM) && (d->cap || d->alloc))
		r = get_streamed(c, key, d, &cqe, &copied);
	else
		r = key_call(c, SHM_OP_ACQUIRE, key, &cqe);
	if (r < 0)
		return r;
	if (client_extent_ptr(c, cqe.segment, cqe.offset, cqe.len, &p) < 0)
		n = -EPROTO;
	else if ((n = dest_fit(d, cqe.len)) == 0) {
		if (cqe.len > copied)
			memcpy(d->buf + copied, (uint8_t *) p + copied, cqe.len - copied);
		n = (ssize_t) cqe.len;
	}
	rr = release_async(c, cqe.handle);
	return rr < 0 ? rr : n;
}

ssize_t kvc_get(struct kvc_client *c, const char *key, void *buf, size_t cap)
{
	struct get_dest d = { .buf = buf, .cap = cap };

	if (!buf && cap)
		return -EINVAL;
	return get_to(c, key, &d);
}

ssize_t kvc_get_alloc(struct kvc_client *c, const char *key, kvc_alloc_fn alloc, void *ctx,
		      void **ret_buf)
{
	struct get_dest d = { .alloc = alloc, .ctx = ctx };
	ssize_t n;

	if (!alloc || !ret_buf)
		return -EINVAL;
	n = get_to(c, key, &d);
	*ret_buf = n >= 0 ? d.buf : NULL;
	return n;
}

int kvc_exists(struct kvc_client *c, const char *key)
{
	return (int) key_call(c, SHM_OP_EXISTS, key, NULL);
}

int kvc_remove(struct kvc_client *c, const char *key)
{
	int64_t r = key_call(c, SHM_OP_REMOVE, key, NULL);

	return r < 0 ? (int) r : 0;
}

int kvc_remove_force(struct kvc_client *c, const char *key)
{
	struct shm_sqe e;
	uint32_t t;
	int64_t r;

	if (!c || client_check_key(key) < 0)
		return -EINVAL;
	r = chan_tag_get(c, TAG_SYNC, true, &t);
	if (r < 0)
		return (int) r;
	chan_prep_key(&c->chan, t, &e, SHM_OP_REMOVE, key, NULL);
	e.arg = WIRE_REMOVE_FORCE;
	r = chan_call(c, &e, t, NULL);
	return r < 0 ? (int) r : 0;
}

/*
 * Many keys: each chunk that fits one tag's arena slot is one descriptor;
 * all chunks go out before any answer is awaited.
 */
struct keys_chunk {
	uint32_t tag;
	size_t first, n;
};

static int keys_batch(struct kvc_client *c, uint8_t op, const char *const *keys, size_t n,
		      uint8_t *ret_present, bool prefix)
{
	struct chan *ch = &c->chan;
	struct keys_chunk chunks[16];
	size_t next = 0, total = 0;
	int r = 0;

	for (size_t i = 0; i < n; i++)
		if (client_check_key(keys[i]) < 0)
			return -EINVAL;
	while (next < n) {
		unsigned n_chunks = 0;
		bool stop = false;

		/* fill and submit up to 16 chunks */
		while (next < n && n_chunks < 16) {
			struct keys_chunk *k = &chunks[n_chunks];
			struct shm_sqe e = { .opcode = op };
			uint32_t used, cap_refs;
			uint8_t *slot;

			r = chan_tag_get(c, TAG_SYNC, true, &k->tag);
			if (r < 0)
				goto drain;
			slot = chan_slot(ch, k->tag);
			/* refs first, then results (batch), then the key bytes */
			cap_refs = CHAN_SLOT_USABLE / (sizeof(struct shm_key_ref) + 1 + 8);
			k->first = next;
			k->n = 0;
			used = cap_refs * (uint32_t) (sizeof(struct shm_key_ref) + 1);
			while (next < n && k->n < cap_refs) {
				size_t len = strlen(keys[next]);
				struct shm_key_ref ref = { chan_slot_off(k->tag) + used, (uint32_t) len };

				if (used + len > CHAN_SLOT_USABLE)
					break;
				memcpy(slot + used, keys[next], len);
				memcpy(slot + k->n * sizeof(ref), &ref, sizeof(ref));
				used += (uint32_t) len;
				k->n++;
				next++;
			}
			e.user_data = k->tag;
			e.count = (uint32_t) k->n;
			e.list_off = chan_slot_off(k->tag);
			e.out_off = chan_slot_off(k->tag) + cap_refs * (uint32_t) sizeof(struct shm_key_ref);
			r = chan_submit(c, &e, 1);
			if (r < 0) {
				chan_tag_put(ch, k->tag);
				goto drain;
			}
			n_chunks++;
		}
drain:
		for (unsigned i = 0; i < n_chunks; i++) {
			struct keys_chunk *k = &chunks[i];
			int64_t res = chan_wait(c, k->tag);

			if (res == -ECONNRESET && c->broken)
				return (int) res;
			if (res < 0 && r == 0)
				r = (int) res;
			if (res >= 0 && !stop) {
				if (ret_present) {
					const uint8_t *out = chan_slot(ch, k->tag) +
						(CHAN_SLOT_USABLE / (sizeof(struct shm_key_ref) + 1 + 8)) *
						sizeof(struct shm_key_ref);

					for (size_t j = 0; j < k->n; j++)
						ret_present[k->first + j] = out[j] ? 1 : 0;
				}
				total += (size_t) res;
				if (prefix && (size_t) res < k->n)
					stop = true; /* later chunks do not count */
			}
			chan_tag_put(ch, k->tag);
		}
		if (r < 0)
			return r;
		if (stop)
			break;
	}
	return (int) total;
}

int kvc_batch_exists(struct kvc_client *c, const char *const *keys, size_t n,
		     uint8_t *ret_present)
{
	if (!c || (n && (!keys || !ret_present)) || n > INT32_MAX)
		return -EINVAL;
	return keys_batch(c, SHM_OP_BATCH_EXISTS, keys, n, ret_present, false);
}

int kvc_prefix_lookup(struct kvc_client *c, const char *const *keys, size_t n)
{
	if (!c || (n && !keys) || n > INT32_MAX)
		return -EINVAL;
	return keys_batch(c, SHM_OP_PREFIX_LOOKUP, keys, n, NULL, true);
}
