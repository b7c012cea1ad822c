/* SPDX-License-Identifier: MIT */
/*
 * Regression tests for defects found by hostile, faulty and large workloads.
 * Each case is named after the defect it pins down and runs as its own meson
 * test: test-defects NAME.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "clock.h"
#include "helpers.h"
#include "raw.h"
#include "shmem.h"

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
		t0 = (mono_us() / USEC_PER_MSEC);
		CHECK_EQ(kvc_get(c, "k", buf, sizeof(buf)), -ECONNRESET);
		CHECK((mono_us() / USEC_PER_MSEC) - t0 < 20000);
		_exit(0);
	}
	CHECK_EQ(test_wait(child), 0);
	kvc_disconnect(c);
	unlink(td.socket);
	rmdir(td.dir);
}

/*
 * Every client can write the dram segment, header included.  Zeroing the
 * header must not lock anyone else out: what a client checks at connect
 * comes from the handshake.
 */
static void test_segment_header_scribble(void)
{
	Kvc__Hello hello = KVC__HELLO__INIT;
	struct test_daemon td;
	struct kvc_client *c;
	Kvc__Welcome *w;
	uint8_t *p, *base;
	uint32_t len;
	size_t n_fds;
	int fds[4], sock;
	char buf[16];

	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--device-size", "4MB",
			  NULL);
	sock = raw_connect(td.socket);
	hello.major = KVC_PROTO_MAJOR;
	raw_send_msg(sock, WIRE_HELLO, &hello.base);
	CHECK_EQ(raw_recv_fds(sock, &p, &len, fds, 4, &n_fds), WIRE_WELCOME);
	w = kvc__welcome__unpack(NULL, len, p);
	CHECK(w && w->error == 0 && w->n_segments == n_fds && n_fds == 2);
	for (size_t i = 0; i < n_fds; i++) {
		base = mmap(NULL, w->segments[i]->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		CHECK(base != MAP_FAILED);
		memset(base, 0, SHM_HEADER_SIZE); /* magic, version, sizes: all gone */
		munmap(base, w->segments[i]->size);
		close(fds[i]);
	}
	kvc__welcome__free_unpacked(w, NULL);
	free(p);

	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_put(c, "k", "value", 5, NULL), 0);
	CHECK_EQ(kvc_get(c, "k", buf, sizeof(buf)), 5);
	CHECK(memcmp(buf, "value", 5) == 0);
	kvc_disconnect(c);
	close(sock);
	test_daemon_stop(&td);
}

/* A client's view of a whole segment, by hand. */
struct raw_segment {
	int sock;
	uint8_t *base;
	uint64_t size;
};

static void raw_segment_map(struct raw_segment *rs, const char *socket, unsigned index)
{
	Kvc__Hello hello = KVC__HELLO__INIT;
	Kvc__Welcome *w;
	uint8_t *p;
	uint32_t len;
	size_t n_fds;
	int fds[4];

	rs->sock = raw_connect(socket);
	hello.major = KVC_PROTO_MAJOR;
	raw_send_msg(rs->sock, WIRE_HELLO, &hello.base);
	CHECK_EQ(raw_recv_fds(rs->sock, &p, &len, fds, 4, &n_fds), WIRE_WELCOME);
	w = kvc__welcome__unpack(NULL, len, p);
	CHECK(w && w->error == 0 && index < n_fds);
	rs->size = w->segments[index]->size;
	rs->base = mmap(NULL, rs->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[index], 0);
	CHECK(rs->base != MAP_FAILED);
	for (size_t i = 0; i < n_fds; i++)
		close(fds[i]);
	kvc__welcome__free_unpacked(w, NULL);
	free(p);
}

static void raw_segment_unmap(struct raw_segment *rs)
{
	munmap(rs->base, rs->size);
	close(rs->sock);
}

static volatile bool scribbling;

static void *scribbler(void *arg)
{
	struct raw_segment *rs = arg;

	while (__atomic_load_n(&scribbling, __ATOMIC_ACQUIRE))
		memset(rs->base + SHM_HEADER_SIZE, 0x5a, rs->size - SHM_HEADER_SIZE);
	return NULL;
}

