/* SPDX-License-Identifier: MIT */
/* Frames: pack/parse round trip, header checks, request validation, and fd
 * passing with truncated control messages rejected. */
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers.h"
#include "wire.h"

static void test_frame_roundtrip(void)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq k = KVC__KEY_REQ__INIT;
	const uint8_t *payload;
	struct wire_hdr h;
	Kvc__Request *out;
	const char *why;
	uint8_t *buf;
	size_t len;

	k.key = (ProtobufCBinaryData) { 5, (uint8_t *) "hello" };
	q.op = KVC__OP__OP_ACQUIRE;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &k;
	CHECK_EQ(wire_frame_pack(WIRE_REQUEST, 77, 0, &q.base, &buf, &len), 0);
	CHECK_EQ(wire_frame_parse(buf, len, &h, &payload), 0);
	CHECK_EQ(h.type, WIRE_REQUEST);
	CHECK_EQ(h.seq, 77);
	CHECK_EQ(h.len, len - WIRE_HDR_SIZE);
	CHECK_EQ(wire_request_decode(payload, h.len, &out, &why), 0);
	CHECK_EQ(out->op, KVC__OP__OP_ACQUIRE);
	CHECK_EQ(out->key->key.len, 5);
	CHECK(memcmp(out->key->key.data, "hello", 5) == 0);
	kvc__request__free_unpacked(out, NULL);

	/* truncated, extended, bad magic, bad flags, too long */
	CHECK_EQ(wire_frame_parse(buf, len - 1, &h, &payload), -EPROTO);
	CHECK_EQ(wire_frame_parse(buf, 3, &h, &payload), -EPROTO);
	buf[0] ^= 0xff;
	CHECK_EQ(wire_frame_parse(buf, len, &h, &payload), -EPROTO);
	buf[0] ^= 0xff;
	buf[14] = 1;
	CHECK_EQ(wire_frame_parse(buf, len, &h, &payload), -EPROTO);
	buf[14] = 0;
	{
		struct wire_hdr big = { .magic = WIRE_MAGIC, .type = WIRE_REQUEST,
					.len = WIRE_MAX_PAYLOAD + 1 };

		CHECK_EQ(wire_hdr_check(&big, WIRE_MAX_PAYLOAD), -EMSGSIZE);
		big.len = WIRE_MAX_PAYLOAD;
		CHECK_EQ(wire_hdr_check(&big, WIRE_MAX_PAYLOAD), 0);
		big.n_fds = WIRE_MAX_FDS + 1;
		CHECK_EQ(wire_hdr_check(&big, WIRE_MAX_PAYLOAD), -EPROTO);
	}
	free(buf);
}

static int decode_req(Kvc__Request *q)
{
	size_t n = protobuf_c_message_get_packed_size(&q->base);
	uint8_t *buf = malloc(n + 1);
	Kvc__Request *out = NULL;
	const char *why = NULL;
	int r;

	protobuf_c_message_pack(&q->base, buf);
	r = wire_request_decode(buf, n, &out, &why);
	if (r == 0)
		kvc__request__free_unpacked(out, NULL);
	else
		CHECK(why && *why);
	free(buf);
	return r;
}

