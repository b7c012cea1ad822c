/* SPDX-License-Identifier: MIT */
/* The daemon as a process: one per socket, stale sockets replaced, flags
 * and config files, peer credentials, many clients, hugepage modes, clean
 * shutdown on SIGTERM and SIGINT. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"

static const char *bin;

/* Run kvcached to completion with argv; return its status and stderr. */
static int run_daemon(char *const argv[], char *out, size_t cap)
{
	char log[] = "/tmp/kvc-log-XXXXXX";
	int fd = mkstemp(log), st;
	ssize_t n;

	CHECK(fd >= 0);
	close(fd);
	st = test_wait(test_spawn(bin, argv, log));
	fd = open(log, O_RDONLY);
	n = read(fd, out, cap - 1);
	out[n > 0 ? n : 0] = '\0';
	close(fd);
	unlink(log);
	return st;
}

static void test_bad_flags(void)
{
	char out[4096];

	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--dram-size", "12parsecs", NULL }, out,
			    sizeof(out)), 2);
	CHECK(strstr(out, "--dram-size") && strstr(out, "12parsecs"));
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--global_segment_size", "-3", NULL }, out,
			    sizeof(out)), 2);
	CHECK(strstr(out, "--global_segment_size")); /* as the user spelled it */
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--hugepages", "sometimes", NULL }, out,
			    sizeof(out)), 2);
	CHECK(strstr(out, "--hugepages"));
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--no-such-flag", NULL }, out, sizeof(out)), 2);
	CHECK(strstr(out, "no-such-flag"));
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--config", "/nonexistent.json", NULL }, out,
			    sizeof(out)), 2);
	CHECK(strstr(out, "/nonexistent.json"));
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--socket", "/nonexistent-dir/x.sock",
					 "--dram-size", "4MB", NULL }, out, sizeof(out)), 1);
	CHECK(strstr(out, "/nonexistent-dir/x.sock"));
}

static void test_version_help(void)
{
	char out[4096];
	int p[2];
	pid_t pid;
	ssize_t n;

	CHECK(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		execl(bin, "kvcached", "--version", (char *) NULL);
		_exit(127);
	}
	close(p[1]);
	n = read(p[0], out, sizeof(out) - 1);
	out[n > 0 ? n : 0] = '\0';
	close(p[0]);
	CHECK_EQ(test_wait(pid), 0);
	CHECK(strstr(out, "kvcached ") && strstr(out, "protocol 1.") && strstr(out, "shm-layout 1"));
}

static void test_one_daemon_per_socket(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	char out[4096];

	test_daemon_start(&td, "--dram-size", "8MB", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_put(c, "mine", "1", 1, NULL), 0);
	/* a second daemon refuses and leaves the first alone */
	CHECK_EQ(run_daemon((char *[]) { "kvcached", "--socket", td.socket, "--dram-size", "8MB", NULL },
			    out, sizeof(out)), 1);
	CHECK(strstr(out, "already serving"));
	CHECK_EQ(kvc_exists(c, "mine"), 1);
	kvc_disconnect(c);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_exists(c, "mine"), 1);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