static void put_spilled(struct kvc_client *c, int n, uint8_t *buf, size_t len)
{
	uint64_t bytes, objects;

	for (int i = 0; i < n; i++) {
		char key[32];

		snprintf(key, sizeof(key), "rec/%d", i);
		test_fill(buf, len, (uint64_t) i + 77);
		CHECK_EQ(kvc_put(c, key, buf, len, NULL), 0);
		if (i % 4 == 3)
			CHECK_EQ(kvc_flush(c, 20000), 0);
	}
	CHECK_EQ(kvc_flush(c, 20000), 0);
	CHECK_EQ(test_counter(c, "disk.records"), n);
	/* memory copies go: every read below comes from disk */
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &bytes, &objects), 0);
}

/*
 * A client scribbling over dram while objects are read back from disk must
 * not make the daemon condemn (and delete) good records: the checksum is
 * verified where no client can write.
 */
static void run_scribble_readback(const char *compress)
{
	enum { N = 24, LEN = 1 << 20 };
	struct test_daemon td;
	struct raw_segment rs;
	struct kvc_client *c;
	uint8_t *buf = malloc(LEN);
	char disk[128];
	pthread_t t;

	snprintf(disk, sizeof(disk), "/var/tmp/kvc-scribble-XXXXXX");
	CHECK(mkdtemp(disk));
	test_daemon_start(&td, "--dram-size", "8MB", "--hugepages", "off", "--disk-dir", disk,
			  "--disk-compress", compress, "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	put_spilled(c, N, buf, LEN);

	raw_segment_map(&rs, td.socket, 0);
	scribbling = true;
	CHECK(pthread_create(&t, NULL, scribbler, &rs) == 0);
	for (int round = 0; round < 6; round++) {
		uint64_t bytes, objects;

		for (int i = 0; i < N; i++) {
			char key[32];

			snprintf(key, sizeof(key), "rec/%d", i);
			CHECK_EQ(kvc_get(c, key, buf, LEN), LEN); /* bytes: whatever the scribbler left */
		}
		CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &bytes, &objects), 0);
	}
	__atomic_store_n(&scribbling, false, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	raw_segment_unmap(&rs);

	CHECK_EQ(test_counter(c, "disk.checksum_failures"), 0);
	CHECK_EQ(test_counter(c, "disk.records"), N);
	for (int i = 0; i < N; i++) {
		char key[32];

		snprintf(key, sizeof(key), "rec/%d", i);
		CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
		CHECK(test_verify(buf, LEN, (uint64_t) i + 77));
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);
	{
		char cmd[192];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", disk);
		CHECK(system(cmd) == 0);
	}
	free(buf);
}

static void test_scribble_during_readback(void)
{
	run_scribble_readback("none");
	run_scribble_readback("zstd");
}

static volatile bool flipping;

static void *iov_flipper(void *arg)
{
	struct shm_iov *iov = arg;

	for (uint64_t i = 0; __atomic_load_n(&flipping, __ATOMIC_ACQUIRE); i++)
		__atomic_store_n(&iov->len, i & 1 ? 4096 : 256 << 10, __ATOMIC_RELAXED);
	return NULL;
}

/*
 * put_from whose iov list changes while the daemon runs it: the list that
 * sized the object must be the one that fills it, so every stored object is
 * the buffer's bytes over its whole length, never a short copy.
 */
