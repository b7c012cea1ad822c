/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

int wire_hdr_check(const struct wire_hdr *h, size_t max_payload)
{
	if (h->magic != WIRE_MAGIC || h->flags != 0 || h->n_fds > WIRE_MAX_FDS)
		return -EPROTO;
	if (h->len > max_payload)
		return -EMSGSIZE;
	return 0;
}

int wire_frame_pack(uint16_t type, uint32_t seq, uint16_t n_fds,
		    const ProtobufCMessage *msg, uint8_t **ret_buf, size_t *ret_len)
{
	size_t plen = protobuf_c_message_get_packed_size(msg);
	struct wire_hdr h;
	uint8_t *buf;

	if (plen > WIRE_MAX_PAYLOAD)
		return -EMSGSIZE;
	buf = malloc(WIRE_HDR_SIZE + plen);
	if (!buf)
		return -ENOMEM;
	h = (struct wire_hdr) {
		.magic = WIRE_MAGIC,
		.type = type,
		.len = (uint32_t) plen,
		.seq = seq,
		.n_fds = n_fds,
	};
	memcpy(buf, &h, sizeof(h));
	protobuf_c_message_pack(msg, buf + WIRE_HDR_SIZE);
	*ret_buf = buf;
	*ret_len = WIRE_HDR_SIZE + plen;
	return 0;
}

int wire_frame_parse(const uint8_t *buf, size_t len, struct wire_hdr *ret_hdr,
		     const uint8_t **ret_payload)
{
	struct wire_hdr h;
	int r;

	if (len < WIRE_HDR_SIZE)
		return -EPROTO;
	memcpy(&h, buf, sizeof(h));
	r = wire_hdr_check(&h, WIRE_MAX_PAYLOAD);
	if (r < 0)
		return r;
	if (len - WIRE_HDR_SIZE != h.len)
		return -EPROTO;
	*ret_hdr = h;
	*ret_payload = buf + WIRE_HDR_SIZE;
	return 0;
}

int wire_key_check(const ProtobufCBinaryData *key)
{
	if (key->len == 0 || key->len > WIRE_MAX_KEY)
		return -EINVAL;
	if (memchr(key->data, '\0', key->len))
		return -EINVAL;
	return 0;
}

static int check_keys(const Kvc__KeysReq *k, const char **why)
{
	if (!k) {
		*why = "request has no keys";
		return -EINVAL;
	}
	if (k->n_keys > WIRE_MAX_BATCH) {
		*why = "too many keys in one request";
		return -EINVAL;
	}
	for (size_t i = 0; i < k->n_keys; i++)
		if (wire_key_check(&k->keys[i]) < 0) {
			*why = "key must be 1..511 bytes without NUL";
			return -EINVAL;
		}
	return 0;
}

static int check_key(const Kvc__KeyReq *k, const char **why)
{
	if (!k || wire_key_check(&k->key) < 0) {
		*why = "key must be 1..511 bytes without NUL";
		return -EINVAL;
	}
	return 0;
}

