/* SPDX-License-Identifier: MIT */
/* The disk tier: spill and read back with and without zstd, kill -9 during
 * heavy spilling and restart on the same directory, a full filesystem, a
 * read-only directory, and damaged records. */
#include <fcntl.h>
#include <linux/io_uring.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"
#include "raw.h"

#define MiB (1u << 20)

static char base[64];

/* fp16-like KV values: small magnitudes, so zstd finds something */
static void fill_kv(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i + 2 <= len; i += 2) {
		uint16_t h = (uint16_t) (0x2c00 + (test_rand(&s) & 0x3ff));

		memcpy(buf + i, &h, 2);
	}
	if (len & 1)
		buf[len - 1] = (uint8_t) seed;
}

static bool on_disk(struct kvc_client *c, const char *key, int *ret_tier)
{
	struct kvc_key_info *v;
	size_t n;
	bool found = false;

	CHECK_EQ(kvc_list(c, key, 4096, &v, &n, NULL), 0);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].key, key)) {
			found = v[i].on_disk;
			if (ret_tier)
				*ret_tier = v[i].tier;
		}
	kvc_list_free(v);
	return found;
}

static void start(struct test_daemon *td, const char *dir, const char *dram, const char *compress)
{
	test_daemon_start(td, "--dram-size", dram, "--disk-dir", dir, "--disk-size", "512MB",
			  "--disk-compress", compress, "--default-kv-lease-ttl", "0", "--hugepages",
			  "off", NULL);
}

/* Start again on the same directory (test_daemon_start makes a new socket
 * directory each time; the data directory is what matters). */
static void restart(struct test_daemon *td, const char *dir, const char *dram)
{
	start(td, dir, dram, "none");
	test_wait_recovered(td->socket);
}

static void test_round_trip(const char *compress)
{
	struct test_daemon td;
	struct kvc_client *c;
	char dir[128];
	static uint8_t buf[MiB];
	int on_disk_only = 0;

	snprintf(dir, sizeof(dir), "%s/rt-%s", base, compress);
	CHECK(mkdir(dir, 0700) == 0);
	start(&td, dir, "16MB", compress);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	/* 48 MiB through 16 MiB: half KV-like values, half incompressible */
	for (int i = 0; i < 48; i++) {
		char key[32];

		snprintf(key, sizeof(key), "rt/%d", i);
		if (i % 2)
			test_fill(buf, sizeof(buf), (uint64_t) i);
		else
			fill_kv(buf, sizeof(buf), (uint64_t) i);
		CHECK_EQ(kvc_put(c, key, buf, sizeof(buf), NULL), 0);
		/* puts outrun the disk; a cache would drop what it cannot spill
		 * in time, so let it catch up to make "nothing dropped" exact */
		if (i % 8 == 7)
			CHECK_EQ(kvc_flush(c, 20000), 0);
	}
	CHECK(test_counter(c, "disk.writes") > 0);
	CHECK(test_counter(c, "disk.demotions") > 0);
	CHECK_EQ(test_counter(c, "dram.evictions"), 0); /* spilled ahead, nothing dropped */
	for (int i = 0; i < 48; i++) {
		char key[32];
		int tier = 0;

		snprintf(key, sizeof(key), "rt/%d", i);
		on_disk(c, key, &tier);
		on_disk_only += tier == KVC_TIER_DISK;
	}
	CHECK(on_disk_only > 0);
	/* every byte back, whichever tier serves it */
	for (int i = 0; i < 48; i++) {
		char key[32];
		static uint8_t want[MiB];

		snprintf(key, sizeof(key), "rt/%d", i);
		memset(buf, 0, sizeof(buf));
		CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), sizeof(buf));
		if (i % 2)
			test_fill(want, sizeof(want), (uint64_t) i);
		else
			fill_kv(want, sizeof(want), (uint64_t) i);
		CHECK(memcmp(buf, want, sizeof(buf)) == 0);
	}
	CHECK(test_counter(c, "disk.reads") > 0);
	CHECK_EQ(test_counter(c, "disk.checksum_failures"), 0);
	printf("%s: %d of 48 objects only on disk; %llu records, %llu bytes on disk for %llu bytes "
	       "of values (%llu per mille), %llu reads back\n", compress, on_disk_only,
	       (unsigned long long) test_counter(c, "disk.records"),
	       (unsigned long long) test_counter(c, "disk.bytes"),
	       (unsigned long long) test_counter(c, "disk.raw_bytes"),
	       (unsigned long long) test_counter(c, "disk.compression_permille"),
	       (unsigned long long) test_counter(c, "disk.reads"));
	if (!strcmp(compress, "zstd"))
		CHECK(test_counter(c, "disk.compression_permille") < 1000);
	else
		CHECK(test_counter(c, "disk.compression_permille") >= 1000);
	/* removed objects do not come back after a restart */
	CHECK_EQ(kvc_remove(c, "rt/0"), 0);
	CHECK_EQ(kvc_remove(c, "rt/1"), 0);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	restart(&td, dir, "16MB");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_exists(c, "rt/0"), 0);
	CHECK_EQ(kvc_exists(c, "rt/1"), 0);
	/* the objects spilled before the stop are served again */
	CHECK(test_counter(c, "disk.recovered") > 0);
	CHECK_EQ(kvc_get(c, "rt/3", buf, sizeof(buf)), sizeof(buf));
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* ---- kill -9 during heavy spilling ---- */

