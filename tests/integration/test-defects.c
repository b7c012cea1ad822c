/* SPDX-License-Identifier: MIT */
/*
 * Regression tests for defects found by hostile, faulty and large workloads.
 * Each case is named after the defect it pins down and runs as its own meson
 * test: test-defects NAME.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"
#include "raw.h"

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* The daemon still answers, with bytes intact. */
static void check_serving(const char *socket)
{
	struct kvc_client *c;
	char buf[64];

	CHECK_EQ(kvc_connect(socket, &c), 0);
	kvc_remove(c, "alive");
	CHECK_EQ(kvc_put(c, "alive", "yes", 3, NULL), 0);
	CHECK_EQ(kvc_get(c, "alive", buf, sizeof(buf)), 3);
	CHECK(memcmp(buf, "yes", 3) == 0);
	kvc_disconnect(c);
}

/*
 * A client that hangs up its socket and keeps ringing its channel's doorbell
 * (it holds the same eventfd), and hang-ups racing doorbells in one epoll
 * batch: the daemon must never read the freed channel.  Under ASan a single
 * read of freed memory aborts the daemon, and test_daemon_stop() sees it.
 */
static void test_doorbell_after_hangup(void)
{
	struct test_daemon td;

	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--poll-us", "0", NULL);
	for (int round = 0; round < 20; round++) {
		struct raw_chan rc;
		uint64_t one = 1;

		raw_chan_open(&rc, td.socket);
		close(rc.sock);
		for (int i = 0; i < 50; i++) {
			CHECK(write(rc.efd, &one, sizeof(one)) == sizeof(one));
			if (i % 10 == 0)
				usleep(200);
		}
		close(rc.efd);
		munmap(rc.base, SHM_CHAN_SIZE);
	}
	/* hang-up and doorbell in the same batch: ring, then close at once */
	for (int round = 0; round < 200; round++) {
		struct raw_chan rc;
		struct shm_sqe e = { .opcode = SHM_OP_NOP, .user_data = 1 };
		uint64_t one = 1;

		raw_chan_open(&rc, td.socket);
		memcpy(ring_entry(&rc.sq, rc.sq.pos), &e, sizeof(e));
		ring_publish(&rc.sq, 1);
		CHECK(write(rc.efd, &one, sizeof(one)) == sizeof(one));
		close(rc.sock);
		CHECK(write(rc.efd, &one, sizeof(one)) == sizeof(one));
		close(rc.efd);
		munmap(rc.base, SHM_CHAN_SIZE);
	}
	usleep(50000);
	check_serving(td.socket);
	test_daemon_stop(&td);
}

/*
 * After the daemon slept, the first request must see the time now: a lease
 * that expired while it slept protects nothing, and a hit grants a lease
 * that runs from now.
 */
static void test_stale_clock_after_idle(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	uint64_t bytes, objects;

	/* --poll-us 0: the daemon sleeps whenever it has nothing to do */
	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--poll-us", "0",
			  "--default-kv-lease-ttl", "300", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_put(c, "a", "1", 1, NULL), 0);
	CHECK_EQ(kvc_exists(c, "a"), 1); /* leased for 300 ms */
	CHECK_EQ(kvc_remove(c, "a"), -EBUSY);
	usleep(800 * 1000);
	CHECK_EQ(kvc_remove(c, "a"), 0);

	/* a lease granted right after an idle period is live */
	CHECK_EQ(kvc_put(c, "b", "2", 1, NULL), 0);
	usleep(800 * 1000);
	CHECK_EQ(kvc_exists(c, "b"), 1);
	CHECK_EQ(kvc_remove(c, "b"), -EBUSY);
	usleep(800 * 1000);

	/* expired leases do not hold back a manual eviction */
	CHECK_EQ(kvc_exists(c, "b"), 1);
	for (int i = 0; i < 16; i++) {
		char key[16];

		snprintf(key, sizeof(key), "k%d", i);
		CHECK_EQ(kvc_put(c, key, "x", 1, NULL), 0);
		CHECK_EQ(kvc_exists(c, key), 1);
	}
	usleep(800 * 1000);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &bytes, &objects), 0);
	CHECK_EQ(objects, 17);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* The one socket this process has open: the library's control socket. */
static int client_socket_fd(void)
{
	int found = -1;

	for (int fd = 3; fd < 1024; fd++) {
		char path[64], link[64];
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		if (strncmp(link, "socket:", 7) == 0) {
			CHECK(found < 0);
			found = fd;
		}
	}
	CHECK(found >= 0);
	return found;
}

/*
 * The daemon dies while a reply it sent is still unread in the client's
 * socket: a client waiting on its channel must still notice, and fail with
 * -ECONNRESET instead of waiting forever.
 */
static void test_dead_daemon_unread_reply(void)
{
	struct test_daemon td;
	Kvc__Request q = KVC__REQUEST__INIT;
	struct kvc_client *c;
	char buf[16];
	uint64_t t0;
	pid_t child;

	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--poll-us", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_put(c, "k", "v", 1, NULL), 0);
	/* a reply nobody will read */
	q.op = KVC__OP__OP_STATUS;
	raw_send_msg(client_socket_fd(), WIRE_REQUEST, &q.base);
	usleep(100 * 1000);
	CHECK(kill(td.pid, SIGKILL) == 0);
	CHECK_EQ(test_wait(td.pid), 128 + SIGKILL);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		alarm(30); /* a hang fails the test instead of stalling it */
		t0 = mono_ms();
		CHECK_EQ(kvc_get(c, "k", buf, sizeof(buf)), -ECONNRESET);
		CHECK(mono_ms() - t0 < 20000);
		_exit(0);
	}
	CHECK_EQ(test_wait(child), 0);
	kvc_disconnect(c);
	unlink(td.socket);
	rmdir(td.dir);
}

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
	{ "doorbell-after-hangup", test_doorbell_after_hangup },
	{ "stale-clock-after-idle", test_stale_clock_after_idle },
	{ "dead-daemon-unread-reply", test_dead_daemon_unread_reply },
};

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CASE\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (strcmp(cases[i].name, argv[1]) == 0) {
			cases[i].fn();
			return 0;
		}
	fprintf(stderr, "no case named %s\n", argv[1]);
	return 2;
}
