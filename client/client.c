/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvcache/kvcache.h"
#include "shmem.h"
#include "client-private.h"

#define MAX_SEGMENTS WIRE_MAX_FDS

struct kvc_client {
	int fd;
	bool broken;
	pthread_mutex_t lock; /* one request/response in flight at a time */
	uint32_t seq;
	uint64_t client_id;
	uint64_t max_value;
	size_t n_segs;
	struct shm_segment segs[MAX_SEGMENTS];
};

static __thread char last_msg[256];

const char *kvc_last_error_msg(void)
{
	return last_msg;
}

static void set_msg(const char *m)
{
	snprintf(last_msg, sizeof(last_msg), "%s", m ? m : "");
}

static int check_key(const char *key)
{
	size_t n;

	if (!key)
		return -EINVAL;
	n = strnlen(key, KVC_KEY_MAX + 1);
	return n == 0 || n > KVC_KEY_MAX ? -EINVAL : 0;
}

static ProtobufCBinaryData key_bytes(const char *key)
{
	return (ProtobufCBinaryData) { .len = strlen(key), .data = (uint8_t *) key };
}

/* Read exactly len bytes; fds that arrive are stored in fds[]. */
static int recv_exact(int fd, void *buf, size_t len, int *fds, size_t max_fds, size_t *n_fds)
{
	uint8_t *p = buf;

	while (len > 0) {
		size_t got = 0;
		ssize_t n = wire_recv_some(fd, p, len, fds ? fds + *n_fds : NULL,
					   fds ? max_fds - *n_fds : 0, &got, 0);
		if (n < 0)
			return (int) n;
		if (n == 0)
			return -ECONNRESET;
		if (fds)
			*n_fds += got;
		p += n;
		len -= (size_t) n;
	}
	return 0;
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
	if (r < 0 || h.type != type || h.n_fds != (fds ? *n_fds : 0)) {
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
	Kvc__Response *resp = NULL;
	struct wire_hdr h;
	uint8_t *buf = NULL, *payload = NULL;
	size_t len;
	uint32_t seq;
	int r;

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
	r = recv_frame(c, WIRE_RESPONSE, &h, &payload, NULL, NULL);
	if (r < 0) {
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
	if (r < 0)
		return r;
	if (resp->error != 0) {
		r = resp->error > 0 && resp->error < 4096 ? -resp->error : -EPROTO;
		set_msg(resp->error_msg);
		kvc__response__free_unpacked(resp, NULL);
		return r;
	}
	set_msg(NULL);
	*ret = resp;
	return 0;
}

/* The daemon says where bytes are; still check that it is inside a mapping. */
static int extent_ptr(struct kvc_client *c, const Kvc__Extent *e, void **ret)
{
	const struct shm_segment *s;

	if (!e || e->segment >= c->n_segs)
		return -EPROTO;
	s = &c->segs[e->segment];
	if (e->offset < SHM_HEADER_SIZE || e->offset > s->size || e->len > s->size - e->offset)
		return -EPROTO;
	*ret = (uint8_t *) s->base + e->offset;
	return 0;
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
		set_msg(w->error_msg);
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
		r = shm_segment_map(&c->segs[i], fds[si->fd_index], si->size);
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
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
	/* Closing the socket is the release: the daemon drops this
	 * connection's reservations and views when it sees the hang-up. */
	if (c->fd >= 0)
		close(c->fd);
	for (size_t i = 0; i < c->n_segs; i++)
		shm_segment_done(&c->segs[i]);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int kvc_reserve(struct kvc_client *c, const char *key, size_t len,
		const struct kvc_put_opts *opts, struct kvc_buf *ret)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__ReserveReq rq = KVC__RESERVE_REQ__INIT;
	Kvc__PutOpts po = KVC__PUT_OPTS__INIT;
	Kvc__Response *resp;
	void *p;
	int r;

	if (!c || !ret || check_key(key) < 0 || len == 0)
		return -EINVAL;
	if (len > KVC_VALUE_MAX)
		return -E2BIG;
	if (opts) {
		if (opts->parent_key && check_key(opts->parent_key) < 0)
			return -EINVAL;
		po.flags = opts->flags;
		po.pin_ttl_ms = opts->pin_ttl_ms;
		po.tier = opts->tier;
		if (opts->parent_key)
			po.parent_key = key_bytes(opts->parent_key);
		rq.opts = &po;
	}
	rq.key = key_bytes(key);
	rq.len = len;
	q.op = KVC__OP__OP_RESERVE;
	q.body_case = KVC__REQUEST__BODY_RESERVE;
	q.reserve = &rq;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_EXTENT || resp->extent->len != len ||
	    extent_ptr(c, resp->extent, &p) < 0)
		r = -EPROTO;
	else
		*ret = (struct kvc_buf) { .data = p, .len = len, .handle = resp->extent->handle };
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

static int handle_op(struct kvc_client *c, uint32_t op, uint64_t handle)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__HandleReq hq = KVC__HANDLE_REQ__INIT;
	Kvc__Response *resp;
	int r;

	hq.handle = handle;
	q.op = op;
	q.body_case = KVC__REQUEST__BODY_HANDLE;
	q.handle = &hq;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	kvc__response__free_unpacked(resp, NULL);
	return 0;
}

int kvc_commit(struct kvc_client *c, struct kvc_buf *b)
{
	int r;

	if (!c || !b || !b->handle)
		return -EINVAL;
	/* Committed or refused, the reservation is gone either way. */
	r = handle_op(c, KVC__OP__OP_COMMIT, b->handle);
	*b = (struct kvc_buf) { 0 };
	return r;
}

int kvc_abort(struct kvc_client *c, struct kvc_buf *b)
{
	int r;

	if (!c || !b || !b->handle)
		return -EINVAL;
	r = handle_op(c, KVC__OP__OP_ABORT, b->handle);
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
	memcpy(b.data, val, len);
	return kvc_commit(c, &b);
}

static int key_op(struct kvc_client *c, uint32_t op, const char *key, Kvc__Response **ret)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq kq = KVC__KEY_REQ__INIT;

	if (!c || check_key(key) < 0)
		return -EINVAL;
	kq.key = key_bytes(key);
	q.op = op;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &kq;
	return client_rpc(c, &q, ret);
}

