/* SPDX-License-Identifier: MIT */
/* Faults: clients that die holding reservations and views, and clients that
 * send malformed, truncated, oversized or unknown frames.  Each gets a clear
 * error; the daemon keeps serving everyone else and loses nothing. */
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"
#include "raw.h"

static struct test_daemon td;

static int raw_connect_td(void)
{
	return raw_connect(td.socket);
}

/* Expect a Response carrying error `err`; returns its message (static). */
static const char *expect_error(int fd, int err)
{
	static char msg[256];
	Kvc__Response *r;
	uint8_t *p;
	uint32_t len;

	CHECK_EQ(raw_recv(fd, &p, &len), WIRE_RESPONSE);
	r = kvc__response__unpack(NULL, len, p);
	CHECK(r);
	CHECK_EQ(r->error, err);
	snprintf(msg, sizeof(msg), "%s", r->error_msg);
	printf("error %d: %s\n", err, msg);
	kvc__response__free_unpacked(r, NULL);
	free(p);
	return msg;
}

static void expect_eof(int fd)
{
	uint8_t *p;
	uint32_t len;

	CHECK_EQ(raw_recv(fd, &p, &len), 0);
}

/* A well-formed EXISTS must still work on this connection. */
static void expect_alive(int fd)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq k = KVC__KEY_REQ__INIT;
	Kvc__Response *r;
	uint8_t *p;
	uint32_t len;

	k.key = (ProtobufCBinaryData) { 6, (uint8_t *) "keeper" };
	q.op = KVC__OP__OP_EXISTS;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &k;
	raw_send_msg(fd, WIRE_REQUEST, &q.base);
	CHECK_EQ(raw_recv(fd, &p, &len), WIRE_RESPONSE);
	r = kvc__response__unpack(NULL, len, p);
	CHECK(r && r->error == 0 && r->exists->count == 1);
	kvc__response__free_unpacked(r, NULL);
	free(p);
}

static void send_key_req(int fd, uint32_t op, const void *key, size_t klen)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq k = KVC__KEY_REQ__INIT;

	k.key = (ProtobufCBinaryData) { klen, (uint8_t *) key };
	q.op = op;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &k;
	raw_send_msg(fd, WIRE_REQUEST, &q.base);
}

/* The committed object every test checks is still intact. */
static uint8_t keeper[300000];

static void check_keeper(struct kvc_client *c)
{
	struct kvc_view v;

	CHECK_EQ(kvc_acquire(c, "keeper", &v), 0);
	CHECK_EQ(v.len, sizeof(keeper));
	CHECK(test_verify(v.data, v.len, 4242));
	CHECK_EQ(kvc_release(c, &v), 0);
}