static void test_put_from_iov_race(void)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__BufferReq bq = KVC__BUFFER_REQ__INIT;
	struct test_daemon td;
	struct raw_chan rc;
	struct kvc_client *c;
	Kvc__Response *resp;
	struct shm_iov *iov;
	uint8_t *p, *bufmem, *back = malloc(256 << 10);
	uint32_t len;
	size_t n_fds;
	int fd, stored = 0;
	uint64_t handle;
	pthread_t t;

	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	/* leave dram dirty with other bytes, so a short copy shows */
	{
		uint8_t *junk = malloc(256 << 10);

		memset(junk, 0xee, 256 << 10);
		for (int i = 0; i < 200; i++) {
			char key[32];

			snprintf(key, sizeof(key), "junk/%d", i);
			CHECK_EQ(kvc_put(c, key, junk, 256 << 10, NULL), 0);
			CHECK_EQ(kvc_remove(c, key), 0);
		}
		free(junk);
	}
	raw_chan_open(&rc, td.socket);
	q.op = KVC__OP__OP_BUFFER_ALLOC;
	q.body_case = KVC__REQUEST__BODY_BUFFER;
	bq.size = 256 << 10;
	q.buffer = &bq;
	raw_send_msg(rc.sock, WIRE_REQUEST, &q.base);
	CHECK_EQ(raw_recv_fds(rc.sock, &p, &len, &fd, 1, &n_fds), WIRE_RESPONSE);
	CHECK_EQ(n_fds, 1);
	resp = kvc__response__unpack(NULL, len, p);
	CHECK(resp && resp->error == 0);
	handle = resp->extent->handle;
	kvc__response__free_unpacked(resp, NULL);
	free(p);
	bufmem = mmap(NULL, 256 << 10, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(bufmem != MAP_FAILED);
	close(fd);
	memset(bufmem, 0xab, 256 << 10);

	/* a long list (the rest empty) widens the window between two reads */
	iov = (struct shm_iov *) (rc.arena + 4096);
	for (int i = 0; i < 1024; i++)
		iov[i] = (struct shm_iov) { .buffer = handle, .off = 0, .len = 0 };
	iov[0].len = 4096;
	flipping = true;
	CHECK(pthread_create(&t, NULL, iov_flipper, iov) == 0);
	for (int i = 0; i < 3000; i++) {
		struct shm_sqe e = { .opcode = SHM_OP_PUT_FROM, .count = 1024, .list_off = 4096,
				     .user_data = (uint64_t) i + 1 };
		char key[32];
		int64_t r;

		snprintf(key, sizeof(key), "pf/%d", i);
		e.key_len = (uint16_t) strlen(key);
		memcpy(rc.arena, key, e.key_len);
		r = raw_chan_call(&rc, &e);
		CHECK(r == 0 || r == -EFAULT);
		if (r == 0) {
			ssize_t n = kvc_get(c, key, back, 256 << 10);

			CHECK(n == 4096 || n == 256 << 10);
			for (ssize_t j = 0; j < n; j++)
				CHECK_EQ(back[j], 0xab);
			CHECK_EQ(kvc_remove(c, key), 0);
			stored++;
		}
	}
	__atomic_store_n(&flipping, false, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	CHECK(stored > 0);
	munmap(bufmem, 256 << 10);
	munmap(rc.base, SHM_CHAN_SIZE);
	close(rc.efd);
	close(rc.sock);
	kvc_disconnect(c);
	free(back);
	test_daemon_stop(&td);
}

/* Daemon-wide limits: each refusal is a clear error to that client only. */
static void test_daemon_wide_limits(void)
{
	struct test_daemon td;
	struct kvc_client *c[4], *extra;
	struct kvc_buffer b1, b2, b3;
	char buf[8];

	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--max-clients", "3",
			  "--max-registered-bytes", "8MB", NULL);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(kvc_connect(td.socket, &c[i]), 0);
	CHECK_EQ(kvc_connect(td.socket, &extra), -EUSERS);
	CHECK(strstr(kvc_last_error_msg(), "--max-clients"));
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(kvc_put(c[i], i == 0 ? "a" : i == 1 ? "b" : "c", "v", 1, NULL), 0);
		CHECK_EQ(kvc_get(c[i], "a", buf, sizeof(buf)), 1);
	}
	CHECK_EQ(test_counter(c[0], "refused_clients"), 1);
	kvc_disconnect(c[2]);
	usleep(100 * 1000);
	CHECK_EQ(kvc_connect(td.socket, &c[2]), 0); /* a slot came free */

	/* registered bytes, all clients together */
	CHECK_EQ(kvc_buffer_alloc(c[0], 6 << 20, &b1), 0);
	CHECK_EQ(kvc_buffer_alloc(c[1], 4 << 20, &b2), -ENOSPC);
	CHECK(strstr(kvc_last_error_msg(), "--max-registered-bytes"));
	CHECK_EQ(kvc_buffer_alloc(c[1], 2 << 20, &b3), 0);
	CHECK_EQ(kvc_buffer_free(c[0], &b1), 0);
	CHECK_EQ(kvc_buffer_alloc(c[1], 4 << 20, &b2), 0);
	CHECK_EQ(test_counter(c[1], "refused_buffers"), 1);
	CHECK_EQ(kvc_get(c[1], "b", buf, sizeof(buf)), 1);
	kvc_buffer_free(c[1], &b2);
	kvc_buffer_free(c[1], &b3);
	for (int i = 0; i < 3; i++)
		kvc_disconnect(c[i]);
	test_daemon_stop(&td);

	/* channels, daemon-wide: every client opens one */
	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--max-channels", "2",
			  NULL);
	CHECK_EQ(kvc_connect(td.socket, &c[0]), 0);
	CHECK_EQ(kvc_connect(td.socket, &c[1]), 0);
	CHECK_EQ(kvc_connect(td.socket, &extra), -EMFILE);
	CHECK(strstr(kvc_last_error_msg(), "--max-channels"));
	CHECK_EQ(kvc_put(c[1], "x", "y", 1, NULL), 0);
	CHECK_EQ(test_counter(c[0], "refused_channels"), 1);
	kvc_disconnect(c[0]);
	kvc_disconnect(c[1]);
	test_daemon_stop(&td);
}