static void test_validation(void)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq k = KVC__KEY_REQ__INIT;
	Kvc__ReserveReq rq = KVC__RESERVE_REQ__INIT;
	Kvc__KeysReq ks = KVC__KEYS_REQ__INIT;
	uint8_t key[600];
	ProtobufCBinaryData many[3];
	const char *why;
	Kvc__Request *out;

	memset(key, 'k', sizeof(key));
	q.op = KVC__OP__OP_EXISTS;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &k;
	k.key = (ProtobufCBinaryData) { 511, key };
	CHECK_EQ(decode_req(&q), 0);
	k.key.len = 512;
	CHECK_EQ(decode_req(&q), -EINVAL);
	k.key.len = 0;
	CHECK_EQ(decode_req(&q), -EINVAL);
	k.key = (ProtobufCBinaryData) { 3, (uint8_t *) "a\0b" };
	CHECK_EQ(decode_req(&q), -EINVAL);

	/* body that does not match the op */
	k.key = (ProtobufCBinaryData) { 1, key };
	q.op = KVC__OP__OP_RESERVE;
	CHECK_EQ(decode_req(&q), -EINVAL);
	/* unknown op */
	q.op = 999;
	CHECK_EQ(decode_req(&q), -EOPNOTSUPP);

	q.op = KVC__OP__OP_RESERVE;
	q.body_case = KVC__REQUEST__BODY_RESERVE;
	q.reserve = &rq;
	rq.key = (ProtobufCBinaryData) { 4, key };
	rq.len = 0;
	CHECK_EQ(decode_req(&q), -EINVAL);
	rq.len = 10;
	CHECK_EQ(decode_req(&q), 0);

	q.op = KVC__OP__OP_PREFIX_LOOKUP;
	q.body_case = KVC__REQUEST__BODY_KEYS;
	q.keys = &ks;
	many[0] = many[1] = (ProtobufCBinaryData) { 8, key };
	many[2] = (ProtobufCBinaryData) { 0, key };
	ks.keys = many;
	ks.n_keys = 2;
	CHECK_EQ(decode_req(&q), 0);
	ks.n_keys = 3;
	CHECK_EQ(decode_req(&q), -EINVAL);

	/* garbage payload */
	CHECK_EQ(wire_request_decode((const uint8_t *) "\xff\xff\xff\xff\x0f", 5, &out, &why), -EPROTO);
}

static void test_fd_passing(void)
{
	int sv[2], fds[WIRE_MAX_FDS], devnull;
	uint8_t b[8];
	size_t n_fds = 0;
	ssize_t n;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(devnull >= 0);
	{
		int two[2] = { devnull, devnull };

		CHECK_EQ(wire_send_all(sv[0], "abcd", 4, two, 2), 0);
	}
	n = wire_recv_some(sv[1], b, sizeof(b), fds, WIRE_MAX_FDS, &n_fds, 0);
	CHECK_EQ(n, 4);
	CHECK_EQ(n_fds, 2);
	CHECK(fcntl(fds[0], F_GETFD) >= 0 && fcntl(fds[1], F_GETFD) >= 0);
	close(fds[0]);
	close(fds[1]);

	/* Room for only one fd: the kernel truncates the control message,
	 * which is rejected and whatever arrived is closed. */
	{
		int two[2] = { devnull, devnull };

		CHECK_EQ(wire_send_all(sv[0], "efgh", 4, two, 2), 0);
	}
	n = wire_recv_some(sv[1], b, sizeof(b), NULL, 0, &n_fds, 0);
	CHECK_EQ(n, -EPROTO);

	/* More fds than any frame may carry overflow the control buffer:
	 * MSG_CTRUNC, rejected, nothing leaks. */
	{
		int many[WIRE_MAX_FDS + 8];
		union {
			char buf[CMSG_SPACE(sizeof(many))];
			struct cmsghdr align;
		} control = { 0 };
		struct iovec iov = { (void *) "ijkl", 4 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
				     .msg_controllen = sizeof(control.buf) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		int probe;

		for (size_t i = 0; i < sizeof(many) / sizeof(many[0]); i++)
			many[i] = devnull;
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(many));
		memcpy(CMSG_DATA(cm), many, sizeof(many));
		CHECK_EQ(sendmsg(sv[0], &mh, 0), 4);
		n = wire_recv_some(sv[1], b, sizeof(b), fds, WIRE_MAX_FDS, &n_fds, 0);
		CHECK_EQ(n, -EPROTO);
		/* the fds that did arrive were closed: the next fd number is low */
		probe = dup(devnull);
		CHECK(probe < devnull + 4);
		close(probe);
	}
	close(devnull);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	test_frame_roundtrip();
	test_validation();
	test_fd_passing();
	return 0;
}