static void test_malformed(struct kvc_client *good)
{
	char key[600];
	int fd;

	memset(key, 'k', sizeof(key));

	/* unknown message type: error, connection stays usable */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	raw_send(fd, 77, 3, "abc", 3);
	CHECK(strstr(expect_error(fd, EPROTO), "unknown message type 77"));
	expect_alive(fd);
	/* undecodable request payload */
	raw_send(fd, WIRE_REQUEST, 5, "\xff\xff\xff\xff\x0f", 5);
	expect_error(fd, EPROTO);
	expect_alive(fd);
	/* keys of 0 and 512 bytes, key with a NUL inside */
	send_key_req(fd, KVC__OP__OP_EXISTS, key, 0);
	CHECK(strstr(expect_error(fd, EINVAL), "key"));
	send_key_req(fd, KVC__OP__OP_ACQUIRE, key, 512);
	expect_error(fd, EINVAL);
	send_key_req(fd, KVC__OP__OP_REMOVE, "a\0b", 3);
	expect_error(fd, EINVAL);
	/* unknown op */
	send_key_req(fd, 4000, "keeper", 6);
	expect_error(fd, EOPNOTSUPP);
	/* handles this connection never got */
	{
		Kvc__Request q = KVC__REQUEST__INIT;
		Kvc__HandleReq h = KVC__HANDLE_REQ__INIT;

		h.handle = UINT64_MAX;
		q.op = KVC__OP__OP_COMMIT;
		q.body_case = KVC__REQUEST__BODY_HANDLE;
		q.handle = &h;
		raw_send_msg(fd, WIRE_REQUEST, &q.base);
		expect_error(fd, ESTALE);
		h.handle = 1;
		q.op = KVC__OP__OP_RELEASE;
		raw_send_msg(fd, WIRE_REQUEST, &q.base);
		expect_error(fd, ESTALE);
	}
	/* a second Hello */
	{
		Kvc__Hello hello = KVC__HELLO__INIT;

		hello.major = KVC_PROTO_MAJOR;
		raw_send_msg(fd, WIRE_HELLO, &hello.base);
		expect_error(fd, EPROTO);
	}
	expect_alive(fd);
	close(fd);

	/* oversized length: answered, then hung up */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	raw_send(fd, WIRE_REQUEST, 0xfffffff0u, NULL, 0);
	CHECK(strstr(expect_error(fd, EMSGSIZE), "exceeds"));
	expect_eof(fd);
	close(fd);

	/* bad magic */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	CHECK_EQ(send(fd, "GARBAGE-GARBAGE-GARBAGE", 23, MSG_NOSIGNAL), 23);
	expect_error(fd, EPROTO);
	expect_eof(fd);
	close(fd);

	/* request before Hello */
	fd = raw_connect_td();
	send_key_req(fd, KVC__OP__OP_EXISTS, "keeper", 6);
	CHECK(strstr(expect_error(fd, EPROTO), "Hello"));
	expect_eof(fd);
	close(fd);

	/* Hello from another protocol major */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR + 1), EPROTONOSUPPORT);
	expect_eof(fd);
	close(fd);

	/* garbage instead of a Hello payload */
	fd = raw_connect_td();
	raw_send(fd, WIRE_HELLO, 4, "\xff\xff\xff\xff", 4);
	expect_error(fd, EPROTO);
	expect_eof(fd);
	close(fd);

	/* a frame carrying file descriptors */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	{
		struct wire_hdr h = { .magic = WIRE_MAGIC, .type = WIRE_REQUEST, .n_fds = 1 };
		int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

		CHECK_EQ(wire_send_all(fd, &h, sizeof(h), &devnull, 1), 0);
		close(devnull);
	}
	expect_error(fd, EPROTO);
	expect_eof(fd);
	close(fd);

	/* truncated frame: the header promises 1000 bytes, 10 arrive, then
	 * the client hangs up */
	fd = raw_connect_td();
	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	raw_send(fd, WIRE_REQUEST, 1000, "0123456789", 10);
	close(fd);

	/* truncated header, then hang-up */
	fd = raw_connect_td();
	CHECK_EQ(send(fd, "KV", 2, MSG_NOSIGNAL), 2);
	close(fd);

	/* connect and vanish without a word */
	close(raw_connect_td());

	/* everyone else is fine */
	check_keeper(good);
	CHECK_EQ(kvc_put(good, "after-garbage", "ok", 2, NULL), 0);
	CHECK_EQ(kvc_remove(good, "after-garbage"), 0);
	CHECK(test_counter(good, "protocol_errors") >= 8);
}

/* A client that sends requests and never reads the answers is throttled,
 * not buffered without bound; others keep being served. */
static void test_no_reader(struct kvc_client *good)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq k = KVC__KEY_REQ__INIT;
	uint8_t *one, *many;
	size_t len, total = 0;
	int fd = raw_connect_td(), fl;

	CHECK_EQ(raw_hello(fd, KVC_PROTO_MAJOR), 0);
	k.key = (ProtobufCBinaryData) { 6, (uint8_t *) "keeper" };
	q.op = KVC__OP__OP_EXISTS;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &k;
	CHECK_EQ(wire_frame_pack(WIRE_REQUEST, 1, 0, &q.base, &one, &len), 0);
	many = malloc(len * 4096);
	for (int i = 0; i < 4096; i++)
		memcpy(many + (size_t) i * len, one, len);
	fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	/* push until the socket refuses: the daemon stopped reading */
	for (int round = 0; round < 2000; round++) {
		ssize_t n = send(fd, many, len * 4096, MSG_NOSIGNAL);

		if (n < 0) {
			CHECK(errno == EAGAIN);
			break;
		}
		total += (size_t) n;
	}
	printf("no-reader client pushed %zu bytes before back-pressure\n", total);
	CHECK(total < len * 4096 * 2000);
	check_keeper(good);
	close(fd);
	free(one);
	free(many);
	check_keeper(good);
}