static void rm_rf(const char *dir)
{
	char cmd[192];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0);
}

static void disk_key(char *buf, size_t len, int i)
{
	snprintf(buf, len, "spilled/%d", i);
}

/* Objects disk_key(0..n-1), back to back, each its own bytes. */
static void put_numbered(struct kvc_client *c, int n, uint8_t *buf, size_t len)
{
	char key[32];

	for (int i = 0; i < n; i++) {
		disk_key(key, sizeof(key), i);
		test_fill(buf, len, (uint64_t) i);
		CHECK_EQ(kvc_put(c, key, buf, len, NULL), 0);
	}
}

/* A daemon of 64 MiB dram over a disk tier in a new directory (its name
 * into disk), restarted after n numbered objects of len bytes were put and
 * flushed: every one is on disk only.  A client of it. */
static struct kvc_client *on_disk_only(struct test_daemon *td, char *disk, size_t cap, int n,
				       uint8_t *buf, size_t len)
{
	struct kvc_client *c;

	snprintf(disk, cap, "/var/tmp/kvc-spilled-XXXXXX");
	CHECK(mkdtemp(disk));
	test_daemon_start(td, "--dram-size", "64MB", "--hugepages", "off", "--disk-dir", disk, NULL);
	CHECK_EQ(kvc_connect(td->socket, &c), 0);
	put_numbered(c, n, buf, len);
	CHECK_EQ(kvc_flush(c, 30000), 0);
	kvc_disconnect(c);
	test_daemon_stop(td);
	test_daemon_start(td, "--dram-size", "64MB", "--hugepages", "off", "--disk-dir", disk, NULL);
	test_wait_recovered(td->socket);
	CHECK_EQ(kvc_connect(td->socket, &c), 0);
	return c;
}

/*
 * A burst of puts into a small dram over a disk tier: a put must not push
 * out an object that has not reached disk faster than the disk takes it.
 * Every object of the burst is still there afterwards, byte for byte.
 */
