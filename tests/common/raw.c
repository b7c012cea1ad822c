/* SPDX-License-Identifier: MIT */
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "helpers.h"
#include "raw.h"
#include "shmem.h"

int raw_connect(const char *socket_path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = 10 };

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	CHECK(connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

void raw_send(int fd, uint16_t type, uint32_t len, const void *payload, size_t plen)
{
	struct wire_hdr h = { .magic = WIRE_MAGIC, .type = type, .len = len, .seq = 9 };

	CHECK_EQ(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	if (plen)
		CHECK_EQ(send(fd, payload, plen, MSG_NOSIGNAL), (ssize_t) plen);
}

void raw_send_msg(int fd, uint16_t type, const ProtobufCMessage *m)
{
	uint8_t *buf;
	size_t len;

	CHECK_EQ(wire_frame_pack(type, 9, 0, m, &buf, &len), 0);
	CHECK_EQ(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t) len);
	free(buf);
}

int raw_recv_fds(int fd, uint8_t **ret_payload, uint32_t *ret_len, int *out_fds, size_t max_fds,
		 size_t *ret_n_fds)
{
	struct wire_hdr h;
	int fds[WIRE_MAX_FDS];
	size_t got = 0, kept = 0;
	uint8_t *p;

	while (got < sizeof(h)) {
		size_t k = 0;
		ssize_t n = wire_recv_some(fd, (uint8_t *) &h + got, sizeof(h) - got, fds, WIRE_MAX_FDS,
					   &k, 0);
		CHECK(n >= 0);
		if (n == 0)
			return 0;
		for (size_t i = 0; i < k; i++) {
			if (kept < max_fds)
				out_fds[kept++] = fds[i];
			else
				close(fds[i]);
		}
		got += (size_t) n;
	}
	CHECK_EQ(wire_hdr_check(&h, WIRE_MAX_PAYLOAD), 0);
	p = malloc(h.len + 1);
	for (got = 0; got < h.len;) {
		ssize_t n = recv(fd, p + got, h.len - got, 0);

		CHECK(n > 0);
		got += (size_t) n;
	}
	*ret_payload = p;
	*ret_len = h.len;
	if (ret_n_fds)
		*ret_n_fds = kept;
	return h.type;
}

int raw_recv(int fd, uint8_t **ret_payload, uint32_t *ret_len)
{
	return raw_recv_fds(fd, ret_payload, ret_len, NULL, 0, NULL);
}

int raw_hello(int fd, uint32_t major)
{
	Kvc__Hello hello = KVC__HELLO__INIT;
	Kvc__Welcome *w;
	uint8_t *p;
	uint32_t len;
	int err;

	hello.major = major;
	raw_send_msg(fd, WIRE_HELLO, &hello.base);
	CHECK_EQ(raw_recv(fd, &p, &len), WIRE_WELCOME);
	w = kvc__welcome__unpack(NULL, len, p);
	CHECK(w);
	err = w->error;
	if (err)
		printf("welcome refused: %s\n", w->error_msg);
	kvc__welcome__free_unpacked(w, NULL);
	free(p);
	return err;
}

void raw_chan_open(struct raw_chan *rc, const char *socket_path)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Response *resp;
	int fds[2];
	size_t n_fds;
	uint8_t *p;
	uint32_t len;
	void *base;

	rc->sock = raw_connect(socket_path);
	CHECK_EQ(raw_hello(rc->sock, KVC_PROTO_MAJOR), 0);
	q.op = KVC__OP__OP_CHANNEL_OPEN;
	raw_send_msg(rc->sock, WIRE_REQUEST, &q.base);
	CHECK_EQ(raw_recv_fds(rc->sock, &p, &len, fds, 2, &n_fds), WIRE_RESPONSE);
	CHECK_EQ(n_fds, 2);
	resp = kvc__response__unpack(NULL, len, p);
	CHECK(resp && resp->error == 0);
	kvc__response__free_unpacked(resp, NULL);
	free(p);
	CHECK_EQ(shm_memfd_map(fds[0], SHM_CHAN_SIZE, &base), 0);
	close(fds[0]);
	rc->base = base;
	rc->efd = fds[1];
	rc->arena = rc->base + SHM_CHAN_ARENA_OFF;
	ring_side_init(&rc->sq, (struct shm_ring *) (rc->base + SHM_CHAN_SQ_OFF),
		       rc->base + SHM_CHAN_SQES_OFF, sizeof(struct shm_sqe), SHM_CHAN_ENTRIES, 0);
	ring_side_init(&rc->cq, (struct shm_ring *) (rc->base + SHM_CHAN_CQ_OFF),
		       rc->base + SHM_CHAN_CQES_OFF, sizeof(struct shm_cqe), SHM_CHAN_ENTRIES, 0);
}

int64_t raw_chan_call(struct raw_chan *rc, const struct shm_sqe *e)
{
	struct shm_cqe c;
	uint64_t one = 1;

	memcpy(ring_entry(&rc->sq, rc->sq.pos), e, sizeof(*e));
	ring_publish(&rc->sq, 1);
	CHECK(write(rc->efd, &one, sizeof(one)) == sizeof(one));
	for (int i = 0; ring_ready(&rc->cq) == 0; i++) {
		CHECK(i < 5000000);
		if (i > 1000)
			usleep(10);
	}
	memcpy(&c, ring_entry(&rc->cq, rc->cq.pos), sizeof(c));
	ring_consume(&rc->cq, 1);
	CHECK_EQ(c.user_data, e->user_data);
	return c.res;
}
