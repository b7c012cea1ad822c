/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "peer-conn.h"

#define IN_MIN 4096

void pconn_init(struct pconn *c, int fd, size_t max_out)
{
	*c = (struct pconn) { .fd = fd, .max_out = max_out, .max_in = PEER_MAX_PAYLOAD };
}

void pconn_limit_in(struct pconn *c, size_t max)
{
	c->max_in = max < PEER_MAX_PAYLOAD ? max : PEER_MAX_PAYLOAD;
}

void pconn_done(struct pconn *c)
{
	free(c->in);
	free(c->out);
	if (c->fd >= 0)
		close(c->fd);
	*c = (struct pconn) { .fd = -1 };
}

int pconn_read(struct pconn *c)
{
	if (c->in_off) {
		memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
		c->in_len -= c->in_off;
		c->in_off = 0;
	}
	for (;;) {
		ssize_t n;

		if (c->in_len == c->in_cap) {
			size_t cap = c->in_cap ? c->in_cap * 2 : IN_MIN;
			uint8_t *p;

			/* a header names at most PEER_MAX_PAYLOAD: the buffer
			 * never needs more than one whole frame plus a read */
			if (cap > 2 * (PEER_HDR_SIZE + c->max_in))
				return 0;
			p = realloc(c->in, cap);
			if (!p)
				return -ENOMEM;
			c->in = p;
			c->in_cap = cap;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (n > 0) {
			c->in_len += (size_t) n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return -errno;
	}
}

int pconn_next(struct pconn *c, struct peer_hdr *ret_hdr, const uint8_t **ret_payload)
{
	size_t avail = c->in_len - c->in_off;
	struct peer_hdr h;
	int r;

	if (avail < PEER_HDR_SIZE)
		return 0;
	r = peer_hdr_decode(c->in + c->in_off, c->max_in, &h);
	if (r == -EPROTONOSUPPORT)
		c->their_major = h.version;
	if (r < 0)
		return r;
	if (avail - PEER_HDR_SIZE < h.len)
		return 0;
	*ret_hdr = h;
	*ret_payload = c->in + c->in_off + PEER_HDR_SIZE;
	c->in_off += PEER_HDR_SIZE + h.len;
	return 1;
}

int pconn_send(struct pconn *c, uint8_t type, uint32_t seq, const ProtobufCMessage *msg)
{
	int r = pconn_queue(c, type, seq, msg);

	return r < 0 ? r : pconn_flush(c);
}

int pconn_queue(struct pconn *c, uint8_t type, uint32_t seq, const ProtobufCMessage *msg)
{
	size_t plen = protobuf_c_message_get_packed_size(msg), need;
	struct peer_hdr h = { .version = peer_major, .type = type, .seq = seq };

	if (plen > PEER_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (c->out_len - c->out_off + PEER_HDR_SIZE + plen > c->max_out)
		return -ENOBUFS;
	if (c->out_off) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
	}
	need = c->out_len + PEER_HDR_SIZE + plen;
	if (need > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : IN_MIN;
		uint8_t *p;

		while (cap < need)
			cap *= 2;
		p = realloc(c->out, cap);
		if (!p)
			return -ENOMEM;
		c->out = p;
		c->out_cap = cap;
	}
	h.len = (uint32_t) plen;
	peer_hdr_encode(&h, c->out + c->out_len);
	protobuf_c_message_pack(msg, c->out + c->out_len + PEER_HDR_SIZE);
	c->out_len = need;
	return 0;
}

int pconn_flush(struct pconn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			c->out_off += (size_t) n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		return n < 0 ? -errno : -EPIPE;
	}
	c->out_len = c->out_off = 0;
	return 0;
}

bool pconn_wants_write(const struct pconn *c)
{
	return c->out_off < c->out_len;
}

void hs_source_of(int fd, struct hs_source *ret)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	memset(ret, 0, sizeof(*ret));
	if (getpeername(fd, (struct sockaddr *) &ss, &len) < 0)
		return;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *) &ss;

		ret->a[10] = ret->a[11] = 0xff;
		memcpy(&ret->a[12], &in->sin_addr, 4);
	} else if (ss.ss_family == AF_INET6) {
		memcpy(ret->a, &((const struct sockaddr_in6 *) &ss)->sin6_addr, 16);
	}
}

bool hs_source_eq(const struct hs_source *x, const struct hs_source *y)
{
	return memcmp(x->a, y->a, sizeof(x->a)) == 0;
}

void pconn_refuse_version(struct pconn *c)
{
	Kvc__Peer__HelloAck ack = KVC__PEER__HELLO_ACK__INIT;
	char msg[96];

	snprintf(msg, sizeof(msg), "this side speaks peer protocol %u, yours %u: not compatible",
		 peer_major, c->their_major);
	ack.error = -EPROTONOSUPPORT;
	ack.error_msg = msg;
	if (pconn_send(c, PEER_HELLO_ACK, 0, &ack.base) == 0)
		pconn_flush(c);
}