static void test_stale_socket(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct test_daemon td;
	char dir[] = "/tmp/kvc-stale-XXXXXX", path[100];
	struct kvc_client *c;
	pid_t pid;
	int fd;

	CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/kvcached.sock", dir);
	/* a crashed daemon's socket: bound, nobody listening */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	CHECK(bind(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
	close(fd);
	CHECK(!test_socket_ready(path));

	pid = test_spawn(bin, (char *[]) { "kvcached", "--socket", path, "--dram-size", "8MB", NULL },
			 NULL);
	for (int i = 0; i < 500 && !test_socket_ready(path); i++)
		usleep(10000);
	CHECK_EQ(kvc_connect(path, &c), 0);
	kvc_disconnect(c);

	/* a daemon that was SIGKILLed leaves its socket; the next one starts */
	kill(pid, SIGKILL);
	CHECK_EQ(test_wait(pid), 128 + SIGKILL);
	CHECK(access(path, F_OK) == 0);
	strcpy(td.dir, dir);
	strcpy(td.socket, path);
	td.pid = test_spawn(bin, (char *[]) { "kvcached", "--socket", path, "--dram-size", "8MB", NULL },
			    NULL);
	for (int i = 0; i < 500 && !test_socket_ready(path); i++)
		usleep(10000);
	CHECK_EQ(kvc_connect(path, &c), 0);
	kvc_disconnect(c);
	test_daemon_stop(&td);

	/* a regular file at the path is never replaced */
	CHECK(mkdir(dir, 0700) == 0); /* test_daemon_stop() removed it */
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	close(fd);
	{
		char out[4096];

		CHECK_EQ(run_daemon((char *[]) { "kvcached", "--socket", path, "--dram-size", "8MB",
						 NULL }, out, sizeof(out)), 1);
		CHECK(strstr(out, "not a socket"));
	}
	unlink(path);
	rmdir(dir);
}

static void test_sigint_and_mode(void)
{
	struct test_daemon td;
	struct stat st;

	test_daemon_start(&td, "--dram-size", "8MB", NULL);
	CHECK(stat(td.socket, &st) == 0);
	CHECK_EQ(st.st_mode & 0777, 0660);
	CHECK(kill(td.pid, SIGINT) == 0);
	CHECK_EQ(test_wait(td.pid), 0);
	CHECK(access(td.socket, F_OK) < 0);
	rmdir(td.dir);
}

static void test_config_file(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_status *s;
	char path[] = "/tmp/kvc-mooncake-XXXXXX";
	const char *json = "{\"local_hostname\": \"127.0.0.1\", \"metadata_server\": \"P2PHANDSHAKE\","
			   " \"protocol\": \"tcp\", \"device_name\": \"\","
			   " \"master_server_address\": \"127.0.0.1:50051\","
			   " \"global_segment_size\": \"24MB\"}";
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	CHECK_EQ(write(fd, json, strlen(json)), (ssize_t) strlen(json));
	close(fd);
	setenv("MOONCAKE_CONFIG_PATH", path, 1);
	/* a port of its own for peers: tests run side by side */
	test_daemon_start(&td, "--listen", "127.0.0.1:0", NULL);
	unsetenv("MOONCAKE_CONFIG_PATH");
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_status_get(c, &s), 0);
	CHECK_EQ(s->tiers[0].capacity, 24 << 20);
	kvc_status_free(s);
	kvc_disconnect(c);
	test_daemon_stop(&td);

	/* --config wins over the environment, flags win over --config */
	test_daemon_start(&td, "--config", path, "--global-segment-size", "16MB", "--listen",
			  "127.0.0.1:0", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_status_get(c, &s), 0);
	CHECK_EQ(s->tiers[0].capacity, 16 << 20);
	kvc_status_free(s);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	unlink(path);
}

static void test_many_clients(void)
{
	struct test_daemon td;
	struct kvc_client *c[64];
	struct kvc_status *s;
	char key[32];

	test_daemon_start(&td, "--dram-size", "8MB", NULL);
	for (int i = 0; i < 64; i++) {
		CHECK_EQ(kvc_connect(td.socket, &c[i]), 0);
		snprintf(key, sizeof(key), "c%d", i);
		CHECK_EQ(kvc_put(c[i], key, key, strlen(key), NULL), 0);
	}
	for (int i = 0; i < 64; i++) {
		char buf[32] = "";

		snprintf(key, sizeof(key), "c%d", 63 - i);
		CHECK_EQ(kvc_get(c[i], key, buf, sizeof(buf)), (ssize_t) strlen(key));
		CHECK(strcmp(buf, key) == 0);
	}
	CHECK_EQ(kvc_status_get(c[0], &s), 0);
	CHECK_EQ(s->clients, 64);
	CHECK_EQ(s->objects, 64);
	kvc_status_free(s);
	for (int i = 0; i < 64; i++)
		kvc_disconnect(c[i]);
	test_daemon_stop(&td);
}

static void test_peer_credentials(void)
{
	struct test_daemon td;
	pid_t pid;

	if (geteuid() != 0) {
		printf("peer credential check needs root to switch uid; not run\n");
		return;
	}
	test_daemon_start(&td, "--dram-size", "8MB", NULL);
	/* the mode keeps strangers out at connect() */
	pid = fork();
	if (pid == 0) {
		struct kvc_client *c;

		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		_exit(kvc_connect(td.socket, &c) == -EACCES ? 0 : 1);
	}
	CHECK_EQ(test_wait(pid), 0);
	/* loosened by hand: the credential check still refuses them */
	CHECK(chmod(td.socket, 0666) == 0 && chmod(td.dir, 0755) == 0);
	pid = fork();
	if (pid == 0) {
		struct kvc_client *c;
		int r;

		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		r = kvc_connect(td.socket, &c);
		_exit(r == -EACCES && strstr(kvc_last_error_msg(), "uid 65534") ? 0 : 1);
	}
	CHECK_EQ(test_wait(pid), 0);
	test_daemon_stop(&td);
}

static long hugepages_free(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "HugePages_Free: %ld", &n) == 1)
			break;
	fclose(f);
	return n;
}