static void writer(const char *sock)
{
	struct kvc_client *c;
	static uint8_t buf[512 << 10];

	if (kvc_connect(sock, &c) < 0)
		_exit(0);
	for (int i = 0;; i++) {
		char key[32];

		snprintf(key, sizeof(key), "crash/%d", i);
		test_fill(buf, sizeof(buf), (uint64_t) i + 77);
		if (kvc_put(c, key, buf, sizeof(buf), NULL) < 0)
			_exit(0); /* the daemon is gone */
	}
}

static void test_crash(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	char dir[128], path[256];
	static char spilled[4096][32];
	static uint8_t buf[512 << 10];
	size_t n_spilled = 0;
	pid_t w;
	int fd;

	snprintf(dir, sizeof(dir), "%s/crash", base);
	CHECK(mkdir(dir, 0700) == 0);
	start(&td, dir, "16MB", "none");
	w = fork();
	if (w == 0)
		writer(td.socket);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	/* let it spill for a while, then take note of what is on disk */
	while (test_counter(c, "disk.writes") < 60)
		usleep(5000);
	{
		struct kvc_key_info *v;
		size_t n;

		CHECK_EQ(kvc_list(c, "crash/", 4096, &v, &n, NULL), 0);
		for (size_t i = 0; i < n && n_spilled < 4096; i++)
			if (v[i].on_disk)
				snprintf(spilled[n_spilled++], 32, "%s", v[i].key);
		kvc_list_free(v);
	}
	CHECK(n_spilled > 20);
	kill(td.pid, SIGKILL); /* spilling goes on right now */
	CHECK_EQ(test_wait(td.pid), 128 + SIGKILL);
	CHECK_EQ(test_wait(w), 0);
	kvc_disconnect(c);
	/* the killed daemon's socket and lock stay behind; the next one
	 * gets a directory of its own */
	{
		char f[160];

		snprintf(f, sizeof(f), "%s.lock", td.socket);
		unlink(f);
		unlink(td.socket);
		rmdir(td.dir);
	}

	/* what a crash can leave: a half-written record, a truncated one */
	snprintf(path, sizeof(path), "%s/00000000000fffff.tmp", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0 && write(fd, "partial", 7) == 7);
	close(fd);
	snprintf(path, sizeof(path), "%s/00000000000ffffe.kvr", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0 && write(fd, "\0KVREC01 and then nothing", 24) == 24);
	close(fd);

	restart(&td, dir, "16MB");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK(test_counter(c, "disk.skipped") >= 2);
	for (size_t i = 0; i < n_spilled; i++) {
		int idx = atoi(spilled[i] + 6);

		CHECK_EQ(kvc_get(c, spilled[i], buf, sizeof(buf)), sizeof(buf));
		CHECK(test_verify(buf, sizeof(buf), (uint64_t) idx + 77));
	}
	printf("crash: %zu objects reported on disk before kill -9, all served again after restart "
	       "(%llu recovered, %llu partial or damaged skipped)\n", n_spilled,
	       (unsigned long long) test_counter(c, "disk.recovered"),
	       (unsigned long long) test_counter(c, "disk.skipped"));
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* ---- damaged records ---- */

static void test_corruption(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	char dir[128];
	static uint8_t buf[MiB];
	int flipped = 0;

	snprintf(dir, sizeof(dir), "%s/corrupt", base);
	CHECK(mkdir(dir, 0700) == 0);
	start(&td, dir, "16MB", "none");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	for (int i = 0; i < 8; i++) {
		char key[32];

		snprintf(key, sizeof(key), "bad/%d", i);
		test_fill(buf, sizeof(buf), (uint64_t) i + 900);
		CHECK_EQ(kvc_put(c, key, buf, sizeof(buf), NULL), 0);
	}
	CHECK_EQ(kvc_flush(c, 10000), 0);
	CHECK_EQ(test_counter(c, "disk.records"), 8);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	/* flip one byte in the middle of every record's value */
	for (uint64_t id = 1; id <= 8; id++) {
		char path[256];
		int fd;
		uint8_t b;

		snprintf(path, sizeof(path), "%s/%016llx.kvr", dir, (unsigned long long) id);
		fd = open(path, O_RDWR);
		if (fd < 0)
			continue;
		CHECK(pread(fd, &b, 1, 300000) == 1);
		b ^= 0x40;
		CHECK(pwrite(fd, &b, 1, 300000) == 1);
		close(fd);
		flipped++;
	}
	CHECK_EQ(flipped, 8);
	restart(&td, dir, "16MB");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	for (int i = 0; i < 8; i++) {
		char key[32];

		snprintf(key, sizeof(key), "bad/%d", i);
		CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), -EBADMSG);
		CHECK(strstr(kvc_last_error_msg(), "damaged"));
		CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), -ENOENT); /* dropped */
	}
	CHECK_EQ(test_counter(c, "disk.checksum_failures"), 8);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* ---- a full filesystem, a read-only directory ---- */