static int validate(const Kvc__Request *q, const char **why)
{
	switch (q->op) {
	case KVC__OP__OP_RESERVE:
		if (q->body_case != KVC__REQUEST__BODY_RESERVE)
			break;
		if (wire_key_check(&q->reserve->key) < 0) {
			*why = "key must be 1..511 bytes without NUL";
			return -EINVAL;
		}
		if (q->reserve->len == 0) {
			*why = "value length must be at least 1 byte";
			return -EINVAL;
		}
		if (q->reserve->opts && q->reserve->opts->parent_key.len > 0 &&
		    wire_key_check(&q->reserve->opts->parent_key) < 0) {
			*why = "parent key must be 1..511 bytes without NUL";
			return -EINVAL;
		}
		return 0;
	case KVC__OP__OP_COMMIT:
	case KVC__OP__OP_ABORT:
	case KVC__OP__OP_RELEASE:
		if (q->body_case != KVC__REQUEST__BODY_HANDLE)
			break;
		return 0;
	case KVC__OP__OP_PIN:
		if (q->body_case != KVC__REQUEST__BODY_PIN)
			break;
		if (wire_key_check(&q->pin->key) < 0) {
			*why = "key must be 1..511 bytes without NUL";
			return -EINVAL;
		}
		return 0;
	case KVC__OP__OP_ACQUIRE:
	case KVC__OP__OP_EXISTS:
	case KVC__OP__OP_REMOVE:
	case KVC__OP__OP_UNPIN:
	case KVC__OP__OP_WHERE:
		if (q->body_case != KVC__REQUEST__BODY_KEY)
			break;
		return check_key(q->key, why);
	case KVC__OP__OP_BATCH_EXISTS:
	case KVC__OP__OP_PREFIX_LOOKUP:
	case KVC__OP__OP_PREFETCH:
	case KVC__OP__OP_ANNOUNCE:
		if (q->body_case != KVC__REQUEST__BODY_KEYS)
			break;
		return check_keys(q->keys, why);
	case KVC__OP__OP_BUFFER_FREE:
		if (q->body_case != KVC__REQUEST__BODY_HANDLE)
			break;
		return 0;
	case KVC__OP__OP_BUFFER_ALLOC:
		if (q->body_case != KVC__REQUEST__BODY_BUFFER)
			break;
		if (q->buffer->size == 0) {
			*why = "buffer size must be at least 1 byte";
			return -EINVAL;
		}
		return 0;
	case KVC__OP__OP_PUSH:
		if (q->body_case != KVC__REQUEST__BODY_PUSH)
			break;
		if (wire_key_check(&q->push->key) < 0 || !q->push->node || !q->push->node[0] ||
		    strlen(q->push->node) > 255) {
			*why = "push needs a key of 1..511 bytes and a node id";
			return -EINVAL;
		}
		return 0;
	case KVC__OP__OP_CHANNEL_OPEN:
	case KVC__OP__OP_HANDOVER:
	case KVC__OP__OP_FLUSH:
	case KVC__OP__OP_STATUS:
	case KVC__OP__OP_STATS:
	case KVC__OP__OP_CLUSTER:
		if (q->body_case != KVC__REQUEST__BODY__NOT_SET)
			break;
		return 0;
	case KVC__OP__OP_LIST:
		if (q->body_case != KVC__REQUEST__BODY_LIST)
			break;
		if (q->list->prefix.len > WIRE_MAX_KEY) {
			*why = "prefix longer than 511 bytes";
			return -EINVAL;
		}
		return 0;
	case KVC__OP__OP_EVICT:
		if (q->body_case != KVC__REQUEST__BODY_EVICT)
			break;
		return 0;
	case KVC__OP__OP_REMOVE_PREFIX:
		if (q->body_case != KVC__REQUEST__BODY_REMOVE)
			break;
		if (q->remove->prefix.len > WIRE_MAX_KEY) {
			*why = "prefix longer than 511 bytes";
			return -EINVAL;
		}
		if (q->remove->flags & ~(uint32_t) WIRE_REMOVE_KNOWN) {
			*why = "unknown remove flags";
			return -EINVAL;
		}
		return 0;
	default:
		*why = "unknown operation";
		return -EOPNOTSUPP;
	}
	*why = "request body does not match its operation";
	return -EINVAL;
}

int wire_request_decode(const uint8_t *payload, size_t len, Kvc__Request **ret,
			const char **ret_why)
{
	Kvc__Request *q;
	int r;

	q = kvc__request__unpack(NULL, len, payload);
	if (!q) {
		*ret_why = "request payload does not decode";
		return -EPROTO;
	}
	r = validate(q, ret_why);
	if (r < 0) {
		kvc__request__free_unpacked(q, NULL);
		return r;
	}
	*ret = q;
	return 0;
}

int wire_send_all(int fd, const void *buf, size_t len, const int *fds, size_t n_fds)
{
	const uint8_t *p = buf;
	union {
		char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
		struct cmsghdr align;
	} control;

	if (n_fds > WIRE_MAX_FDS)
		return -EINVAL;
	while (len > 0) {
		struct iovec iov = { .iov_base = (void *) p, .iov_len = len };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (n_fds > 0) {
			struct cmsghdr *cm;

			memset(&control, 0, sizeof(control));
			mh.msg_control = control.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t) n;
		n_fds = 0; /* the fds rode with the first byte */
	}
	return 0;
}

ssize_t wire_recv_some(int fd, void *buf, size_t len, int *fds, size_t max_fds,
		       size_t *ret_n_fds, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	size_t n_fds = 0;
	bool bad = false;
	ssize_t n;

	do
		n = recvmsg(fd, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t k;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int f;

			memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (n_fds < max_fds && fds)
				fds[n_fds++] = f;
			else {
				close(f);
				bad = true;
			}
		}
	}
	if (bad || (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
		for (size_t i = 0; i < n_fds; i++)
			close(fds[i]);
		return -EPROTO;
	}
	if (ret_n_fds)
		*ret_n_fds = n_fds;
	return n;
}

int wire_recv_exact(int fd, void *buf, size_t len, int *fds, size_t max_fds, size_t *n_fds)
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
