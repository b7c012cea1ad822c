/* SPDX-License-Identifier: MIT */
/*
 * One connected client: its socket buffers, and the reservations and views it
 * holds.  Everything a client sends is untrusted; a bad frame earns an error
 * response (and, when the stream can no longer be followed, a hang-up), never
 * a daemon crash or a leak.  When the socket goes away, whatever the client
 * held is given back.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admin.h"
#include "buffer.h"
#include "channel.h"
#include "copier.h"
#include "session.h"
#include "kvc-config.h"
#include "log.h"

#define LOG_TOPIC "session"

#define IN_INITIAL (64u << 10)
#define OUT_MAX (16u << 20)       /* a client that does not read is dropped */

/* ---- output ---- */

static void update_events(struct session *s)
{
	/* While output is backed up, stop reading: a client that does not
	 * read its answers gets no more of them. */
	uint32_t want = s->out_off < s->out_len ? EPOLLOUT : EPOLLIN;

	if (want != s->events && !s->closing && !s->parked.active) {
		s->events = want;
		loop_set_io_events(s->src, want);
	}
}

static int flush(struct session *s)
{
	while (s->out_off < s->out_len) {
		struct iovec iov = { s->out + s->out_off, s->out_len - s->out_off };
		union {
			char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
			struct cmsghdr align;
		} control;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (s->n_out_fds) {
			struct cmsghdr *cm;

			memset(&control, 0, sizeof(control));
			mh.msg_control = control.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * s->n_out_fds);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * s->n_out_fds);
			memcpy(CMSG_DATA(cm), s->out_fds, sizeof(int) * s->n_out_fds);
		}
		n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			return -errno;
		}
		s->n_out_fds = 0;
		s->out_off += (size_t) n;
	}
	if (s->out_off == s->out_len)
		s->out_off = s->out_len = 0;
	update_events(s);
	return 0;
}

static int send_frame(struct session *s, uint16_t type, uint32_t seq, const ProtobufCMessage *m,
		      const int *fds, size_t n_fds)
{
	uint8_t *buf;
	size_t len;
	int r;

	r = wire_frame_pack(type, seq, (uint16_t) n_fds, m, &buf, &len);
	if (r < 0)
		return r;
	if (s->out_len - s->out_off + len > OUT_MAX) {
		free(buf);
		return -ENOBUFS;
	}
	if (s->out_off == s->out_len) {
		free(s->out);
		s->out = buf;
		s->out_off = 0;
		s->out_len = len;
	} else {
		uint8_t *n = realloc(s->out, s->out_len + len);

		if (!n) {
			free(buf);
			return -ENOMEM;
		}
		memcpy(n + s->out_len, buf, len);
		free(buf);
		s->out = n;
		s->out_len += len;
	}
	if (n_fds)
		memcpy(s->out_fds, fds, sizeof(int) * n_fds);
	s->n_out_fds = n_fds;
	return flush(s);
}