static bool wait_used(struct kvc_client *c, uint64_t want)
{
	for (int i = 0; i < 500; i++) {
		if (test_tier_used(c, "dram") == want)
			return true;
		usleep(10000);
	}
	return false;
}

/* A client killed between reserve and commit, and while holding views:
 * everything it held comes back. */
static void test_killed_client(struct kvc_client *good)
{
	uint64_t used0 = test_tier_used(good, "dram");
	uint64_t res0 = test_counter(good, "reclaimed_reservations");
	uint64_t views0 = test_counter(good, "reclaimed_views");
	int ready[2];
	pid_t pid;
	char b;

	CHECK(pipe(ready) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct kvc_client *c;
		struct kvc_buf r1, r2;
		struct kvc_view v1, v2;

		CHECK_EQ(kvc_connect(td.socket, &c), 0);
		CHECK_EQ(kvc_reserve(c, "never-committed", 8 << 20, NULL, &r1), 0);
		CHECK_EQ(kvc_reserve(c, "never-committed-2", 1000, NULL, &r2), 0);
		memset(r1.data, 0xaa, r1.len);
		CHECK_EQ(kvc_acquire(c, "keeper", &v1), 0);
		CHECK_EQ(kvc_acquire(c, "keeper", &v2), 0);
		CHECK(write(ready[1], "x", 1) == 1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	CHECK_EQ(read(ready[0], &b, 1), 1);
	close(ready[0]);
	CHECK(test_tier_used(good, "dram") >= used0 + (8 << 20) + 1000);
	/* views pin: keeper cannot be removed while the child holds it */
	CHECK_EQ(kvc_remove(good, "keeper"), -EBUSY);
	{
		struct kvc_key_info *v;
		size_t n;
		bool seen = false;

		CHECK_EQ(kvc_list(good, "never-committed", 0, &v, &n, NULL), 0);
		for (size_t i = 0; i < n; i++)
			seen |= v[i].state == KVC_STATE_RESERVED;
		CHECK(seen);
		kvc_list_free(v);
	}
	kill(pid, SIGKILL);
	CHECK_EQ(test_wait(pid), 128 + SIGKILL);
	CHECK(wait_used(good, used0));
	CHECK_EQ(test_counter(good, "reclaimed_reservations"), res0 + 2);
	CHECK_EQ(test_counter(good, "reclaimed_views"), views0 + 2);
	CHECK_EQ(kvc_exists(good, "never-committed"), 0);
	check_keeper(good);
	/* the views are gone: keeper is removable again (then restored) */
	CHECK_EQ(kvc_remove(good, "keeper"), 0);
	CHECK_EQ(kvc_put(good, "keeper", keeper, sizeof(keeper), NULL), 0);
}

static void test_too_big(struct kvc_client *good)
{
	struct kvc_buf b;

	CHECK_EQ(kvc_reserve(good, "too-big", 33 << 20, NULL, &b), -E2BIG);
	CHECK(strstr(kvc_last_error_msg(), "larger than the dram tier"));
	check_keeper(good);
}

int main(void)
{
	struct kvc_client *good;

	test_daemon_start(&td, "--dram-size", "32MB", "--hugepages", "off", "--default-kv-lease-ttl",
			  "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &good), 0);
	test_fill(keeper, sizeof(keeper), 4242);
	CHECK_EQ(kvc_put(good, "keeper", keeper, sizeof(keeper), NULL), 0);

	test_malformed(good);
	test_no_reader(good);
	test_killed_client(good);
	test_too_big(good);

	kvc_disconnect(good);
	test_daemon_stop(&td);
	return 0;
}