static void test_hugepages(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_status *s;
	char out[4096];
	/* 8 MiB of data + header = 5 pages of 2 MiB */
	bool have = hugepages_free() >= 5;

	if (have) {
		test_daemon_start(&td, "--dram-size", "8MB", "--hugepages", "on", NULL);
		CHECK_EQ(kvc_connect(td.socket, &c), 0);
		CHECK_EQ(kvc_status_get(c, &s), 0);
		CHECK(s->hugepages);
		kvc_status_free(s);
		CHECK_EQ(kvc_put(c, "h", "x", 1, NULL), 0);
		kvc_disconnect(c);
		test_daemon_stop(&td);
		printf("hugepages: on works with %ld free\n", hugepages_free());
	} else {
		char dir[] = "/tmp/kvc-hp-XXXXXX", path[100];

		CHECK(mkdtemp(dir));
		snprintf(path, sizeof(path), "%s/s.sock", dir);
		CHECK_EQ(run_daemon((char *[]) { "kvcached", "--socket", path, "--dram-size", "8MB",
						 "--hugepages", "on", NULL }, out, sizeof(out)), 1);
		CHECK(strstr(out, "hugepages=on"));
		CHECK(access(path, F_OK) < 0);
		rmdir(dir);
		printf("hugepages: none free, --hugepages on refused as it should\n");
	}
	/* auto always starts; without hugepages it says so */
	{
		char dir[] = "/tmp/kvc-hp-XXXXXX", path[100], log[128];
		pid_t pid;
		int fd;
		ssize_t n;

		CHECK(mkdtemp(dir));
		snprintf(path, sizeof(path), "%s/s.sock", dir);
		snprintf(log, sizeof(log), "%s/log", dir);
		pid = test_spawn(bin, (char *[]) { "kvcached", "--socket", path, "--dram-size", "8MB",
						   "--hugepages", "auto", NULL }, log);
		for (int i = 0; i < 500 && !test_socket_ready(path); i++)
			usleep(10000);
		CHECK_EQ(kvc_connect(path, &c), 0);
		CHECK_EQ(kvc_status_get(c, &s), 0);
		CHECK_EQ(s->hugepages, have);
		kvc_status_free(s);
		kvc_disconnect(c);
		kill(pid, SIGTERM);
		CHECK_EQ(test_wait(pid), 0);
		fd = open(log, O_RDONLY);
		n = read(fd, out, sizeof(out) - 1);
		out[n > 0 ? n : 0] = '\0';
		close(fd);
		if (!have)
			CHECK(strstr(out, "4 KiB pages") && strstr(out, "warn"));
		unlink(log);
		rmdir(dir);
	}
}

/* Resident bytes in /proc/PID/smaps of the mapping that starts at base,
 * or (name) of every mapping whose line names it; 0: none. */
static uint64_t smaps_rss(pid_t pid, uintptr_t base, const char *name)
{
	char path[64], line[512];
	uint64_t rss = 0;
	bool in = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int) pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, kb;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = name ? strstr(line, name) != NULL : lo == base;
		else if (in && sscanf(line, "Rss: %lu kB", &kb) == 1)
			rss += (uint64_t) kb << 10;
	}
	fclose(f);
	return rss;
}

static uint64_t mapping_rss(pid_t pid, uintptr_t base)
{
	return smaps_rss(pid, base, NULL);
}

static uint64_t named_rss(pid_t pid, const char *name)
{
	return smaps_rss(pid, 0, name);
}

/* Resident shared memory of a process (RssShmem), in bytes. */
static uint64_t rss_shmem(pid_t pid)
{
	char path[64], line[256];
	unsigned long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssShmem: %lu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t) kb << 10;
}

/* Page faults this thread has taken. */
static long thread_faults(void)
{
	struct rusage ru;

	getrusage(RUSAGE_THREAD, &ru);
	return ru.ru_minflt + ru.ru_majflt;
}