static bool mount_tmpfs(const char *dir, const char *opts, unsigned long flags)
{
	if (mkdir(dir, 0700) < 0)
		return false;
	return mount("tmpfs", dir, "tmpfs", flags, opts) == 0;
}

static void put_and_check_served(struct kvc_client *c, const char *prefix, int n)
{
	static uint8_t buf[MiB];

	for (int i = 0; i < n; i++) {
		char key[32];

		snprintf(key, sizeof(key), "%s/%d", prefix, i);
		test_fill(buf, sizeof(buf), (uint64_t) i + 4000);
		CHECK_EQ(kvc_put(c, key, buf, sizeof(buf), NULL), 0);
	}
	for (int i = 0; i < n; i++) {
		char key[32];

		snprintf(key, sizeof(key), "%s/%d", prefix, i);
		CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), sizeof(buf));
		CHECK(test_verify(buf, sizeof(buf), (uint64_t) i + 4000));
	}
}

static bool test_full_and_readonly(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	char dir[128];

	/* 4 MiB of filesystem behind a disk tier that thinks it has 512 */
	snprintf(dir, sizeof(dir), "%s/full", base);
	if (!mount_tmpfs(dir, "size=4m", 0)) {
		printf("cannot mount a small tmpfs here (%s); full-filesystem case not run\n",
		       strerror(errno));
		return false;
	}
	start(&td, dir, "64MB", "none");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	put_and_check_served(c, "full", 24);
	/* a flush that could not write everything says so */
	CHECK_EQ(kvc_flush(c, 20000), -ENOSPC);
	CHECK(strstr(kvc_last_error_msg(), "could not be written"));
	CHECK(test_counter(c, "disk.enospc") > 0);
	CHECK(test_counter(c, "disk.io_errors") > 0);
	put_and_check_served(c, "full2", 8); /* still serving, nothing lost */
	{
		static uint8_t buf[MiB];

		for (int i = 0; i < 24; i++) {
			char key[32];

			snprintf(key, sizeof(key), "full/%d", i);
			CHECK_EQ(kvc_get(c, key, buf, sizeof(buf)), sizeof(buf));
			CHECK(test_verify(buf, sizeof(buf), (uint64_t) i + 4000));
		}
	}
	printf("full filesystem: %llu ENOSPC counted, %llu records made it, all 32 objects served "
	       "from dram\n", (unsigned long long) test_counter(c, "disk.enospc"),
	       (unsigned long long) test_counter(c, "disk.records"));
	kvc_disconnect(c);
	test_daemon_stop(&td);
	umount(dir);

	snprintf(dir, sizeof(dir), "%s/ro", base);
	if (!mount_tmpfs(dir, "size=16m", MS_RDONLY)) {
		printf("cannot mount a read-only tmpfs here; read-only case not run\n");
		return false;
	}
	start(&td, dir, "64MB", "none");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK(test_counter(c, "disk.io_errors") >= 1); /* said so at start */
	put_and_check_served(c, "ro", 16);
	CHECK_EQ(kvc_flush(c, 20000), -EROFS);
	CHECK(strstr(kvc_last_error_msg(), "16 objects could not be written"));
	CHECK_EQ(test_counter(c, "disk.records"), 0);
	put_and_check_served(c, "ro2", 4);
	printf("read-only directory: %llu I/O errors counted, all 20 objects served from dram\n",
	       (unsigned long long) test_counter(c, "disk.io_errors"));
	kvc_disconnect(c);
	test_daemon_stop(&td);
	umount(dir);
	return true;
}