static void test_put_burst_over_disk(void)
{
	enum { N = 300, LEN = 1 << 20 };
	struct test_daemon td;
	struct kvc_client *c;
	uint8_t *buf = malloc(LEN);
	char disk[64], key[32];

	snprintf(disk, sizeof(disk), "/var/tmp/kvc-burst-XXXXXX");
	CHECK(mkdtemp(disk));
	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off", "--disk-dir", disk,
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	put_numbered(c, N, buf, LEN);
	printf("burst of %d puts stored; %llu dropped from dram\n", N,
	       (unsigned long long) test_counter(c, "dram.evictions"));
	fflush(stdout);
	for (int i = 0; i < N; i++) {
		disk_key(key, sizeof(key), i);
		memset(buf, 0, LEN);
		CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
		CHECK(test_verify(buf, LEN, (uint64_t) i));
	}
	CHECK_EQ(test_counter(c, "dram.evictions"), 0); /* demoted, never dropped */
	printf("%d puts into 64 MiB over a disk tier: all kept; %llu waited for a spill\n", N,
	       (unsigned long long) test_counter(c, "spill_waits"));
	kvc_disconnect(c);
	test_daemon_stop(&td);
	rm_rf(disk);
	free(buf);
}

/*
 * Reads of objects that are only on disk, while dram is full of leased
 * objects: a lease keeps an object in the pool, not in dram, so a leased
 * object with a clean copy on disk gives way.  Every read succeeds, through
 * every kind of get.
 */
static void test_disk_reads_under_leases(void)
{
	enum { N = 300, LEN = 1 << 20 };
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_buffer rb;
	uint8_t *buf = malloc(LEN);
	char disk[64], key[32];

	/* each read leases its object for the default 10 s, far longer than
	 * this test */
	c = on_disk_only(&td, disk, sizeof(disk), N, buf, LEN);
	CHECK_EQ(kvc_buffer_alloc(c, LEN, &rb), 0);
	for (int i = 0; i < N; i++) {
		struct kvc_view v;

		disk_key(key, sizeof(key), i);
		switch (i % 4) {
		case 0:
			CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
			CHECK(test_verify(buf, LEN, (uint64_t) i));
			break;
		case 1:
			CHECK_EQ(kvc_get_into(c, key, &rb, 0, LEN), LEN);
			CHECK(test_verify(rb.data, LEN, (uint64_t) i));
			break;
		case 2:
			CHECK_EQ(kvc_acquire(c, key, &v), 0);
			CHECK(test_verify(v.data, v.len, (uint64_t) i));
			CHECK_EQ(kvc_release(c, &v), 0);
			break;
		default: {
			const char *keys[1] = { key };
			struct kvc_iovec iov = { buf, LEN };
			const struct kvc_iovec *iovs[1] = { &iov };
			size_t n_iov = 1;
			ssize_t res;

			CHECK_EQ(kvc_batch_get(c, 1, keys, iovs, &n_iov, &res), 1);
			CHECK_EQ(res, LEN);
			CHECK(test_verify(buf, LEN, (uint64_t) i));
			break;
		}
		}
	}
	CHECK_EQ(test_counter(c, "disk.records"), N);
	kvc_buffer_free(c, &rb);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	rm_rf(disk);
	free(buf);
}

/*
 * One batch larger than dram, of objects only on disk: every one read
 * whole, by the library's copies and into a registered buffer (the batch's
 * own earlier hits, leased, must not keep the later ones out).
 */
static void test_batch_larger_than_dram(void)
{
	enum { N = 150, LEN = 1 << 20 };
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_buffer rb;
	uint8_t *buf = malloc((size_t) N * LEN);
	char disk[64], names[N][32];
	const char *keys[N];
	struct kvc_iovec iov[N];
	const struct kvc_iovec *iovs[N];
	struct kvc_iov riov[N];
	const struct kvc_iov *riovs[N];
	size_t n_iov[N];
	ssize_t res[N];

	CHECK(buf);
	c = on_disk_only(&td, disk, sizeof(disk), N, buf, LEN);
	for (int i = 0; i < N; i++) {
		disk_key(names[i], sizeof(names[i]), i);
		keys[i] = names[i];
		iov[i] = (struct kvc_iovec) { buf + (size_t) i * LEN, LEN };
		iovs[i] = &iov[i];
		n_iov[i] = 1;
	}
	memset(buf, 0, (size_t) N * LEN);
	CHECK_EQ(kvc_batch_get(c, N, keys, iovs, n_iov, res), N);
	for (int i = 0; i < N; i++) {
		CHECK_EQ(res[i], LEN);
		CHECK(test_verify(buf + (size_t) i * LEN, LEN, (uint64_t) i));
	}
	CHECK_EQ(kvc_buffer_alloc(c, (size_t) N * LEN, &rb), 0);
	for (int i = 0; i < N; i++) {
		riov[i] = (struct kvc_iov) { &rb, (uint64_t) i * LEN, LEN };
		riovs[i] = &riov[i];
	}
	CHECK_EQ(kvc_batch_get_into(c, N, keys, riovs, n_iov, res), N);
	for (int i = 0; i < N; i++) {
		CHECK_EQ(res[i], LEN);
		CHECK(test_verify((uint8_t *) rb.data + (size_t) i * LEN, LEN, (uint64_t) i));
	}
	kvc_buffer_free(c, &rb);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	rm_rf(disk);
	free(buf);
}