/* A put's copy into memory the client has not mapped yet maps it in first
 * with one call, not a write fault per 4 KiB page on the way: a 4 MiB put
 * of a fresh client (no warming) into a tier the daemon has faulted in
 * takes far fewer faults than its 1024 pages; another client reads the
 * bytes back. */
static void test_copies_map_ahead(void)
{
	struct test_daemon td;
	struct kvc_client *c, *c2;
	size_t len = 4u << 20;
	uint8_t *src, *dst;
	long f0, put_faults, get_faults;
	void *probe;
	bool populate;

	/* kernels before 5.14 have no MADV_POPULATE_READ: nothing to check */
	probe = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(probe != MAP_FAILED);
	populate = madvise(probe, 4096, 22 /* MADV_POPULATE_READ */) == 0;
	munmap(probe, 4096);
	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off", NULL);
	setenv("KVCACHE_WARM", "0", 1);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	unsetenv("KVCACHE_WARM");
	/* pages the daemon has not faulted in yet are made one at a time by
	 * whoever touches them first (a put into them faults per page) */
	{
		struct kvc_segment seg[8];
		uint64_t total = 0;
		int n = kvc_segments(c, seg, 8), i;

		CHECK(n >= 1);
		for (int s = 0; s < n; s++)
			total += seg[s].len;
		for (i = 0; i < 2000 && test_counter(c, "prefaulted_bytes") < total; i++)
			usleep(10000);
		CHECK_EQ(test_counter(c, "prefaulted_bytes"), total);
	}
	/* the copies' own memory, written after the daemon was forked (a
	 * page written before is copy-on-write until written again) */
	src = malloc(len);
	dst = malloc(len);
	CHECK(src && dst);
	memset(src, 0x3c, len);
	memset(dst, 0x11, len); /* not 0, which a compiler may turn into calloc() */
	f0 = thread_faults();
	CHECK_EQ(kvc_put(c, "ahead", src, len, NULL), 0);
	put_faults = thread_faults() - f0;
	/* read back by another client (a read fault maps 16 pages at once) */
	setenv("KVCACHE_WARM", "0", 1);
	CHECK_EQ(kvc_connect(td.socket, &c2), 0);
	unsetenv("KVCACHE_WARM");
	f0 = thread_faults();
	CHECK_EQ(kvc_get(c2, "ahead", dst, len), (ssize_t) len);
	get_faults = thread_faults() - f0;
	CHECK(memcmp(src, dst, len) == 0);
	printf("  4 MiB put into pages not mapped yet: %ld faults; get by another client: %ld%s\n",
	       put_faults, get_faults, populate ? "" : " (no MADV_POPULATE_READ here)");
	if (populate)
		CHECK(put_faults < 256);
	kvc_disconnect(c2);
	kvc_disconnect(c);
	test_daemon_stop(&td);
	free(src);
	free(dst);
}

/* A client's warming waits while the client waits for something: an
 * operation submitted and not reaped holds it back (at most the slice it
 * was touching goes on); reaped, it warms every page. */