int kvc_acquire(struct kvc_client *c, const char *key, struct kvc_view *ret)
{
	Kvc__Response *resp;
	void *p;
	int r;

	if (!ret)
		return -EINVAL;
	r = key_op(c, KVC__OP__OP_ACQUIRE, key, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_EXTENT || extent_ptr(c, resp->extent, &p) < 0)
		r = -EPROTO;
	else
		*ret = (struct kvc_view) {
			.data = p, .len = resp->extent->len, .handle = resp->extent->handle
		};
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_release(struct kvc_client *c, struct kvc_view *v)
{
	int r;

	if (!c || !v || !v->handle)
		return -EINVAL;
	r = handle_op(c, KVC__OP__OP_RELEASE, v->handle);
	*v = (struct kvc_view) { 0 };
	return r;
}

ssize_t kvc_get(struct kvc_client *c, const char *key, void *buf, size_t cap)
{
	struct kvc_view v;
	ssize_t n;
	int r;

	if (!buf && cap)
		return -EINVAL;
	r = kvc_acquire(c, key, &v);
	if (r < 0)
		return r;
	if (v.len > cap)
		n = -ENOBUFS;
	else {
		memcpy(buf, v.data, v.len);
		n = (ssize_t) v.len;
	}
	r = kvc_release(c, &v);
	return r < 0 ? r : n;
}

int kvc_exists(struct kvc_client *c, const char *key)
{
	Kvc__Response *resp;
	int r;

	r = key_op(c, KVC__OP__OP_EXISTS, key, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_EXISTS)
		r = -EPROTO;
	else
		r = resp->exists->count > 0;
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_remove(struct kvc_client *c, const char *key)
{
	Kvc__Response *resp;
	int r;

	r = key_op(c, KVC__OP__OP_REMOVE, key, &resp);
	if (r < 0)
		return r;
	kvc__response__free_unpacked(resp, NULL);
	return 0;
}

/* One round trip for up to WIRE_MAX_BATCH keys. */
static int keys_chunk(struct kvc_client *c, uint32_t op, const char *const *keys, size_t n,
		      uint8_t *ret_present, uint32_t *ret_count)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeysReq kq = KVC__KEYS_REQ__INIT;
	ProtobufCBinaryData *kb;
	Kvc__Response *resp;
	int r;

	kb = calloc(n ? n : 1, sizeof(*kb));
	if (!kb)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (check_key(keys[i]) < 0) {
			free(kb);
			return -EINVAL;
		}
		kb[i] = key_bytes(keys[i]);
	}
	kq.n_keys = n;
	kq.keys = kb;
	q.op = op;
	q.body_case = KVC__REQUEST__BODY_KEYS;
	q.keys = &kq;
	r = client_rpc(c, &q, &resp);
	free(kb);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_EXISTS || resp->exists->count > n ||
	    (ret_present && resp->exists->present.len != n))
		r = -EPROTO;
	else {
		if (ret_present)
			for (size_t i = 0; i < n; i++)
				ret_present[i] = resp->exists->present.data[i] ? 1 : 0;
		*ret_count = resp->exists->count;
	}
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_batch_exists(struct kvc_client *c, const char *const *keys, size_t n,
		     uint8_t *ret_present)
{
	size_t total = 0;

	if (!c || (n && (!keys || !ret_present)) || n > INT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i += WIRE_MAX_BATCH) {
		size_t k = n - i < WIRE_MAX_BATCH ? n - i : WIRE_MAX_BATCH;
		uint32_t cnt;
		int r = keys_chunk(c, KVC__OP__OP_BATCH_EXISTS, keys + i, k, ret_present + i, &cnt);

		if (r < 0)
			return r;
		total += cnt;
	}
	return (int) total;
}

int kvc_prefix_lookup(struct kvc_client *c, const char *const *keys, size_t n)
{
	size_t total = 0;

	if (!c || (n && !keys) || n > INT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i += WIRE_MAX_BATCH) {
		size_t k = n - i < WIRE_MAX_BATCH ? n - i : WIRE_MAX_BATCH;
		uint32_t cnt;
		int r = keys_chunk(c, KVC__OP__OP_PREFIX_LOOKUP, keys + i, k, NULL, &cnt);

		if (r < 0)
			return r;
		total += cnt;
		if (cnt < k)
			break;
	}
	return (int) total;
}