static void send_error(struct session *s, uint32_t seq, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void send_error(struct session *s, uint32_t seq, int err, const char *fmt, ...)
{
	Kvc__Response resp = KVC__RESPONSE__INIT;
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	resp.error = err;
	resp.error_msg = msg;
	if (send_frame(s, WIRE_RESPONSE, seq, &resp.base, NULL, 0) < 0)
		s->closing = true;
}

/* A violation after which the stream cannot be trusted: answer, then hang up. */
static void fatal(struct session *s, uint32_t seq, int err, const char *why)
{
	log_notice("client[pid=%d,%s]: %s; disconnecting", (int) s->pid, s->name, why);
	s->sv->stats.protocol_errors++;
	send_error(s, seq, err, "%s", why);
	s->closing = true;
}

/* ---- operations ---- */

static void set_extent(struct reply *rep, const struct extent *e)
{
	rep->extent.handle = e->handle;
	rep->extent.segment = e->segment;
	rep->extent.offset = e->offset;
	rep->extent.len = e->len;
	rep->resp.body_case = KVC__RESPONSE__BODY_EXTENT;
	rep->resp.extent = &rep->extent;
}

static int op_reserve(struct session *s, const Kvc__ReserveReq *rq, struct reply *rep)
{
	struct put_args a = {
		.key = rq->key.data,
		.key_len = rq->key.len,
		.len = rq->len,
	};
	struct extent e;
	int r;

	if (rq->opts) {
		a.flags = rq->opts->flags;
		a.tier = rq->opts->tier;
		a.pin_ttl = rq->opts->pin_ttl_ms * USEC_PER_MSEC;
		if (rq->opts->parent_key.len) {
			a.parent = rq->opts->parent_key.data;
			a.parent_len = rq->opts->parent_key.len;
		}
	}
	r = store_reserve(&s->h, &a, &e, rep->msg);
	if (r == 0)
		set_extent(rep, &e);
	return r;
}

static void process(struct session *s);
static void parked_done(struct waiter *w, int res);
static void session_buffer_made(struct session *s, uint32_t seq, int r, uint64_t handle,
				int fd, uint64_t size);

/* The request waits on f (parked_done() answers it); the session reads
 * nothing more until then (a hang-up is still reported).  -EINPROGRESS. */
static int park(struct session *s, uint32_t op, uint32_t seq, const ProtobufCBinaryData *key,
		struct fetch *f)
{
	s->parked.op = op;
	s->parked.active = true;
	s->parked.seq = seq;
	memcpy(s->parked.key, key->data, key->len);
	s->parked.key_len = (uint32_t) key->len;
	s->parked.w.done = parked_done;
	fetch_wait(f, &s->parked.w);
	s->events = 0;
	loop_set_io_events(s->src, 0);
	return -EINPROGRESS;
}

/* -EINPROGRESS: the answer comes later (the object is read back from disk
 * or fetched from another node; see park()). */
static int op_acquire(struct session *s, uint32_t seq, const ProtobufCBinaryData *key,
		      struct reply *rep)
{
	struct extent e;
	struct fetch *pending = NULL;
	int r = store_acquire(&s->h, key->data, key->len, false, &e, &pending, rep->msg);

	if (r == -EINPROGRESS && pending && key->len <= sizeof(s->parked.key))
		return park(s, KVC__OP__OP_ACQUIRE, seq, key, pending);
	if (r == -EINPROGRESS) {
		snprintf(rep->msg, sizeof(rep->msg), "the object could not be read back from disk");
		r = -EIO;
	}
	if (r == 0)
		set_extent(rep, &e);
	return r;
}

/* The nodes holding key: this one first if it does, then what the
 * directory says (the session waits for it, see parked_done()). */
static int op_where(struct session *s, uint32_t seq, const ProtobufCBinaryData *key,
		    struct reply *rep, bool settle)
{
	struct store *st = s->sv->st;
	const struct cluster_admin *a = s->sv->admin;
	char others[1024] = "", *save = NULL;
	struct fetch *pending = NULL;
	Kvc__WhereResp *w;
	char **nodes, *copy;
	size_t n = 0;
	char self[256];
	struct cluster_view *v = NULL;
	int r = 0;

	if (key->len > sizeof(s->parked.key))
		return -EINVAL;
	if (a) {
		char k[WIRE_MAX_KEY + 1];

		memcpy(k, key->data, key->len);
		k[key->len] = '\0';
		r = a->holders(a->be, k, key->len, others, sizeof(others), settle, &pending);
		if (r == -EINPROGRESS && pending)
			return park(s, KVC__OP__OP_WHERE, seq, key, pending);
		if (r < 0)
			return r;
	}
	self[0] = '\0';
	if (store_find(st, key->data, key->len)) {
		v = calloc(1, sizeof(*v));
		if (v && a && a->describe(a->be, v) == 0 && v->self)
			snprintf(self, sizeof(self), "%s", v->self);
		else
			snprintf(self, sizeof(self), "%s", "(this node)");
		free(v);
	}
	w = calloc(1, sizeof(*w));
	nodes = calloc(64, sizeof(*nodes));
	copy = malloc(sizeof(others) + sizeof(self) + 1);
	if (!w || !nodes || !copy) {
		free(w);
		free(nodes);
		free(copy);
		return -ENOMEM;
	}
	kvc__where_resp__init(w);
	snprintf(copy, sizeof(others) + sizeof(self) + 1, "%s%s%s", self, self[0] && others[0] ? "," : "",
		 others);
	for (char *t = strtok_r(copy, ",", &save); t && n < 64; t = strtok_r(NULL, ",", &save))
		nodes[n++] = t;
	w->n_nodes = n;
	w->nodes = nodes;
	rep->resp.body_case = KVC__RESPONSE__BODY_WHERE;
	rep->resp.where = w;
	rep->free1 = nodes;
	rep->free2 = copy;
	return n ? 0 : -ENOENT;
}

/* The cluster as this node sees it, the members' loads asked of the
 * masters first (the session waits for them, see parked_done()); with
 * settle, at once. */
static int op_cluster(struct session *s, uint32_t seq, struct reply *rep, bool settle)
{
	const struct cluster_admin *a = s->sv->admin;
	const ProtobufCBinaryData none = { .len = 0, .data = (uint8_t *) "" };
	struct fetch *pending = NULL;

	if (!settle && a && a->refresh && a->refresh(a->be, &pending) == -EINPROGRESS && pending)
		return park(s, KVC__OP__OP_CLUSTER, seq, &none, pending);
	return admin_cluster(s, rep);
}

static int op_keys(struct session *s, const Kvc__KeysReq *kq, bool prefix, struct reply *rep)
{
	uint8_t *present = NULL;
	uint32_t count = 0;

	if (!prefix) {
		present = calloc(kq->n_keys ? kq->n_keys : 1, 1);
		if (!present)
			return -ENOMEM;
		rep->free1 = present;
	}
	for (size_t i = 0; i < kq->n_keys; i++) {
		if (store_exists(s->sv->st, kq->keys[i].data, kq->keys[i].len, prefix, false)) {
			count++;
			if (present)
				present[i] = 1;
		} else if (prefix)
			break;
	}
	if (present)
		rep->exists.present = (ProtobufCBinaryData) { .len = kq->n_keys, .data = present };
	rep->exists.count = count;
	rep->resp.body_case = KVC__RESPONSE__BODY_EXISTS;
	rep->resp.exists = &rep->exists;
	return 0;
}


static void reply_free(struct reply *rep)
{
	switch (rep->resp.body_case) {
	case KVC__RESPONSE__BODY_STATUS:
		free(rep->resp.status);
		break;
	case KVC__RESPONSE__BODY_STATS:
		free(rep->resp.stats->counters);
		free(rep->resp.stats);
		break;
	case KVC__RESPONSE__BODY_LIST:
		free(rep->resp.list->keys);
		free(rep->resp.list);
		break;
	case KVC__RESPONSE__BODY_EVICT:
		free(rep->resp.evict);
		break;
	case KVC__RESPONSE__BODY_REMOVE:
		free(rep->resp.remove);
		break;
	case KVC__RESPONSE__BODY_WHERE:
		free(rep->resp.where);
		break;
	default:
		break;
	}
	free(rep->free1);
	free(rep->free2);
}

static void send_reply(struct session *s, uint32_t seq, uint32_t op, int r, struct reply *rep)
{
	if (r < 0) {
		if (r != -ENOENT && r != -EEXIST)
			store_stats(s->sv->st)->errors++;
		reply_free(rep);
		rep->resp = (Kvc__Response) KVC__RESPONSE__INIT;
		rep->resp.error = -r;
		rep->resp.error_msg = rep->msg[0] ? rep->msg : (char *) "";
		rep->free1 = rep->free2 = NULL;
		rep->n_fds = 0;
		log_debug("client[pid=%d]: op %u failed: %s %s", (int) s->pid, op, strerror(-r),
			  rep->msg);
	}
	if (send_frame(s, WIRE_RESPONSE, seq, &rep->resp.base, rep->fds, rep->n_fds) < 0)
		s->closing = true;
	reply_free(rep);
}

static void handle_request(struct session *s, const struct wire_hdr *h, const uint8_t *payload)
{
	struct server *sv = s->sv;
	struct reply rep = { .resp = KVC__RESPONSE__INIT, .extent = KVC__EXTENT__INIT,
			     .exists = KVC__EXISTS_RESP__INIT };
	const char *why = NULL;
	Kvc__Request *q;
	int r;

	r = wire_request_decode(payload, h->len, &q, &why);
	if (r < 0) {
		sv->stats.protocol_errors++;
		send_error(s, h->seq, -r, "%s", why);
		return;
	}
	switch (q->op) {
	case KVC__OP__OP_RESERVE:
		r = op_reserve(s, q->reserve, &rep);
		break;
	case KVC__OP__OP_COMMIT:
		r = store_commit(&s->h, q->handle->handle, rep.msg);
		break;
	case KVC__OP__OP_ABORT:
		r = store_abort(&s->h, q->handle->handle, rep.msg);
		break;
	case KVC__OP__OP_ACQUIRE:
		r = op_acquire(s, h->seq, &q->key->key, &rep);
		if (r == -EINPROGRESS) {
			/* answered by parked_done() */
			kvc__request__free_unpacked(q, NULL);
			return;
		}
		break;
	case KVC__OP__OP_WHERE:
		r = op_where(s, h->seq, &q->key->key, &rep, false);
		if (r == -EINPROGRESS) {
			kvc__request__free_unpacked(q, NULL);
			return;
		}
		break;
	case KVC__OP__OP_RELEASE:
		r = store_release(&s->h, q->handle->handle, rep.msg);
		break;
	case KVC__OP__OP_EXISTS: {
		Kvc__KeysReq one = KVC__KEYS_REQ__INIT;

		one.n_keys = 1;
		one.keys = &q->key->key;
		r = op_keys(s, &one, true, &rep);
		break;
	}
	case KVC__OP__OP_BATCH_EXISTS:
		r = op_keys(s, q->keys, false, &rep);
		break;
	case KVC__OP__OP_PREFIX_LOOKUP:
		r = op_keys(s, q->keys, true, &rep);
		break;
	case KVC__OP__OP_REMOVE:
		r = store_remove(sv->st, q->key->key.data, q->key->key.len, false, false, rep.msg);
		break;
	case KVC__OP__OP_STATUS:
		r = admin_status(s, &rep);
		break;
	case KVC__OP__OP_STATS:
		r = admin_stats(s, &rep);
		break;
	case KVC__OP__OP_CLUSTER:
		r = op_cluster(s, h->seq, &rep, false);
		if (r == -EINPROGRESS) {
			kvc__request__free_unpacked(q, NULL);
			return;
		}
		break;
	case KVC__OP__OP_PUSH: {
		char k[WIRE_MAX_KEY + 1];

		memcpy(k, q->push->key.data, q->push->key.len);
		k[q->push->key.len] = '\0';
		r = server_push(sv, k, q->push->key.len, q->push->node, rep.msg);
		break;
	}
	case KVC__OP__OP_PREFETCH: {
		uint32_t started = 0;

		for (size_t i = 0; i < q->keys->n_keys; i++)
			started += (uint32_t) store_prefetch(sv->st, q->keys->keys[i].data,
							     q->keys->keys[i].len);
		rep.exists.count = started;
		rep.resp.body_case = KVC__RESPONSE__BODY_EXISTS;
		rep.resp.exists = &rep.exists;
		r = 0;
		break;
	}
	case KVC__OP__OP_ANNOUNCE: {
		uint32_t announced = 0;

		r = 0;
		for (size_t i = 0; i < q->keys->n_keys && r == 0; i++) {
			r = store_announce(sv->st, q->keys->keys[i].data, q->keys->keys[i].len);
			announced += r == 0;
		}
		if (r == -ENOSPC)
			snprintf(rep.msg, sizeof(rep.msg), "too many puts announced and not yet stored");
		rep.exists.count = announced;
		rep.resp.body_case = KVC__RESPONSE__BODY_EXISTS;
		rep.resp.exists = &rep.exists;
		break;
	}
	case KVC__OP__OP_LIST:
		r = admin_list(s, q->list, &rep);
		break;
	case KVC__OP__OP_EVICT:
		r = admin_evict(s, q->evict, &rep);
		break;
	case KVC__OP__OP_CHANNEL_OPEN:
		r = channel_open(s, rep.fds, rep.msg);
		if (r == 0) {
			rep.n_fds = 2;
			rep.extent.len = SHM_CHAN_SIZE;
			rep.resp.body_case = KVC__RESPONSE__BODY_EXTENT;
			rep.resp.extent = &rep.extent;
		}
		break;
	case KVC__OP__OP_BUFFER_ALLOC:
		r = buffer_create_start(s, h->seq, q->buffer->size, session_buffer_made,
					&rep.extent.handle, rep.fds, rep.msg);
		if (r == -EINPROGRESS) {
			/* answered by session_buffer_made() */
			s->parked.op = KVC__OP__OP_BUFFER_ALLOC;
			s->parked.active = true;
			s->events = 0;
			loop_set_io_events(s->src, 0);
			kvc__request__free_unpacked(q, NULL);
			return;
		}
		if (r == 0) {
			rep.n_fds = 1;
			rep.extent.len = (q->buffer->size + 4095) & ~UINT64_C(4095);
			rep.resp.body_case = KVC__RESPONSE__BODY_EXTENT;
			rep.resp.extent = &rep.extent;
		}
		break;
	case KVC__OP__OP_HANDOVER:
		r = -EOPNOTSUPP;
		if (s->uid != 0 && s->uid != geteuid()) {
			r = -EPERM;
			snprintf(rep.msg, sizeof(rep.msg), "only uid %u or root may take this daemon over",
				 (unsigned) geteuid());
		} else if (sv->handover) {
			r = sv->handover(sv->handover_data, s->fd, h->seq, rep.msg, sizeof(rep.msg));
			if (r == 0) { /* answered by the hook, once the daemon stopped */
				kvc__request__free_unpacked(q, NULL);
				return;
			}
		}
		break;
	case KVC__OP__OP_FLUSH:
		r = store_flush_below(sv->st);
		if (r == -EOPNOTSUPP)
			snprintf(rep.msg, sizeof(rep.msg), "this daemon has no disk tier (--disk-dir)");
		break;
	case KVC__OP__OP_REMOVE_PREFIX:
		r = admin_remove_prefix(s, q->remove, &rep);
		break;
	case KVC__OP__OP_PIN:
		r = store_pin(sv->st, q->pin->key.data, q->pin->key.len, q->pin->hard,
			      q->pin->ttl_ms * USEC_PER_MSEC, rep.msg);
		break;
	case KVC__OP__OP_UNPIN:
		r = store_unpin(sv->st, q->key->key.data, q->key->key.len, rep.msg);
		break;
	case KVC__OP__OP_BUFFER_FREE: {
		uint32_t i;

		r = -ESTALE;
		if (holder_get(&s->h, q->handle->handle, SLOT_BUFFER, &i)) {
			holder_release(&s->h, i);
			r = 0;
		}
		break;
	}
	default:
		r = -EOPNOTSUPP; /* wire_request_decode() let through an op we forgot */
		break;
	}
	send_reply(s, h->seq, q->op, r, &rep);
	kvc__request__free_unpacked(q, NULL);
}

/* A buffer the mapper made (r 0) or could not: answer, then go on with
 * what the client sent meanwhile. */
static void session_buffer_made(struct session *s, uint32_t seq, int r, uint64_t handle,
				int fd, uint64_t size)
{
	struct reply rep = { .resp = KVC__RESPONSE__INIT, .extent = KVC__EXTENT__INIT,
			     .exists = KVC__EXISTS_RESP__INIT };

	s->parked.active = false;
	if (r == 0) {
		rep.fds[0] = fd;
		rep.n_fds = 1;
		rep.extent.handle = handle;
		rep.extent.len = (size + 4095) & ~UINT64_C(4095);
		rep.resp.body_case = KVC__RESPONSE__BODY_EXTENT;
		rep.resp.extent = &rep.extent;
	} else
		snprintf(rep.msg, sizeof(rep.msg), "mapping a registered buffer of %llu bytes: %s",
			 (unsigned long long) size, strerror(-r));
	send_reply(s, seq, KVC__OP__OP_BUFFER_ALLOC, r, &rep);
	if (!s->closing) {
		update_events(s);
		process(s);
	}
	if (s->closing)
		session_free(s);
}

/* The object a parked acquire waited for is in dram (res 0), or is not
 * coming: answer it, then go on with what the client sent meanwhile. */
static void parked_done(struct waiter *w, int res)
{
	struct session *s = (struct session *) ((char *) w - offsetof(struct session, parked.w));
	struct reply rep = { .resp = KVC__RESPONSE__INIT, .extent = KVC__EXTENT__INIT,
			     .exists = KVC__EXISTS_RESP__INIT };
	ProtobufCBinaryData key = { .len = s->parked.key_len, .data = s->parked.key };
	int r = res;

	s->parked.active = false;
	if (s->parked.op == KVC__OP__OP_WHERE) {
		/* the directory answered (or did not in time): reply now */
		r = op_where(s, s->parked.seq, &key, &rep, true);
		send_reply(s, s->parked.seq, KVC__OP__OP_WHERE, r, &rep);
	} else if (s->parked.op == KVC__OP__OP_CLUSTER) {
		r = op_cluster(s, s->parked.seq, &rep, true);
		send_reply(s, s->parked.seq, KVC__OP__OP_CLUSTER, r, &rep);
	} else {
		if (res == 0) {
			r = op_acquire(s, s->parked.seq, &key, &rep);
			if (r == -EINPROGRESS)
				return; /* evicted again before it ran: waits again */
		} else if (res == -EBADMSG)
			snprintf(rep.msg, sizeof(rep.msg),
				 "the object's bytes failed their checksum; they were dropped");
		else if (fetch_error_msg(res))
			snprintf(rep.msg, sizeof(rep.msg), "%s", fetch_error_msg(res));
		send_reply(s, s->parked.seq, KVC__OP__OP_ACQUIRE, r, &rep);
	}
	if (!s->closing) {
		update_events(s);
		process(s);
	}
	if (s->closing)
		session_free(s);
}

static void handle_hello(struct session *s, const struct wire_hdr *h, const uint8_t *payload)
{
	struct server *sv = s->sv;
	Kvc__Welcome w = KVC__WELCOME__INIT;
	Kvc__SegmentInfo si[DAEMON_MAX_TIERS], *sp[DAEMON_MAX_TIERS];
	int fds[DAEMON_MAX_TIERS];
	struct store_info info;
	Kvc__Hello *hello;
	char msg[160];

	hello = kvc__hello__unpack(NULL, h->len, payload);
	if (!hello) {
		fatal(s, h->seq, EPROTO, "Hello does not decode");
		return;
	}
	if (hello->client_name && *hello->client_name)
		snprintf(s->name, sizeof(s->name), "%s", hello->client_name);
	w.major = KVC_PROTO_MAJOR;
	w.minor = KVC_PROTO_MINOR;
	w.version = (char *) KVC_VERSION;
	if (!s->refused && sv->n_sessions > sv->cfg->max_clients) {
		w.error = EUSERS;
		snprintf(msg, sizeof(msg), "kvcached serves at most %u clients at once (--max-clients)",
			 sv->cfg->max_clients);
		w.error_msg = msg;
		sv->stats.refused_clients++;
	} else if (s->refused) {
		w.error = EACCES;
		snprintf(msg, sizeof(msg), "uid %u gid %u may not use this daemon", (unsigned) s->uid,
			 (unsigned) s->gid);
		w.error_msg = msg;
	} else if (hello->major != KVC_PROTO_MAJOR) {
		w.error = EPROTONOSUPPORT;
		snprintf(msg, sizeof(msg), "daemon speaks protocol %u.%u, client %u.%u",
			 KVC_PROTO_MAJOR, KVC_PROTO_MINOR, hello->major, hello->minor);
		w.error_msg = msg;
	}
	kvc__hello__free_unpacked(hello, NULL);
	if (w.error) {
		log_notice("client[pid=%d,%s]: refused: %s", (int) s->pid, s->name, w.error_msg);
		send_frame(s, WIRE_WELCOME, h->seq, &w.base, NULL, 0);
		s->closing = true;
		return;
	}
	store_info(sv->st, &info);
	for (unsigned i = 0; i < store_segments(sv->st); i++) {
		struct store_segment g;

		store_segment(sv->st, i, &g);
		kvc__segment_info__init(&si[i]);
		si[i].index = g.index;
		si[i].fd_index = i;
		si[i].size = g.size;
		si[i].tier = g.kind;
		si[i].hugepages = g.hugepages;
		si[i].generation = info.generation;
		si[i].layout_version = SHM_LAYOUT_VERSION;
		si[i].data_offset = SHM_HEADER_SIZE; /* never re-read from the segment */
		sp[i] = &si[i];
		fds[i] = g.fd;
	}
	w.n_segments = store_segments(sv->st);
	w.segments = sp;
	w.client_id = s->id;
	w.max_value_size = UINT64_C(1) << 30;
	s->welcomed = true;
	log_info("client[pid=%d,%s]: connected (id %llu)", (int) s->pid, s->name,
		 (unsigned long long) s->id);
	if (send_frame(s, WIRE_WELCOME, h->seq, &w.base, fds, store_segments(sv->st)) < 0)
		s->closing = true;
}

static void handle_frame(struct session *s, const struct wire_hdr *h, const uint8_t *payload)
{
	if (h->n_fds) {
		fatal(s, h->seq, EPROTO, "file descriptors are not accepted from clients");
		return;
	}
	if (!s->welcomed) {
		if (h->type != WIRE_HELLO)
			fatal(s, h->seq, EPROTO, "the first frame must be Hello");
		else
			handle_hello(s, h, payload);
		return;
	}
	switch (h->type) {
	case WIRE_REQUEST:
		handle_request(s, h, payload);
		break;
	case WIRE_HELLO:
		s->sv->stats.protocol_errors++;
		send_error(s, h->seq, EPROTO, "Hello was already received");
		break;
	default:
		s->sv->stats.protocol_errors++;
		send_error(s, h->seq, EPROTO, "unknown message type %u", h->type);
		break;
	}
}

/* Handle every complete frame in the input buffer. */
static void process(struct session *s)
{
	size_t off = 0;

	while (!s->closing && !s->parked.active && s->out_off == s->out_len &&
	       s->in_len - off >= WIRE_HDR_SIZE) {
		struct wire_hdr h;
		int r;

		memcpy(&h, s->in + off, sizeof(h));
		r = wire_hdr_check(&h, WIRE_MAX_PAYLOAD);
		if (r == -EMSGSIZE) {
			char why[96];

			snprintf(why, sizeof(why), "frame of %u bytes exceeds the %u-byte limit", h.len,
				 WIRE_MAX_PAYLOAD);
			fatal(s, h.seq, EMSGSIZE, why);
			break;
		}
		if (r < 0) {
			fatal(s, h.seq, EPROTO, "malformed frame header");
			break;
		}
		if (s->in_len - off - WIRE_HDR_SIZE < h.len) {
			/* make room for the whole frame */
			size_t need = WIRE_HDR_SIZE + h.len;

			if (off) {
				memmove(s->in, s->in + off, s->in_len - off);
				s->in_len -= off;
				off = 0;
			}
			if (need > s->in_cap) {
				uint8_t *n = realloc(s->in, need);

				if (!n) {
					s->closing = true;
					break;
				}
				s->in = n;
				s->in_cap = need;
			}
			break;
		}
		handle_frame(s, &h, s->in + off + WIRE_HDR_SIZE);
		off += WIRE_HDR_SIZE + h.len;
	}
	if (off) {
		memmove(s->in, s->in + off, s->in_len - off);
		s->in_len -= off;
	}
}

static void on_readable(struct session *s)
{
	for (;;) {
		int fds[WIRE_MAX_FDS];
		size_t n_fds = 0;
		ssize_t n;

		if (s->in_len == s->in_cap) {
			/* A full buffer with no complete frame cannot happen:
			 * process() grows it to the frame's size. */
			process(s);
			if (s->in_len == s->in_cap)
				return;
		}
		n = wire_recv_some(s->fd, s->in + s->in_len, s->in_cap - s->in_len, fds,
				   WIRE_MAX_FDS, &n_fds, MSG_DONTWAIT);
		if (n == -EAGAIN)
			return;
		if (n == -EPROTO) {
			fatal(s, 0, EPROTO, "control message truncated (MSG_CTRUNC)");
			return;
		}
		if (n <= 0) {
			s->closing = true;
			return;
		}
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		s->in_len += (size_t) n;
		if (n_fds) {
			fatal(s, 0, EPROTO, "file descriptors are not accepted from clients");
			return;
		}
		process(s);
		if (s->closing || s->out_off < s->out_len)
			return;
	}
}

static void session_io(struct loop_source *src, int fd, uint32_t events, void *userdata)
{
	session_event(userdata, events);
}

void session_event(struct session *s, uint32_t events)
{
	if (events & EPOLLOUT) {
		if (flush(s) < 0)
			s->closing = true;
		else if (s->out_off == s->out_len && !s->closing) {
			/* answers drained: handle what queued up meanwhile */
			process(s);
		}
	}
	if (!s->closing && (events & EPOLLIN))
		on_readable(s);
	if (!s->closing && (events & (EPOLLHUP | EPOLLERR)) && !(events & EPOLLIN))
		s->closing = true;
	if (s->closing)
		session_free(s);
}

/* A registered buffer slot given back: the buffer goes with it. */
static void release_buffer(struct holder *h, void *buf)
{
	struct session *s = (struct session *) ((char *) h - offsetof(struct session, h));

	buffer_free(s, buf);
}

static const struct holder_ops session_holder_ops = {
	.release_buffer = release_buffer,
};

int session_new(struct server *sv, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct session *s;
	int r;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	s = calloc(1, sizeof(*s));
	if (!s || !(s->in = malloc(IN_INITIAL))) {
		free(s);
		close(fd);
		return -ENOMEM;
	}
	s->in_cap = IN_INITIAL;
	s->sv = sv;
	holder_init(&s->h, sv->st, &session_holder_ops);
	s->fd = fd;
	s->pid = cred.pid;
	s->uid = cred.uid;
	s->gid = cred.gid;
	s->id = ++sv->next_session_id;
	strcpy(s->name, "?");
	/* The socket is 0660 already; this also covers a socket whose mode an
	 * operator loosened by hand. */
	s->refused = !(cred.uid == 0 || cred.uid == geteuid() || cred.gid == getegid());
	s->events = EPOLLIN;
	r = loop_add_io(sv->loop, fd, EPOLLIN, session_io, s, &s->src);
	if (r < 0) {
		free(s->in);
		free(s);
		close(fd);
		return r;
	}
	s->next = sv->sessions;
	if (s->next)
		s->next->prev = s;
	sv->sessions = s;
	sv->n_sessions++;
	sv->stats.connections++;
	return 0;
}

void session_free(struct session *s)
{
	struct server *sv;
	uint64_t res = 0, views = 0;

	if (!s)
		return;
	sv = s->sv;
	if (s->parked.active && s->parked.op == KVC__OP__OP_BUFFER_ALLOC)
		buffer_forget(s);
	else if (s->parked.active)
		fetch_unwait(&s->parked.w);
	copier_forget(s);
	for (unsigned i = 0; i < s->n_channels; i++)
		channel_close(s->channels[i]);
	holder_done(&s->h, &res, &views);
	store_stats(sv->st)->reclaimed_reservations += res;
	store_stats(sv->st)->reclaimed_views += views;
	if (s->welcomed || res || views)
		log_info("client[pid=%d,%s]: disconnected; released %llu reservation(s), %llu view(s)",
			 (int) s->pid, s->name, (unsigned long long) res, (unsigned long long) views);
	if (s->prev)
		s->prev->next = s->next;
	else
		sv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	sv->n_sessions--;
	loop_source_free(s->src); /* before the fd closes: it leaves the set */
	close(s->fd);
	free(s->in);
	free(s->out);
	free(s);
}
