/* SPDX-License-Identifier: MIT */
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "helpers.h"
#include "raw.h"

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