/*
 * Everything else in dram is leased: a fresh object must not be dropped by
 * the background evictor right after its put returned 0.
 */
static void test_fresh_object_kept(void)
{
	enum { LEN = 1 << 20 };
	struct test_daemon td;
	struct kvc_client *c;
	uint8_t *buf = malloc(LEN);
	char key[32];

	/* high 18 MiB, low 17 MiB */
	test_daemon_start(&td, "--dram-size", "20MB", "--hugepages", "off",
			  "--eviction-high-watermark-ratio", "0.9", "--eviction-ratio", "0.05", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	test_fill(buf, LEN, 5);
	for (int i = 0; i < 17; i++) {
		snprintf(key, sizeof(key), "leased/%d", i);
		CHECK_EQ(kvc_put(c, key, buf, LEN, NULL), 0);
		CHECK_EQ(kvc_exists(c, key), 1); /* leased for 10 s */
	}
	CHECK_EQ(kvc_put(c, "fresh-a", buf, LEN, NULL), 0);
	CHECK_EQ(kvc_put(c, "fresh-b", buf, LEN, NULL), 0); /* now above high */
	usleep(50 * 1000); /* the background evictor had its turns */
	CHECK_EQ(kvc_get(c, "fresh-a", buf, LEN), LEN);
	CHECK_EQ(kvc_get(c, "fresh-b", buf, LEN), LEN);
	CHECK(test_verify(buf, LEN, 5));
	kvc_disconnect(c);
	test_daemon_stop(&td);
	free(buf);
}

/*
 * Choosing a victim looks at a bounded number of objects, however many at
 * the old end of the LRU are hard-pinned or leased.
 */
static void test_victim_search_bounded(void)
{
	enum { PINNED = 20000, LEN = 512 };
	struct kvc_put_opts hard = { .flags = KVC_PUT_HARD_PIN };
	struct test_daemon td;
	struct kvc_client *c;
	uint8_t buf[LEN];
	uint64_t examined, evictions;
	char key[32];

	memset(buf, 7, sizeof(buf));
	test_daemon_start(&td, "--dram-size", "32MB", "--hugepages", "off",
			  "--default-kv-lease-ttl", "60000", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	for (int i = 0; i < PINNED; i++) {
		snprintf(key, sizeof(key), "pinned/%d", i);
		CHECK_EQ(kvc_put(c, key, buf, LEN, &hard), 0);
	}
	for (int i = 0; i < PINNED; i++) {
		snprintf(key, sizeof(key), "leased/%d", i);
		CHECK_EQ(kvc_put(c, key, buf, LEN, NULL), 0);
		CHECK_EQ(kvc_exists(c, key), 1);
	}
	/* 3x the rest of the pool in unprotected puts */
	for (int i = 0; i < 150000; i++) {
		snprintf(key, sizeof(key), "churn/%d", i);
		CHECK_EQ(kvc_put(c, key, buf, LEN, NULL), 0);
	}
	examined = test_counter(c, "evict_examined");
	evictions = test_counter(c, "dram.evictions");
	printf("%llu evictions examined %llu objects\n", (unsigned long long) evictions,
	       (unsigned long long) examined);
	fflush(stdout);
	CHECK(evictions > 50000);
	CHECK(examined < 8 * evictions);
	for (int i = 0; i < PINNED; i += 997) {
		snprintf(key, sizeof(key), "pinned/%d", i);
		CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
		snprintf(key, sizeof(key), "leased/%d", i);
		CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/*
 * A restart over many records answers at once: records are indexed in the
 * background (those not yet indexed are misses), status shows progress,
 * and a put made meanwhile wins over an older record of its key.
 */
static void test_serve_while_recovering(void)
{
	enum { N = 20000, LEN = 4096 };
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_status *st;
	uint8_t buf[LEN];
	char disk[64], key[32];
	uint64_t t0;

	snprintf(disk, sizeof(disk), "/var/tmp/kvc-recover-XXXXXX");
	CHECK(mkdtemp(disk));
	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--disk-dir", disk,
			  "--default-kv-lease-ttl", "0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	put_numbered(c, N, buf, LEN);
	CHECK_EQ(kvc_flush(c, 60000), 0);
	CHECK_EQ(test_counter(c, "disk.records"), N);
	kvc_disconnect(c);
	test_daemon_stop(&td);

	/* the recovery thread pauses 20 ms per 1000 records: about 0.4 s */
	setenv("KVCACHE_TEST_RECOVERY_PAUSE_MS", "20", 1);
	t0 = (mono_us() / USEC_PER_MSEC);
	test_daemon_start(&td, "--dram-size", "16MB", "--hugepages", "off", "--disk-dir", disk,
			  "--default-kv-lease-ttl", "0", NULL);
	unsetenv("KVCACHE_TEST_RECOVERY_PAUSE_MS");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_status_get(c, &st), 0);
	printf("first status %llu ms after start: recovering %d, %llu of %llu indexed\n",
	       (unsigned long long) ((mono_us() / USEC_PER_MSEC) - t0), st->recovering,
	       (unsigned long long) st->recovered, (unsigned long long) st->recovery_total);
	CHECK(st->recovering);
	CHECK_EQ(st->recovery_total, N);
	CHECK(st->recovered < N);
	kvc_status_free(st);
	/* served meanwhile: new puts, and a newer value of a recovering key */
	CHECK_EQ(kvc_put(c, "new-during-recovery", "x", 1, NULL), 0);
	disk_key(key, sizeof(key), 7);
	memset(buf, 0x42, LEN);
	CHECK_EQ(kvc_put(c, key, buf, LEN, &(struct kvc_put_opts) { .flags = KVC_PUT_REPLACE }), 0);

	test_wait_recovered(td.socket);
	CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
	for (int j = 0; j < LEN; j++)
		CHECK_EQ(buf[j], 0x42); /* the older record lost */
	for (int i = 0; i < N; i += 7) {
		if (i == 7)
			continue;
		disk_key(key, sizeof(key), i);
		CHECK_EQ(kvc_get(c, key, buf, LEN), LEN);
		CHECK(test_verify(buf, LEN, (uint64_t) i));
	}
	CHECK_EQ(kvc_exists(c, "new-during-recovery"), 1);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	rm_rf(disk);
}

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
	{ "doorbell-after-hangup", test_doorbell_after_hangup },
	{ "stale-clock-after-idle", test_stale_clock_after_idle },
	{ "dead-daemon-unread-reply", test_dead_daemon_unread_reply },
	{ "segment-header-scribble", test_segment_header_scribble },
	{ "scribble-during-readback", test_scribble_during_readback },
	{ "put-from-iov-race", test_put_from_iov_race },
	{ "daemon-wide-limits", test_daemon_wide_limits },
	{ "put-burst-over-disk", test_put_burst_over_disk },
	{ "disk-reads-under-leases", test_disk_reads_under_leases },
	{ "batch-larger-than-dram", test_batch_larger_than_dram },
	{ "fresh-object-kept", test_fresh_object_kept },
	{ "victim-search-bounded", test_victim_search_bounded },
	{ "serve-while-recovering", test_serve_while_recovering },
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