/* Acquire over the control socket: the request waits for the read-back
 * (no -EAGAIN), and requests pipelined behind it are answered after it, in
 * order. */
static void test_socket_acquire(void)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq kq = KVC__KEY_REQ__INIT;
	struct test_daemon td;
	struct kvc_client *c;
	uint64_t bytes, objects;
	static uint8_t buf[MiB];
	char dir[128];
	uint8_t *p;
	uint32_t len;
	int sock;

	snprintf(dir, sizeof(dir), "%s/sock", base);
	CHECK(mkdir(dir, 0700) == 0);
	start(&td, dir, "16MB", "none");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	test_fill(buf, sizeof(buf), 5);
	CHECK_EQ(kvc_put(c, "sock/a", buf, sizeof(buf), NULL), 0);
	CHECK_EQ(kvc_flush(c, 20000), 0);
	CHECK_EQ(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, &bytes, &objects), 0);
	CHECK(on_disk(c, "sock/a", NULL));

	sock = raw_connect(td.socket);
	CHECK_EQ(raw_hello(sock, KVC_PROTO_MAJOR), 0);
	q.op = KVC__OP__OP_ACQUIRE;
	q.body_case = KVC__REQUEST__BODY_KEY;
	kq.key = (ProtobufCBinaryData) { .len = 6, .data = (uint8_t *) "sock/a" };
	q.key = &kq;
	raw_send_msg(sock, WIRE_REQUEST, &q.base);   /* waits for the disk */
	q.op = KVC__OP__OP_EXISTS;
	raw_send_msg(sock, WIRE_REQUEST, &q.base);   /* queued behind it */
	for (int i = 0; i < 2; i++) {
		Kvc__Response *resp;

		CHECK_EQ(raw_recv(sock, &p, &len), WIRE_RESPONSE);
		resp = kvc__response__unpack(NULL, len, p);
		CHECK(resp);
		CHECK_EQ(resp->error, 0);
		if (i == 0) {
			CHECK_EQ(resp->body_case, KVC__RESPONSE__BODY_EXTENT);
			CHECK_EQ(resp->extent->len, MiB);
		} else
			CHECK_EQ(resp->body_case, KVC__RESPONSE__BODY_EXISTS);
		kvc__response__free_unpacked(resp, NULL);
		free(p);
	}
	close(sock); /* gives the view back */
	CHECK_EQ(kvc_get(c, "sock/a", buf, sizeof(buf)), MiB);
	CHECK(test_verify(buf, sizeof(buf), 5));
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

int main(int argc, char **argv)
{
	struct io_uring_params p = { 0 };
	int fd = (int) syscall(__NR_io_uring_setup, 4, &p);
	bool faults = argc > 1 && !strcmp(argv[1], "faults");
	int ret = 0;

	if (fd < 0) {
		printf("io_uring is not available here (%s): the disk tier cannot run\n",
		       strerror(errno));
		return EXIT_SKIP;
	}
	close(fd);
	snprintf(base, sizeof(base), "/var/tmp/kvc-disk-XXXXXX");
	CHECK(mkdtemp(base));
	if (!faults) {
		test_round_trip("none");
		test_round_trip("zstd");
		test_crash();
		test_corruption();
		test_socket_acquire();
	} else if (geteuid() != 0 || !test_full_and_readonly()) {
		/* making a small or read-only filesystem needs mount(2) */
		ret = EXIT_SKIP;
	}
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
		CHECK(system(cmd) == 0);
	}
	return ret;
}