static void test_warm_waits_for_a_quiet_client(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_segment seg[8];
	struct kvc_completion done;
	struct kvc_op op = { .opcode = KVC_OP_EXISTS, .key = "warm/nothing", .user_data = 7 };
	uint64_t total = 0, w0, w1;
	int n, i;

	test_daemon_start(&td, "--dram-size", "1GiB", "--hugepages", "off", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	CHECK_EQ(kvc_submit(c, &op, 1), 1);
	w0 = kvc_warmed_bytes(c);
	usleep(300 * 1000);
	w1 = kvc_warmed_bytes(c);
	CHECK(w1 - w0 <= (2u << 20));
	CHECK(w1 < (1ull << 30));
	CHECK_EQ(kvc_wait(c, &done, 1, 1, 5000), 1);
	CHECK_EQ(done.user_data, 7);
	CHECK_EQ(done.res, 0);
	n = kvc_segments(c, seg, 8);
	for (int s = 0; s < n; s++)
		total += seg[s].len;
	for (i = 0; i < 3000 && kvc_warmed_bytes(c) < total; i++)
		usleep(10000);
	CHECK_EQ(kvc_warmed_bytes(c), total);
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

/* The daemon faults its tiers in at start (4 KiB pages too), and a client
 * touches its mappings of them on a thread of its own: both pay the first
 * touch of each page ahead of the data path.  --prefault off and
 * KVCACHE_WARM=0 leave the memory untouched. */
static void test_warm_memory(void)
{
	struct test_daemon td;
	struct kvc_client *c;
	struct kvc_segment seg[8];
	uint64_t want = 64u << 20, total = 0;
	int n, i;

	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off", NULL);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	n = kvc_segments(c, seg, 8); /* the tiers, each with its header page */
	CHECK(n >= 1 && n <= 8);
	for (int s = 0; s < n; s++)
		total += seg[s].len;
	CHECK(total > want);
	for (i = 0; i < 2000 && test_counter(c, "prefaulted_bytes") < total; i++)
		usleep(10000);
	CHECK_EQ(test_counter(c, "prefaulted_bytes"), total);
	/* and the start of the catalog, where the loop writes an entry at
	 * every commit: a 128th of the tiers (the catalog has a 16th) */
	CHECK_EQ(test_counter(c, "catalog_prefaulted_bytes"), total / 128);
	/* every page of the tier is there, and of the catalog's start */
	CHECK(rss_shmem(td.pid) >= total + total / 128);
	for (i = 0; i < 2000 && kvc_warmed_bytes(c) < total; i++)
		usleep(10000);
	CHECK_EQ(kvc_warmed_bytes(c), total);
	/* this process maps every page of every segment now */
	for (int s = 0; s < n; s++)
		CHECK_EQ(mapping_rss(getpid(), (uintptr_t) seg[s].base), seg[s].len);
	/* a registered buffer: the daemon writes each page of its mapping once,
	 * as soon as it is made (a buffer given back meanwhile stops that) */
	{
		struct kvc_buffer b, gone;

		CHECK_EQ(kvc_buffer_alloc(c, 32u << 20, &b), 0);
		CHECK_EQ(kvc_buffer_alloc(c, 256u << 20, &gone), 0);
		CHECK_EQ(kvc_buffer_free(c, &gone), 0);
		for (i = 0; i < 2000 && named_rss(td.pid, "kvcache-buffer") != (32u << 20); i++)
			usleep(10000);
		CHECK_EQ(named_rss(td.pid, "kvcache-buffer"), 32u << 20);
		/* the counter says how far: all of b, and what went of gone */
		for (i = 0; i < 2000 && test_counter(c, "buffer_prefaulted_bytes") < (32u << 20); i++)
			usleep(10000);
		CHECK(test_counter(c, "buffer_prefaulted_bytes") >= (32u << 20));
		CHECK(test_counter(c, "buffer_prefaulted_bytes") <= (288u << 20));
		CHECK_EQ(kvc_buffer_free(c, &b), 0);
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);

	test_daemon_start(&td, "--dram-size", "64MB", "--hugepages", "off", "--prefault", "off", NULL);
	setenv("KVCACHE_WARM", "0", 1);
	CHECK_EQ(kvc_connect(td.socket, &c), 0);
	unsetenv("KVCACHE_WARM");
	usleep(200 * 1000);
	CHECK_EQ(test_counter(c, "prefaulted_bytes"), 0);
	CHECK_EQ(test_counter(c, "catalog_prefaulted_bytes"), 0);
	CHECK_EQ(kvc_warmed_bytes(c), 0);
	CHECK(rss_shmem(td.pid) < want / 2);
	n = kvc_segments(c, seg, 8);
	CHECK(mapping_rss(getpid(), (uintptr_t) seg[0].base) < seg[0].len / 2);
	{
		struct kvc_buffer b;

		CHECK_EQ(kvc_buffer_alloc(c, 32u << 20, &b), 0);
		usleep(200 * 1000);
		CHECK(named_rss(td.pid, "kvcache-buffer") < (16u << 20));
		CHECK_EQ(test_counter(c, "buffer_prefaulted_bytes"), 0);
		CHECK_EQ(kvc_buffer_free(c, &b), 0);
	}
	kvc_disconnect(c);
	test_daemon_stop(&td);
}

int main(void)
{
	bin = getenv("KVCACHED");
	CHECK(bin);
	test_bad_flags();
	test_version_help();
	test_one_daemon_per_socket();
	test_stale_socket();
	test_sigint_and_mode();
	test_config_file();
	test_many_clients();
	test_peer_credentials();
	test_hugepages();
	test_warm_memory();
	test_warm_waits_for_a_quiet_client();
	test_copies_map_ahead();
	return 0;
}
