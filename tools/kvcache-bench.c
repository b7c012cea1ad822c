/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench — figures and ratios measured in one run on this machine.
 *
 *   kvcache-bench local [--sizes 4K,64K,1M,4M,16M]
 *                       [--ops exists,get,put,acquire,prefix64,batch64]
 *                       [--duration S] [--json] [--peers] [--socket PATH]
 *
 * Each op and size runs for --duration seconds on one thread against a
 * kvcached (a private one unless --socket names a running daemon) and prints
 * ops/s, GB/s, p50/p99/p999 latency and system calls per operation on each
 * side (counted with the raw_syscalls:sys_enter tracepoint).  Beside it, the
 * single-thread memcpy bandwidth of the same size on the same buffers, and the
 * ratio.  --peers runs the same get/put/exists against memcached (meta
 * protocol) and Redis, each started here on a Unix socket, and prints the
 * speed-up.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <liburing.h>
#include <zstd.h>
#include <time.h>
#include <unistd.h>

#include "kvc-config.h"
#include <kvcache/kvcache.h>

#define MAX_SAMPLES 4000000
#define MAX_SIZES 16

static double arg_duration = 1.0;
static bool arg_json, arg_peers, arg_zstd;
static const char *arg_dir;
static const char *arg_socket, *arg_kvcached, *arg_ops = "exists,get,put,acquire,prefix64,batch64";
static uint64_t arg_sizes[MAX_SIZES] = { 4096, 65536, 1 << 20, 4 << 20, 16 << 20 };
static size_t n_sizes = 5;

static uint64_t *lat;
static pid_t daemon_pid;
static char tmpdir[64];

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000 + (uint64_t) ts.tv_nsec;
}

/* Stop the private daemon, if this run started one. */
static void stop_daemon(void)
{
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
	}
	daemon_pid = 0;
}

static void die(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void die(int err, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvcache-bench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (err)
		fprintf(stderr, ": %s", kvc_strerror(err));
	fprintf(stderr, "\n");
	stop_daemon();
	exit(1);
}

/* ---- system call counting ---- */

static int tracepoint_id(void)
{
	static const char *paths[] = {
		"/sys/kernel/tracing/events/raw_syscalls/sys_enter/id",
		"/sys/kernel/debug/tracing/events/raw_syscalls/sys_enter/id",
	};
	char buf[32];

	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < 2; i++) {
			int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
			ssize_t n;

			if (fd < 0)
				continue;
			n = read(fd, buf, sizeof(buf) - 1);
			close(fd);
			if (n > 0) {
				buf[n] = '\0';
				return atoi(buf);
			}
		}
		/* tracefs is often just not mounted */
		if (pass == 0 && geteuid() == 0)
			mount("nodev", "/sys/kernel/tracing", "tracefs", 0, NULL);
	}
	return -1;
}

static int counter_open(pid_t pid)
{
	static int id = -2;
	struct perf_event_attr a;

	if (id == -2)
		id = tracepoint_id();
	if (id < 0)
		return -1;
	memset(&a, 0, sizeof(a));
	a.type = PERF_TYPE_TRACEPOINT;
	a.size = sizeof(a);
	a.config = (uint64_t) id;
	a.disabled = 1;
	a.inherit = 1;
	return (int) syscall(SYS_perf_event_open, &a, pid, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

/* One counter for the bench, one per thread of the server (threads that
 * exist before a counter is opened are not inherited, so each gets its own). */
#define MAX_THREADS 64

struct counters {
	int self;
	int server[MAX_THREADS];
	int n_server;
};

static void counters_init(struct counters *c, pid_t server)
{
	char path[64];
	DIR *d;
	struct dirent *e;

	c->self = counter_open(0);
	c->n_server = 0;
	if (server <= 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/task", (int) server);
	d = opendir(path);
	if (!d)
		return;
	while ((e = readdir(d)) && c->n_server < MAX_THREADS) {
		int fd;

		if (e->d_name[0] == '.')
			continue;
		fd = counter_open((pid_t) atoi(e->d_name));
		if (fd >= 0)
			c->server[c->n_server++] = fd;
	}
	closedir(d);
}

static void counters_done(struct counters *c)
{
	if (c->self >= 0)
		close(c->self);
	for (int i = 0; i < c->n_server; i++)
		close(c->server[i]);
}

static void counters_start(struct counters *c)
{
	if (c->self >= 0) {
		ioctl(c->self, PERF_EVENT_IOC_RESET, 0);
		ioctl(c->self, PERF_EVENT_IOC_ENABLE, 0);
	}
	for (int i = 0; i < c->n_server; i++) {
		ioctl(c->server[i], PERF_EVENT_IOC_RESET, 0);
		ioctl(c->server[i], PERF_EVENT_IOC_ENABLE, 0);
	}
}

static void counters_stop(struct counters *c, int64_t *self, int64_t *server)
{
	uint64_t v;

	*self = *server = -1;
	if (c->self >= 0) {
		ioctl(c->self, PERF_EVENT_IOC_DISABLE, 0);
		if (read(c->self, &v, sizeof(v)) == sizeof(v))
			*self = (int64_t) v - 1; /* the disable ioctl itself */
	}
	for (int i = 0; i < c->n_server; i++) {
		ioctl(c->server[i], PERF_EVENT_IOC_DISABLE, 0);
		if (read(c->server[i], &v, sizeof(v)) == sizeof(v))
			*server = (*server < 0 ? 0 : *server) + (int64_t) v;
	}
}

/* ---- results ---- */

struct result {
	const char *op;
	uint64_t size;      /* 0: not size-bound */
	uint64_t n;
	double secs;
	double p50, p99, p999; /* microseconds */
	double sys_client, sys_daemon; /* per op, < 0 unknown */
	double memcpy_gbs;  /* 0: not a copy */
	unsigned keys_per_op;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

	return x < y ? -1 : x > y;
}

static double pct(uint64_t n, double p)
{
	size_t i = (size_t) (p * (double) (n - 1));

	return (double) lat[i] / 1000.0;
}

static void finish(struct result *r, uint64_t n, uint64_t t0, uint64_t t1, int64_t sc, int64_t sd)
{
	r->n = n;
	r->secs = (double) (t1 - t0) / 1e9;
	qsort(lat, n, sizeof(lat[0]), cmp_u64);
	r->p50 = pct(n, 0.50);
	r->p99 = pct(n, 0.99);
	r->p999 = pct(n, 0.999);
	r->sys_client = sc < 0 ? -1 : (double) sc / (double) n;
	r->sys_daemon = sd < 0 ? -1 : (double) sd / (double) n;
}

static double ops_s(const struct result *r)
{
	return (double) r->n / r->secs;
}

static double gb_s(const struct result *r)
{
	return ops_s(r) * (double) r->size / 1e9;
}

/*
 * Single-thread memcpy bandwidth on the same buffers kvcache copies between:
 * for get, from each stored object in the pool into the bench's buffer; for
 * put, from the bench's buffer into pool space of the same sizes.  Cycling
 * through the same regions keeps caches out of one side's favour.
 */
static double memcpy_cycle(uint8_t *const *dsts, const uint8_t *const *srcs, size_t n,
			   uint64_t size)
{
	uint64_t t0, bytes = 0, budget = (uint64_t) (arg_duration * 0.3e9) + 1;

	for (size_t i = 0; i < n; i++) /* warm, as the measured run is */
		memcpy(dsts[i % n], srcs[i % n], size);
	t0 = now_ns();
	for (size_t i = 0; now_ns() - t0 < budget || bytes < 3 * size; i++) {
		memcpy(dsts[i % n], srcs[i % n], size);
		__asm__ __volatile__("" ::: "memory");
		bytes += size;
	}
	return (double) bytes / (double) (now_ns() - t0);
}

/* ---- the kvcache workloads ---- */

/* Run `body(i)` timed until the duration passes or the sample array fills. */
#define TIMED_LOOP(res, counters, body)                                         \
	do {                                                                    \
		uint64_t _end, _t0, _n = 0, i;                                  \
		int64_t _sc, _sd;                                               \
		for (i = 0; i < 200; i++) { body; } /* warm-up */              \
		counters_start(counters);                                       \
		_t0 = now_ns();                                                 \
		_end = _t0 + (uint64_t) (arg_duration * 1e9);                   \
		for (;; i++) {                                                  \
			uint64_t _a = now_ns(), _b;                             \
			body;                                                   \
			_b = now_ns();                                          \
			lat[_n++] = _b - _a;                                    \
			if (_b >= _end || _n == MAX_SAMPLES)                    \
				break;                                          \
		}                                                               \
		counters_stop(counters, &_sc, &_sd);                            \
		finish(res, _n, _t0, now_ns(), _sc, _sd);                       \
	} while (0)

static void check(int r, const char *what)
{
	if (r < 0)
		die(r, "%s failed", what);
}

static void bench_exists(struct kvc_client *c, struct counters *k, struct result *r)
{
	check(kvc_put(c, "bench/exists", "x", 1, NULL), "put");
	*r = (struct result) { .op = "exists" };
	TIMED_LOOP(r, k, if (kvc_exists(c, "bench/exists") != 1) die(0, "%s", "exists missed"));
	kvc_remove(c, "bench/exists");
}

static void make_key(char *buf, size_t len, const char *what, uint64_t size, uint64_t i)
{
	snprintf(buf, len, "bench/%s/%" PRIu64 "@tp_rank:0@%016" PRIx64 "%016" PRIx64, what, size, i,
		 (uint64_t) (i * UINT64_C(0x9e3779b97f4a7c15)));
}

static uint64_t window_for(uint64_t size)
{
	uint64_t w = (256ull << 20) / size;

	return w < 4 ? 4 : w > 64 ? 64 : w;
}

static void bench_put(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
		      uint8_t *src)
{
	/* Overwrite a rolling set of keys (KVC_PUT_REPLACE): the pool holds
	 * at most window + 1 values and every put is one put. */
	struct kvc_put_opts replace = { .flags = KVC_PUT_REPLACE };
	uint64_t window = window_for(size);
	struct kvc_buf bufs[64];
	uint8_t *dsts[64];
	const uint8_t *srcs[64];
	char key[128];

	/* the baseline: memcpy into pool space of this size */
	for (uint64_t i = 0; i < window; i++) {
		make_key(key, sizeof(key), "base", size, i);
		check(kvc_reserve(c, key, size, NULL, &bufs[i]), "reserve");
		dsts[i] = bufs[i].data;
		srcs[i] = src;
	}
	*r = (struct result) { .op = "put", .size = size };
	r->memcpy_gbs = memcpy_cycle(dsts, srcs, window, size);
	for (uint64_t i = 0; i < window; i++)
		kvc_abort(c, &bufs[i]);

	TIMED_LOOP(r, k, {
		make_key(key, sizeof(key), "put", size, i % window);
		check(kvc_put(c, key, src, size, &replace), "put");
	});
	for (uint64_t i = 0; i < window; i++) {
		make_key(key, sizeof(key), "put", size, i);
		kvc_remove(c, key);
	}
}

static void bench_get(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
		      uint8_t *src, uint8_t *dst, bool acquire)
{
	uint64_t n_keys = (512ull << 20) / size;
	char keys[64][128];

	if (n_keys > 64)
		n_keys = 64;
	if (n_keys < 2)
		n_keys = 2;
	for (uint64_t i = 0; i < n_keys; i++) {
		make_key(keys[i], sizeof(keys[i]), "get", size, i);
		check(kvc_put(c, keys[i], src, size, NULL), "put");
	}
	*r = (struct result) { .op = acquire ? "acquire" : "get", .size = size };
	if (!acquire) {
		/* the baseline: memcpy from the stored objects themselves */
		struct kvc_view views[64];
		uint8_t *dsts[64];
		const uint8_t *srcs[64];

		for (uint64_t i = 0; i < n_keys; i++) {
			check(kvc_acquire(c, keys[i], &views[i]), "acquire");
			srcs[i] = views[i].data;
			dsts[i] = dst;
		}
		r->memcpy_gbs = memcpy_cycle(dsts, srcs, n_keys, size);
		for (uint64_t i = 0; i < n_keys; i++)
			kvc_release(c, &views[i]);
	}
	if (acquire) {
		TIMED_LOOP(r, k, {
			struct kvc_view v;

			check(kvc_acquire(c, keys[i % n_keys], &v), "acquire");
			check(kvc_release(c, &v), "release");
		});
	} else {
		TIMED_LOOP(r, k, {
			if (kvc_get(c, keys[i % n_keys], dst, size) != (ssize_t) size)
				die(0, "%s", "get returned a wrong length");
		});
		if (memcmp(dst, src, size) != 0)
			die(0, "%s", "get returned wrong bytes");
	}
	for (uint64_t i = 0; i < n_keys; i++)
		kvc_remove(c, keys[i]);
}

static void bench_keys(struct kvc_client *c, struct counters *k, struct result *r, bool prefix)
{
	char names[64][128];
	const char *keys[64];
	uint8_t present[64];

	for (int i = 0; i < 64; i++) {
		make_key(names[i], sizeof(names[i]), prefix ? "prefix" : "batch", 0, (uint64_t) i);
		keys[i] = names[i];
		check(kvc_put(c, keys[i], "kv", 2, NULL), "put");
	}
	*r = (struct result) { .op = prefix ? "prefix64" : "batch64", .keys_per_op = 64 };
	if (prefix)
		TIMED_LOOP(r, k, if (kvc_prefix_lookup(c, keys, 64) != 64) die(0, "%s", "prefix miss"));
	else
		TIMED_LOOP(r, k, if (kvc_batch_exists(c, keys, 64, present) != 64) die(0, "%s", "miss"));
	for (int i = 0; i < 64; i++)
		kvc_remove(c, keys[i]);
}

/* ---- peers: memcached (meta protocol) and Redis, over Unix sockets ---- */

struct peer {
	const char *name;
	char sock[100];
	pid_t pid;
	int fd;
	uint8_t *rbuf;
	size_t rlen, rcap, roff;
};

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool peer_start(struct peer *p, char *const argv[])
{
	p->pid = fork();
	if (p->pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		dup2(devnull, 1);
		dup2(devnull, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	for (int i = 0; i < 300; i++) {
		int st;

		p->fd = unix_connect(p->sock);
		if (p->fd >= 0)
			break;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return false;
		}
		usleep(10000);
	}
	if (p->fd < 0)
		return false;
	p->rcap = (32u << 20) + 4096;
	p->rbuf = malloc(p->rcap);
	return p->rbuf != NULL;
}

static void peer_stop(struct peer *p)
{
	if (p->fd >= 0)
		close(p->fd);
	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, NULL, 0);
	}
	free(p->rbuf);
}

static void send_all(struct peer *p, struct iovec *iov, int n)
{
	while (n > 0) {
		ssize_t w = writev(p->fd, iov, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			die(0, "%s: write failed", p->name);
		}
		while (n > 0 && (size_t) w >= iov->iov_len) {
			w -= (ssize_t) iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (uint8_t *) iov->iov_base + w;
			iov->iov_len -= (size_t) w;
		}
	}
}

/* Make at least `need` buffered bytes available from roff. */
static void fill(struct peer *p, size_t need)
{
	if (p->roff && p->rlen - p->roff < need) {
		memmove(p->rbuf, p->rbuf + p->roff, p->rlen - p->roff);
		p->rlen -= p->roff;
		p->roff = 0;
	}
	while (p->rlen - p->roff < need) {
		ssize_t n = read(p->fd, p->rbuf + p->rlen, p->rcap - p->rlen);

		if (n <= 0)
			die(0, "%s: connection lost", p->name);
		p->rlen += (size_t) n;
	}
}

/* A CRLF-terminated line, returned NUL-terminated (without CRLF). */
static char *read_line(struct peer *p)
{
	for (size_t scan = 0;; ) {
		char *e;

		fill(p, scan + 1);
		e = memchr(p->rbuf + p->roff + scan, '\n', p->rlen - p->roff - scan);
		if (e) {
			char *line = (char *) p->rbuf + p->roff;

			*e = '\0';
			if (e > line && e[-1] == '\r')
				e[-1] = '\0';
			p->roff = (size_t) ((uint8_t *) e - p->rbuf) + 1;
			return line;
		}
		scan = p->rlen - p->roff;
	}
}

static void read_data(struct peer *p, void *dst, size_t len)
{
	fill(p, len + 2);
	memcpy(dst, p->rbuf + p->roff, len);
	p->roff += len + 2;
	if (p->roff == p->rlen)
		p->roff = p->rlen = 0;
}

enum peer_op { P_PUT, P_GET, P_EXISTS };

static void mc_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len,
		  void *dst)
{
	char hdr[256];
	struct iovec iov[3];
	char *l;
	int n;

	if (op == P_PUT) {
		n = snprintf(hdr, sizeof(hdr), "ms %s %zu T0\r\n", key, len);
		iov[0] = (struct iovec) { hdr, (size_t) n };
		iov[1] = (struct iovec) { (void *) val, len };
		iov[2] = (struct iovec) { (void *) "\r\n", 2 };
		send_all(p, iov, 3);
		l = read_line(p);
		if (strncmp(l, "HD", 2) != 0)
			die(0, "memcached: ms answered %s", l);
		return;
	}
	n = snprintf(hdr, sizeof(hdr), "mg %s%s\r\n", key, op == P_GET ? " v" : "");
	iov[0] = (struct iovec) { hdr, (size_t) n };
	send_all(p, iov, 1);
	l = read_line(p);
	if (op == P_EXISTS) {
		if (strncmp(l, "HD", 2) != 0)
			die(0, "memcached: mg answered %s", l);
		return;
	}
	if (strncmp(l, "VA ", 3) != 0 || (size_t) atol(l + 3) != len)
		die(0, "memcached: mg answered %s", l);
	read_data(p, dst, len);
}

static void redis_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len,
		     void *dst)
{
	char hdr[512];
	struct iovec iov[3];
	size_t kl = strlen(key);
	char *l;
	int n;

	if (op == P_PUT) {
		n = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", kl, key, len);
		iov[0] = (struct iovec) { hdr, (size_t) n };
		iov[1] = (struct iovec) { (void *) val, len };
		iov[2] = (struct iovec) { (void *) "\r\n", 2 };
		send_all(p, iov, 3);
		l = read_line(p);
		if (strcmp(l, "+OK") != 0)
			die(0, "redis: SET answered %s", l);
		return;
	}
	n = snprintf(hdr, sizeof(hdr), "*2\r\n$%s\r\n%s\r\n$%zu\r\n%s\r\n", op == P_GET ? "3" : "6",
		     op == P_GET ? "GET" : "EXISTS", kl, key);
	iov[0] = (struct iovec) { hdr, (size_t) n };
	send_all(p, iov, 1);
	l = read_line(p);
	if (op == P_EXISTS) {
		if (strcmp(l, ":1") != 0)
			die(0, "redis: EXISTS answered %s", l);
		return;
	}
	if (l[0] != '$' || (size_t) atol(l + 1) != len)
		die(0, "redis: GET answered %s", l);
	read_data(p, dst, len);
}

typedef void (*peer_fn)(struct peer *, enum peer_op, const char *, const void *, size_t, void *);

static void bench_peer(struct peer *p, peer_fn fn, enum peer_op op, uint64_t size, uint8_t *src,
		       uint8_t *dst, struct counters *k, struct result *r)
{
	char key[128];
	uint64_t n_keys = 64;

	*r = (struct result) { .op = op == P_PUT ? "put" : op == P_GET ? "get" : "exists",
			       .size = op == P_EXISTS ? 0 : size };
	for (uint64_t i = 0; i < n_keys; i++) {
		make_key(key, sizeof(key), "peer", size, i);
		fn(p, P_PUT, key, src, op == P_EXISTS ? 1 : size, NULL);
	}
	if (op == P_PUT)
		TIMED_LOOP(r, k, {
			make_key(key, sizeof(key), "peer", size, i % n_keys);
			fn(p, P_PUT, key, src, size, NULL);
		});
	else
		TIMED_LOOP(r, k, {
			make_key(key, sizeof(key), "peer", size, i % n_keys);
			fn(p, op, key, NULL, op == P_EXISTS ? 1 : size, dst);
		});
}

/* ---- output ---- */

static void fmt_sys(char *buf, size_t len, double v)
{
	if (v < 0)
		snprintf(buf, len, "n/a");
	else
		snprintf(buf, len, "%.3f", v);
}

static void size_name(char *buf, size_t len, uint64_t s)
{
	if (s == 0)
		snprintf(buf, len, "-");
	else if (s % (1 << 20) == 0)
		snprintf(buf, len, "%" PRIu64 "M", s >> 20);
	else if (s % 1024 == 0)
		snprintf(buf, len, "%" PRIu64 "K", s >> 10);
	else
		snprintf(buf, len, "%" PRIu64, s);
}

static void print_header(void)
{
	printf("%-9s %5s %11s %8s %8s %8s %9s %8s %8s %8s %9s\n", "op", "size", "ops/s", "GB/s",
	       "p50 us", "p99 us", "p999 us", "sys/op c", "sys/op d", "memcpy", "vs memcpy");
}

static void print_result(const struct result *r)
{
	char sz[32], sc[16], sd[16], gb[16] = "-", mc[16] = "-", ratio[16] = "-";

	size_name(sz, sizeof(sz), r->size);
	fmt_sys(sc, sizeof(sc), r->sys_client);
	fmt_sys(sd, sizeof(sd), r->sys_daemon);
	if (r->memcpy_gbs > 0) {
		snprintf(gb, sizeof(gb), "%.2f", gb_s(r));
		snprintf(mc, sizeof(mc), "%.2f", r->memcpy_gbs);
		snprintf(ratio, sizeof(ratio), "%.0f%%", 100.0 * gb_s(r) / r->memcpy_gbs);
	}
	printf("%-9s %5s %11.0f %8s %8.2f %8.2f %9.2f %8s %8s %8s %9s", r->op, sz, ops_s(r), gb,
	       r->p50, r->p99, r->p999, sc, sd, mc, ratio);
	if (r->keys_per_op)
		printf("  (%.2fM keys/s)", ops_s(r) * r->keys_per_op / 1e6);
	printf("\n");
}

static void json_result(FILE *f, const struct result *r, const char *system, bool comma)
{
	fprintf(f, "    {\"system\": \"%s\", \"op\": \"%s\", \"size\": %" PRIu64 ", \"ops\": %" PRIu64
		   ", \"ops_per_s\": %.0f, \"gb_per_s\": %.3f, \"p50_us\": %.3f, \"p99_us\": %.3f,"
		   " \"p999_us\": %.3f, \"syscalls_per_op_client\": %.4f,"
		   " \"syscalls_per_op_daemon\": %.4f, \"memcpy_gb_per_s\": %.3f,"
		   " \"keys_per_op\": %u}%s\n",
		system, r->op, r->size, r->n, ops_s(r), r->memcpy_gbs > 0 ? gb_s(r) : 0.0, r->p50,
		r->p99, r->p999, r->sys_client, r->sys_daemon, r->memcpy_gbs, r->keys_per_op,
		comma ? "," : "");
}

/* ---- the private daemon ---- */

static const char *find_kvcached(char *buf, size_t len)
{
	char self[4096];
	ssize_t n;

	if (arg_kvcached)
		return arg_kvcached;
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			snprintf(buf, len, "%s/../daemon/kvcached", self);
			if (access(buf, X_OK) == 0)
				return buf;
			snprintf(buf, len, "%s/../sbin/kvcached", self);
			if (access(buf, X_OK) == 0)
				return buf;
		}
	}
	return "kvcached";
}

/* A private kvcached on a socket in tmpdir, with `extra` arguments
 * (NULL-terminated). */
static void start_daemon_args(char *sock, size_t len, const char *const *extra)
{
	char bin[4200];
	const char *path = find_kvcached(bin, sizeof(bin)), *argv[32];
	int n = 0;

	snprintf(sock, len, "%s/kvcached.sock", tmpdir);
	argv[n++] = "kvcached";
	argv[n++] = "--socket";
	argv[n++] = sock;
	argv[n++] = "--log-level";
	argv[n++] = "warn";
	while (*extra && n < 31)
		argv[n++] = *extra++;
	argv[n] = NULL;
	daemon_pid = fork();
	if (daemon_pid == 0) {
		execvp(path, (char *const *) argv);
		fprintf(stderr, "kvcache-bench: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct kvc_client *c;
		int st;

		if (kvc_connect(sock, &c) == 0) {
			kvc_disconnect(c);
			return;
		}
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			die(0, "%s did not start", path);
		usleep(10000);
	}
	die(0, "%s did not come up", path);
}

static void start_daemon(char *sock, size_t len, const char *dram, const char *lease_ms)
{
	const char *extra[] = { "--dram-size", dram, "--default-kv-lease-ttl", lease_ms, NULL };

	start_daemon_args(sock, len, extra);
}

/* ---- churn: a pool that is always full ---- */

static uint64_t churn_rand(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

static uint64_t pool_capacity(struct kvc_client *c)
{
	struct kvc_status *st;
	uint64_t cap = 0;

	check(kvc_status_get(c, &st), "status");
	for (size_t i = 0; i < st->n_tiers; i++)
		cap += st->tiers[i].capacity;
	kvc_status_free(st);
	return cap;
}

static uint64_t counter(struct kvc_client *c, const char *name)
{
	struct kvc_counter *v;
	uint64_t val = 0;
	size_t n;

	check(kvc_stats_get(c, &v, &n), "stats");
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			val = v[i].value;
	kvc_stats_free(v);
	return val;
}

/*
 * Replay a prompt trace; returns usable prefix blocks / blocks asked for.
 * An engine prefills many prompts at once, so requests come in batches of
 * 16 and their missing blocks are stored round-robin, block 0 of every
 * prompt, then block 1, ...: in LRU order the heads of all 16 chains are the
 * oldest entries.
 */
static double prefix_trace(struct kvc_client *c, const char *ns, bool parents, uint64_t pool,
			   uint8_t *src, uint64_t *ret_requests)
{
	enum { BLOCKS = 16, BLOCK = 32 << 10, BATCH = 16 };
	uint64_t prompts = 3 * pool / (BLOCKS * BLOCK), rs = 1234, usable = 0, asked = 0;
	uint64_t requests = prompts * 8;
	static char keys[BATCH][BLOCKS][96];
	const char *kp[BLOCKS];
	int hit[BATCH];

	for (uint64_t q = 0; q < requests; q += BATCH) {
		for (int j = 0; j < BATCH; j++) {
			uint64_t p = churn_rand(&rs) % prompts;

			for (int b = 0; b < BLOCKS; b++) {
				snprintf(keys[j][b], sizeof(keys[j][b]), "%s@prompt%06" PRIu64 "@block%02d",
					 ns, p, b);
				kp[b] = keys[j][b];
			}
			hit[j] = kvc_prefix_lookup(c, kp, BLOCKS);
			if (hit[j] < 0)
				die(hit[j], "%s", "prefix lookup");
			usable += (uint64_t) hit[j];
			asked += BLOCKS;
		}
		for (int b = 0; b < BLOCKS; b++)
			for (int j = 0; j < BATCH; j++) {
				struct kvc_put_opts o = { .flags = KVC_PUT_REPLACE,
							  .parent_key = parents && b ? keys[j][b - 1] : NULL };
				int r;

				if (b < hit[j])
					continue;
				r = kvc_put(c, keys[j][b], src, BLOCK, &o);
				if (r < 0 && r != -EBUSY)
					die(r, "%s", "put");
			}
	}
	*ret_requests = requests;
	return (double) usable / (double) asked;
}

static int run_churn(uint64_t size)
{
	struct kvc_client *c;
	char sock[200], key[96];
	uint8_t *src = malloc(size), *dst = malloc(size);
	uint64_t pool, keys, rs = 99, n_put = 0, put_ns = 0, gets = 0, hits = 0, t0, ev0;
	double empty_rate, churn_rate, rate_prefix, rate_lru;
	uint64_t requests;
	int r;

	if (!src || !dst)
		die(0, "%s", "out of memory");
	memset(src, 0x5a, size);
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!mkdtemp(tmpdir))
		die(0, "%s", "cannot make a temporary directory");
	if (arg_socket)
		snprintf(sock, sizeof(sock), "%s", arg_socket);
	else
		start_daemon(sock, sizeof(sock), "256MB", "50");
	r = kvc_connect(sock, &c);
	if (r < 0)
		die(r, "cannot reach kvcached at %s", sock);
	pool = pool_capacity(c);
	keys = 3 * pool / size;

	/* 0: touch every page of the pool once, then empty it: both phases
	 * below then write into memory the kernel has already handed out */
	for (uint64_t i = 0; i < 2 * pool / size; i++) {
		snprintf(key, sizeof(key), "warm/%" PRIu64, i);
		check(kvc_put(c, key, src, size, NULL), "put");
	}
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");

	/* 1: puts into an empty pool, up to half of it */
	t0 = now_ns();
	for (uint64_t i = 0; i < pool / 2 / size; i++) {
		uint64_t a = now_ns();

		snprintf(key, sizeof(key), "churn/%" PRIu64, i);
		check(kvc_put(c, key, src, size, NULL), "put");
		put_ns += now_ns() - a;
		n_put++;
	}
	empty_rate = (double) n_put / ((double) put_ns / 1e9);
	(void) t0;

	/* 2: cache-aside over a working set 3x the pool: get, and put on a
	 * miss, with the evictor busy all along */
	n_put = put_ns = 0;
	ev0 = counter(c, "evictions");
	t0 = now_ns();
	while (now_ns() - t0 < (uint64_t) (arg_duration * 1e9)) {
		uint64_t k = churn_rand(&rs) % keys, a;
		ssize_t g;

		snprintf(key, sizeof(key), "churn/%" PRIu64, k);
		g = kvc_get(c, key, dst, size);
		gets++;
		if (g == (ssize_t) size) {
			hits++;
			continue;
		}
		if (g != -ENOENT)
			die((int) g, "%s", "get");
		a = now_ns();
		r = kvc_put(c, key, src, size, NULL);
		if (r < 0 && r != -EEXIST)
			die(r, "put while churning (%s)", kvc_last_error_msg());
		put_ns += now_ns() - a;
		n_put++;
	}
	churn_rate = (double) n_put / ((double) put_ns / 1e9);

	printf("kvcache-bench churn: pool %.0f MiB, values of %" PRIu64 " bytes, working set 3x the "
	       "pool, %.1f s, leases 50 ms\n", (double) pool / (1 << 20), size, arg_duration);
	printf("put, empty pool       %10.0f puts/s\n", empty_rate);
	printf("put, evicting         %10.0f puts/s  (%.0f%% of empty; %" PRIu64 " evictions)\n",
	       churn_rate, 100.0 * churn_rate / empty_rate, counter(c, "evictions") - ev0);
	printf("get hit rate          %10.1f%%  (%" PRIu64 " gets; uniform keys over 3x the pool "
	       "cannot beat 33%%)\n", 100.0 * (double) hits / (double) gets, gets);

	/* 3: the same prompt trace, with parent keys and without */
	usleep(60000); /* let the last leases lapse */
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");
	rate_prefix = prefix_trace(c, "pa", true, pool, src, &requests);
	usleep(60000);
	check(kvc_evict(c, KVC_TIER_DEFAULT, 0, KVC_EVICT_ALL, NULL, NULL), "evict");
	rate_lru = prefix_trace(c, "lru", false, pool, src, &requests);
	printf("prompt trace: %" PRIu64 " requests of 16 x 32 KiB blocks in batches of 16 stored "
	       "round-robin, prompts 3x the pool, uniform reuse\n", requests);
	printf("usable prefix rate    prefix-aware %.1f%%, plain LRU %.1f%%\n", 100.0 * rate_prefix,
	       100.0 * rate_lru);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	free(src);
	free(dst);
	return 0;
}


/* ---- pressure: many objects, pins, leases, a full disk tier, bursts ---- */

static uint64_t arg_objects, arg_pinned;
static bool arg_fill_disk, arg_leased;

/* A second client doing exists in a loop: the longest answer it saw is the
 * longest the daemon's loop stopped serving. */
struct prober {
	pthread_t thread;
	const char *sock;
	volatile bool stop;
	uint64_t n, max_ns, over_1ms;
};

static void *prober_main(void *arg)
{
	struct prober *p = arg;
	struct kvc_client *c;

	if (kvc_connect(p->sock, &c) < 0)
		return NULL;
	kvc_put(c, "probe", "x", 1, NULL);
	while (!p->stop) {
		uint64_t a = now_ns(), d;

		kvc_exists(c, "probe");
		d = now_ns() - a;
		p->n++;
		if (d > p->max_ns)
			p->max_ns = d;
		p->over_1ms += d > 1000000;
		usleep(50); /* a client that pauses, as engines do */
	}
	kvc_disconnect(c);
	return NULL;
}

static void prober_start(struct prober *p, const char *sock)
{
	*p = (struct prober) { .sock = sock };
	if (pthread_create(&p->thread, NULL, prober_main, p) != 0)
		die(0, "%s", "cannot start the prober thread");
}

static void prober_stop(struct prober *p)
{
	p->stop = true;
	pthread_join(p->thread, NULL);
}

/* Put objects [from, to) of 1 KiB; returns puts/s. */
static double fill_small(struct kvc_client *c, const char *ns, uint64_t from, uint64_t to,
			 const struct kvc_put_opts *o)
{
	static uint8_t v[1024];
	uint64_t t0 = now_ns();
	char key[96];

	memset(v, 0x33, sizeof(v));
	for (uint64_t i = from; i < to; i++) {
		int r;

		snprintf(key, sizeof(key), "%s/%" PRIu64, ns, i);
		r = kvc_put(c, key, v, sizeof(v), o);
		if (r < 0 && r != -EEXIST)
			die(r, "put %s (%s)", key, kvc_last_error_msg());
	}
	return (double) (to - from) / ((double) (now_ns() - t0) / 1e9);
}

static void print_cell(const char *what, const struct result *r)
{
	printf("  %-34s p50 %7.2f us  p99 %8.2f us  p999 %8.2f us  %9.0f ops/s\n", what, r->p50,
	       r->p99, r->p999, ops_s(r));
}

static void measure_small(struct kvc_client *c, struct counters *k, const char *label,
			  struct result *ex, struct result *get)
{
	static uint8_t v[4096], out[4096];
	char text[80];

	check(kvc_put(c, "bench/small", v, sizeof(v), &(struct kvc_put_opts) {
		.flags = KVC_PUT_REPLACE }), "put");
	*ex = (struct result) { .op = "exists" };
	TIMED_LOOP(ex, k, if (kvc_exists(c, "bench/small") != 1) die(0, "%s", "exists missed"));
	*get = (struct result) { .op = "get", .size = 4096 };
	TIMED_LOOP(get, k, if (kvc_get(c, "bench/small", out, sizeof(out)) != 4096)
		die(0, "%s", "get missed"));
	snprintf(text, sizeof(text), "exists, %s", label);
	print_cell(text, ex);
	snprintf(text, sizeof(text), "4 KiB get, %s", label);
	print_cell(text, get);
}

/* --objects N [--fill-disk]: the fast path at 1K objects and at N, the
 * longest stall while N are stored, with a disk tier in steady state. */
static int run_objects(void)
{
	uint64_t n = arg_objects ? arg_objects : 1000000;
	struct result ex1, get1, exn, getn;
	struct prober pr;
	struct kvc_client *c;
	struct counters k;
	struct kvc_status *st;
	char sock[200], disk[300];
	double rate;

	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!lat || !mkdtemp(tmpdir))
		die(0, "%s", "cannot set up");
	if (arg_fill_disk) {
		const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk, "--disk-size",
					"64GiB", "--default-kv-lease-ttl", "0", NULL };

		snprintf(disk, sizeof(disk), "%s/bench-disk-XXXXXX", arg_dir ? arg_dir : "/var/tmp");
		if (!mkdtemp(disk))
			die(0, "cannot make %s", disk);
		start_daemon_args(sock, sizeof(sock), extra);
	} else
		start_daemon(sock, sizeof(sock), "4GiB", "0");
	check(kvc_connect(sock, &c), "connect");
	check(kvc_status_get(c, &st), "status");
	counters_init(&k, (pid_t) st->pid);
	kvc_status_free(st);
	printf("kvcache-bench local --objects %" PRIu64 "%s: values of 1 KiB, %.1f s per cell\n", n,
	       arg_fill_disk ? " --fill-disk (64 MiB dram, the rest on disk)" : "", arg_duration);
	fill_small(c, "obj", 0, 1000, NULL);
	measure_small(c, &k, "1K objects", &ex1, &get1);
	prober_start(&pr, sock);
	rate = fill_small(c, "obj", 1000, n, NULL);
	if (arg_fill_disk)
		check(kvc_flush(c, -1), "flush"); /* steady state: everything has a record */
	usleep(200000);
	prober_stop(&pr);
	printf("  stored %" PRIu64 " objects at %.0f puts/s; longest loop turn %.2f ms (wall clock, "
	       "preemption included); a second client's exists meanwhile: longest %.2f ms, %" PRIu64
	       " of %" PRIu64 " over 1 ms\n", n, rate, (double) counter(c, "loop_longest_turn_us") / 1e3,
	       (double) pr.max_ns / 1e6, pr.over_1ms, pr.n);
	measure_small(c, &k, "", &exn, &getn);
	printf("  at %" PRIu64 " objects against 1K: exists p50 %.0f%% of the 1K rate, 4 KiB get "
	       "p50 %.0f%%\n", n, 100.0 * ex1.p50 / exn.p50, 100.0 * get1.p50 / getn.p50);
	if (arg_fill_disk)
		printf("  disk records %" PRIu64 ", dram objects %" PRIu64 "\n",
		       counter(c, "disk.records"), counter(c, "dram.objects"));
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	if (arg_fill_disk) {
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", disk);
		if (system(cmd) != 0)
			fprintf(stderr, "kvcache-bench: could not remove %s\n", disk);
	}
	rmdir(tmpdir);
	return 0;
}

/* Puts of 1 KiB into a full pool, each evicting: rate and tail, after
 * `pinned` hard-pinned objects were stored first (the LRU's old end). */
static void evicting_puts(uint64_t pinned, struct result *r)
{
	struct kvc_put_opts hard = { .flags = KVC_PUT_HARD_PIN };
	static uint8_t v[1024];
	struct kvc_client *c;
	struct counters k;
	char sock[200], key[96];
	uint64_t pool;

	start_daemon(sock, sizeof(sock), "128MiB", "0");
	check(kvc_connect(sock, &c), "connect");
	counters_init(&k, daemon_pid);
	fill_small(c, "pin", 0, pinned, &hard);
	pool = pool_capacity(c) / 1024;
	fill_small(c, "fill", 0, 2 * pool, NULL); /* full, and evicting */
	*r = (struct result) { .op = "put" };
	TIMED_LOOP(r, &k, {
		snprintf(key, sizeof(key), "churn/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
	});
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
}

/* --pinned N: puts under eviction with N hard pins, against none. */
static int run_pinned(void)
{
	struct result a, b;
	char text[80];

	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!lat || !mkdtemp(tmpdir))
		die(0, "%s", "cannot set up");
	printf("kvcache-bench local --pinned %" PRIu64 ": 1 KiB puts into a full 128 MiB pool, "
	       "each evicting, %.1f s per cell\n", arg_pinned, arg_duration);
	evicting_puts(0, &a);
	print_cell("put under eviction, no pins", &a);
	evicting_puts(arg_pinned, &b);
	snprintf(text, sizeof(text), "put under eviction, %" PRIu64 " pins", arg_pinned);
	print_cell(text, &b);
	printf("  with pins: %.0f%% of the unpinned rate\n", 100.0 * ops_s(&b) / ops_s(&a));
	rmdir(tmpdir);
	return 0;
}

/* --leased: everything in the pool leased; puts must fail fast. */
static int run_leased(void)
{
	static uint8_t v[1024];
	struct kvc_client *c;
	struct counters k;
	struct result r, ok;
	char sock[200], key[96];
	uint64_t pool, enospc = 0, dropped = 0;

	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!lat || !mkdtemp(tmpdir))
		die(0, "%s", "cannot set up");
	start_daemon(sock, sizeof(sock), "16MiB", "600000");
	check(kvc_connect(sock, &c), "connect");
	counters_init(&k, daemon_pid);
	pool = pool_capacity(c) / 1024;
	printf("kvcache-bench local --leased: 16 MiB pool, 1 KiB objects, leases of 600 s\n");
	ok = (struct result) { .op = "put" };
	TIMED_LOOP(&ok, &k, {
		snprintf(key, sizeof(key), "fresh/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
		kvc_remove(c, key);
	});
	print_cell("put, pool not full", &ok);
	for (uint64_t i = 0; i < 2 * pool; i++) {
		int e;

		snprintf(key, sizeof(key), "leased/%" PRIu64, i);
		e = kvc_put(c, key, v, sizeof(v), NULL);
		if (e == -ENOSPC)
			break;
		check(e, "put");
		e = kvc_exists(c, key); /* leased */
		check(e, "exists");
		dropped += e == 0; /* gone right after its put returned 0 */
	}
	if (dropped)
		printf("  %" PRIu64 " objects were gone right after their put returned 0\n", dropped);
	r = (struct result) { .op = "put" };
	TIMED_LOOP(&r, &k, {
		snprintf(key, sizeof(key), "refused/%" PRIu64, i);
		enospc += kvc_put(c, key, v, sizeof(v), NULL) == -ENOSPC;
	});
	print_cell("put, everything leased (-ENOSPC)", &r);
	printf("  %" PRIu64 " of the attempts answered -ENOSPC\n", enospc);
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	return 0;
}

/* burst: 300 x 1 MiB put back to back into 64 MiB over a disk tier. */
static int run_burst(void)
{
	enum { N = 300, LEN = 1 << 20 };
	const char *dir = arg_dir ? arg_dir : "/var/tmp";
	char sock[200], disk[300], key[64], cmd[400];
	uint8_t *v = malloc(LEN), *out = malloc(LEN);
	struct kvc_client *c;
	uint64_t t0, lost = 0, t_put;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	snprintf(disk, sizeof(disk), "%s/bench-burst-XXXXXX", dir);
	if (!v || !out || !mkdtemp(tmpdir) || !mkdtemp(disk))
		die(0, "%s", "cannot set up");
	{
		const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk,
					"--default-kv-lease-ttl", "0", "--hugepages", "off", NULL };

		start_daemon_args(sock, sizeof(sock), extra);
	}
	check(kvc_connect(sock, &c), "connect");
	memset(v, 0x77, LEN);
	t0 = now_ns();
	for (int i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "burst/%d", i);
		check(kvc_put(c, key, v, LEN, NULL), "put");
	}
	t_put = now_ns() - t0;
	for (int i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "burst/%d", i);
		lost += kvc_get(c, key, out, LEN) != LEN || memcmp(out, v, LEN) != 0;
	}
	printf("kvcache-bench burst: %d x 1 MiB put back to back into 64 MiB dram over a disk tier "
	       "in %s\n", N, dir);
	printf("  puts took %.0f ms (%.2f GB/s); %" PRIu64 " waited for a spill; %" PRIu64
	       " of %d lost; dram evictions %" PRIu64 "\n", (double) t_put / 1e6,
	       (double) N * LEN / (double) t_put, counter(c, "spill_waits"), lost, N,
	       counter(c, "dram.evictions"));
	kvc_disconnect(c);
	stop_daemon();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", disk);
	if (system(cmd) != 0)
		fprintf(stderr, "kvcache-bench: could not remove %s\n", disk);
	rmdir(tmpdir);
	free(v);
	free(out);
	return 0;
}

/* recovery: a restart over N records of 4 KiB; how soon it answers, how
 * long until every record is indexed. */
static int run_recovery(void)
{
	uint64_t n = arg_objects ? arg_objects : 100000;
	const char *dir = arg_dir ? arg_dir : "/var/tmp";
	char sock[200], disk[300], cmd[400];
	static uint8_t v[4096];
	const char *extra[] = { "--dram-size", "64MiB", "--disk-dir", disk, "--disk-size", "8GiB",
				"--default-kv-lease-ttl", "0", NULL };
	struct kvc_client *c;
	uint64_t t0, t_answer, t_done;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	snprintf(disk, sizeof(disk), "%s/bench-recovery-XXXXXX", dir);
	if (!mkdtemp(tmpdir) || !mkdtemp(disk))
		die(0, "%s", "cannot set up");
	start_daemon_args(sock, sizeof(sock), extra);
	check(kvc_connect(sock, &c), "connect");
	for (uint64_t i = 0; i < n; i++) {
		char key[64];

		snprintf(key, sizeof(key), "rec/%" PRIu64, i);
		check(kvc_put(c, key, v, sizeof(v), NULL), "put");
	}
	check(kvc_flush(c, -1), "flush");
	kvc_disconnect(c);
	stop_daemon();

	t0 = now_ns();
	start_daemon_args(sock, sizeof(sock), extra); /* returns once it answers */
	t_answer = now_ns() - t0;
	check(kvc_connect(sock, &c), "connect");
	for (;;) {
		struct kvc_status *st;
		bool done;

		check(kvc_status_get(c, &st), "status");
		done = !st->recovering;
		kvc_status_free(st);
		if (done)
			break;
		usleep(1000);
	}
	t_done = now_ns() - t0;
	printf("kvcache-bench recovery: restart over %" PRIu64 " records of 4 KiB in %s\n", n, dir);
	printf("  first answer after %.0f ms; every record indexed after %.0f ms (%.0f records/s); "
	       "%" PRIu64 " objects\n", (double) t_answer / 1e6, (double) t_done / 1e6,
	       (double) n / ((double) t_done / 1e9), counter(c, "disk.records"));
	kvc_disconnect(c);
	stop_daemon();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", disk);
	if (system(cmd) != 0)
		fprintf(stderr, "kvcache-bench: could not remove %s\n", disk);
	rmdir(tmpdir);
	return 0;
}

/* ---- disk: the device's limits against spill and read-back ---- */

static void fill_kv16(uint8_t *buf, size_t len, uint64_t seed);
static void start_daemon_disk(char *sock, size_t len, const char *ddir, const char *compress);

/* Sequential O_DIRECT io_uring I/O of `total` bytes in `block` pieces, 8 in
 * flight: the raw bandwidth kvcache's disk tier is compared with. */
static double raw_io(const char *dir, uint64_t block, uint64_t total, bool writing)
{
	char path[4200];
	struct io_uring ring;
	uint8_t *buf;
	uint64_t t0, off = 0, done = 0;
	unsigned inflight = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/kvcache-bench-raw", dir);
	fd = open(path, (writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0)
		fd = open(path, (writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_CLOEXEC, 0600);
	if (fd < 0)
		die(-errno, "cannot open %s", path);
	if (io_uring_queue_init(16, &ring, 0) < 0)
		die(0, "%s", "io_uring is not available");
	buf = aligned_alloc(4096, block * 8);
	if (!buf)
		die(0, "%s", "out of memory");
	fill_kv16(buf, block * 8, 3);
	t0 = now_ns();
	while (done < total) {
		struct io_uring_cqe *cqe;

		while (inflight < 8 && off < total) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			uint8_t *b = buf + (off / block % 8) * block;

			if (writing)
				io_uring_prep_write(sqe, fd, b, (unsigned) block, off);
			else
				io_uring_prep_read(sqe, fd, b, (unsigned) block, off);
			off += block;
			inflight++;
		}
		io_uring_submit(&ring);
		if (io_uring_wait_cqe(&ring, &cqe) < 0)
			die(0, "%s", "io_uring wait failed");
		if (cqe->res != (int) block)
			die(cqe->res < 0 ? cqe->res : -EIO, "raw %s of %s", writing ? "write" : "read", path);
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
		done += block;
	}
	t0 = now_ns() - t0;
	io_uring_queue_exit(&ring);
	close(fd);
	free(buf);
	if (!writing)
		unlink(path);
	return (double) total / (double) t0;
}

/* IEEE half from float, truncating (compilers here lack _Float16) */
static uint16_t to_half(float f)
{
	uint32_t x, mant;
	uint16_t sign;
	int32_t exp;

	memcpy(&x, &f, 4);
	sign = (uint16_t) ((x >> 16) & 0x8000);
	exp = (int32_t) ((x >> 23) & 0xff) - 127 + 15;
	mant = x & 0x7fffff;
	if (exp <= 0) {
		if (exp < -10)
			return sign;
		mant |= 0x800000;
		return (uint16_t) (sign | (mant >> (14 - exp)));
	}
	if (exp >= 31)
		return (uint16_t) (sign | 0x7c00);
	return (uint16_t) (sign | (uint32_t) exp << 10 | mant >> 13);
}

/* fp16 K/V values: roughly normal around 0 with a small spread */
static void fill_kv16(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i + 2 <= len; i += 2) {
		uint64_t r = churn_rand(&s);
		/* sum of uniforms ~ normal; scale to about N(0, 0.5) */
		double x = ((double) (r & 0xffff) + (double) ((r >> 16) & 0xffff) +
			    (double) ((r >> 32) & 0xffff) - 98302.5) / 65536.0;
		uint16_t bits = to_half((float) x);

		memcpy(buf + i, &bits, 2);
	}
}

/* bf16: the top half of a float32 */
static void fill_bf16(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i + 2 <= len; i += 2) {
		uint64_t r = churn_rand(&s);
		float f = (float) (((double) (r & 0xffff) + (double) ((r >> 16) & 0xffff) +
				    (double) ((r >> 32) & 0xffff) - 98302.5) / 65536.0);
		uint32_t bits;
		uint16_t top;

		memcpy(&bits, &f, 4);
		top = (uint16_t) (bits >> 16);
		memcpy(buf + i, &top, 2);
	}
}

static void zstd_figures(void)
{
	const size_t len = 16 << 20;
	uint8_t *src = malloc(len), *z = malloc(ZSTD_compressBound(len)), *back = malloc(len);
	const char *kinds[] = { "fp16", "bf16" };

	if (!src || !z || !back)
		die(0, "%s", "out of memory");
	printf("\nzstd on KV-like values (16 MiB, one thread):\n");
	printf("%-6s %5s %8s %12s %12s\n", "values", "level", "ratio", "compress", "decompress");
	for (int k = 0; k < 2; k++) {
		if (k == 0)
			fill_kv16(src, len, 11);
		else
			fill_bf16(src, len, 11);
		for (int level = 1; level <= 3; level += 2) {
			uint64_t t0 = now_ns(), tc, td;
			size_t n = ZSTD_compress(z, ZSTD_compressBound(len), src, len, level);

			tc = now_ns() - t0;
			t0 = now_ns();
			if (ZSTD_isError(n) || ZSTD_decompress(back, len, z, n) != len ||
			    memcmp(back, src, len) != 0)
				die(0, "%s", "zstd round trip failed");
			td = now_ns() - t0;
			printf("%-6s %5d %7.3fx %9.0f MB/s %9.0f MB/s\n", kinds[k], level,
			       (double) len / (double) n, (double) len / (double) tc * 1e3,
			       (double) len / (double) td * 1e3);
		}
	}
	free(src);
	free(z);
	free(back);
}

/* kvcache's spill and read-back bandwidth for `size` objects, `total` bytes. */
static void kvcache_disk(const char *dir, uint64_t size, uint64_t total, const char *compress,
			 double *ret_spill, double *ret_back)
{
	uint64_t objs = total / size, t0, loaded = 0, next = 0, inflight = 0;
	char sock[200], ddir[4200], key[64];
	struct kvc_client *c;
	struct kvc_buffer buf;
	uint8_t *val = malloc(size);

	if (!val)
		die(0, "%s", "out of memory");
	fill_kv16(val, size, 5);
	snprintf(ddir, sizeof(ddir), "%s/kvcache-bench-disk-XXXXXX", dir);
	if (!mkdtemp(ddir))
		die(-errno, "cannot make a directory under %s", dir);
	start_daemon_disk(sock, sizeof(sock), ddir, compress);
	check(kvc_connect(sock, &c), "connect");
	for (uint64_t j = 0; j < objs; j++) {
		snprintf(key, sizeof(key), "disk/%" PRIu64, j);
		check(kvc_put(c, key, val, size, NULL), "put");
	}
	/* spill: from the flush to the last record's completion */
	t0 = now_ns();
	check(kvc_flush(c, -1), "flush");
	*ret_spill = (double) (objs * size) / (double) (now_ns() - t0);
	/* read-back: memory emptied, every object loaded into a registered
	 * buffer by the daemon, 8 requests in flight */
	check(kvc_evict(c, KVC_TIER_DRAM, 0, KVC_EVICT_ALL, NULL, NULL), "evict");
	check(kvc_buffer_alloc(c, size * 8, &buf), "buffer");
	t0 = now_ns();
	while (loaded < objs) {
		struct kvc_completion cp[8];
		int r;

		while (inflight < 8 && next < objs) {
			static char keys[8][64];
			struct kvc_op op = { .opcode = KVC_OP_GET_INTO, .buf = &buf };

			snprintf(keys[next % 8], 64, "disk/%" PRIu64, next);
			op.key = keys[next % 8];
			op.offset = (next % 8) * size;
			op.len = size;
			op.user_data = next;
			if (kvc_submit(c, &op, 1) != 1)
				break;
			next++;
			inflight++;
		}
		r = kvc_wait(c, cp, 1, 8, -1);
		if (r < 0)
			die(r, "%s", "wait");
		for (int k = 0; k < r; k++)
			if (cp[k].res != (int64_t) size)
				die((int) cp[k].res, "read-back of disk/%" PRIu64, cp[k].user_data);
		loaded += (uint64_t) r;
		inflight -= (uint64_t) r;
	}
	*ret_back = (double) (objs * size) / (double) (now_ns() - t0);
	if (memcmp((uint8_t *) buf.data, val, size) != 0)
		die(0, "%s", "read-back returned wrong bytes");
	kvc_buffer_free(c, &buf);
	kvc_disconnect(c);
	stop_daemon();
	{
		char cmd[4300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", ddir);
		if (system(cmd) != 0)
			fprintf(stderr, "kvcache-bench: could not remove %s\n", ddir);
	}
	free(val);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

#define DISK_REPS 3

static double median3(double *v)
{
	qsort(v, DISK_REPS, sizeof(*v), cmp_double);
	return v[DISK_REPS / 2];
}

static int run_disk(const char *dir, const uint64_t *sizes, size_t n, const char *compress)
{
	const uint64_t total = 384 << 20;

	if (!dir)
		dir = "/var/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!mkdtemp(tmpdir))
		die(0, "%s", "cannot make a temporary directory");
	printf("kvcache-bench disk: %s, %" PRIu64 " MiB per measurement, medians of %d runs "
	       "interleaved on the same directory\n", dir, total >> 20, DISK_REPS);
	printf("%-7s %6s %10s %10s %10s %10s %9s %9s\n", "values", "size", "raw write", "spill",
	       "raw read", "read-back", "spill/raw", "read/raw");
	for (size_t i = 0; i < n; i++) {
		double rw[DISK_REPS], rr[DISK_REPS], sp[DISK_REPS], rb[DISK_REPS];
		double raw_w, raw_r, spill, back;
		char sz[32];

		for (int rep = 0; rep < DISK_REPS; rep++) {
			rw[rep] = raw_io(dir, sizes[i], total, true);
			rr[rep] = raw_io(dir, sizes[i], total, false);
			kvcache_disk(dir, sizes[i], total, compress, &sp[rep], &rb[rep]);
		}
		raw_w = median3(rw);
		raw_r = median3(rr);
		spill = median3(sp);
		back = median3(rb);
		size_name(sz, sizeof(sz), sizes[i]);
		printf("%-7s %6s %7.2f GB/s %6.2f GB/s %6.2f GB/s %6.2f GB/s %8.0f%% %8.0f%%\n", compress,
		       sz, raw_w, spill, raw_r, back, 100.0 * spill / raw_w, 100.0 * back / raw_r);
		fflush(stdout);
	}
	rmdir(tmpdir);
	return 0;
}

static void start_daemon_disk(char *sock, size_t len, const char *ddir, const char *compress)
{
	/* memory for all of it, so the flush is the only writer */
	const char *extra[] = { "--dram-size", "1GiB", "--disk-dir", ddir, "--disk-size", "4GiB",
				"--disk-compress", compress, "--default-kv-lease-ttl", "0", NULL };

	start_daemon_args(sock, len, extra);
}

static bool want_op(const char *op)
{
	size_t n = strlen(op);

	for (const char *p = arg_ops; (p = strstr(p, op)); p += n)
		if ((p == arg_ops || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
			return true;
	return false;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvcache-bench disk [--dir DIR] [--sizes 1M,16M] [--zstd]\n"
		   "       kvcache-bench burst [--dir DIR]\n"
		   "       kvcache-bench recovery [--objects N] [--dir DIR]\n"
		   "       kvcache-bench local --objects N [--fill-disk] [--dir DIR] [--duration S]\n"
		   "       kvcache-bench local --pinned N | --leased [--duration S]\n"
		   "       kvcache-bench churn [--sizes SIZE] [--duration S] [--socket PATH]\n"
		   "       kvcache-bench local [--sizes 4K,64K,1M,4M,16M]\n"
		   "                          [--ops exists,get,put,acquire,prefix64,batch64]\n"
		   "                          [--duration S] [--json] [--peers] [--socket PATH]\n"
		   "                          [--kvcached PATH]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "sizes", required_argument, NULL, 'z' },
		{ "ops", required_argument, NULL, 'o' },
		{ "duration", required_argument, NULL, 'd' },
		{ "json", no_argument, NULL, 'j' },
		{ "peers", no_argument, NULL, 'p' },
		{ "socket", required_argument, NULL, 's' },
		{ "kvcached", required_argument, NULL, 'k' },
		{ "dir", required_argument, NULL, 'D' },
		{ "zstd", no_argument, NULL, 'Z' },
		{ "objects", required_argument, NULL, 'O' },
		{ "pinned", required_argument, NULL, 'P' },
		{ "fill-disk", no_argument, NULL, 'F' },
		{ "leased", no_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct result res[64], peer_res[2][64];
	size_t n_res = 0, n_peer[2] = { 0, 0 };
	char sock[200];
	struct kvc_client *c;
	struct counters k;
	uint64_t max_size = 0;
	uint8_t *src, *dst;
	struct kvc_status *st;
	int opt, r;

	if (argc < 2 || (strcmp(argv[1], "local") != 0 && strcmp(argv[1], "churn") != 0 &&
			 strcmp(argv[1], "disk") != 0 && strcmp(argv[1], "burst") != 0 &&
			 strcmp(argv[1], "recovery") != 0)) {
		usage(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
		return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'z': {
			char *s = strdup(optarg), *save = NULL;

			n_sizes = 0;
			for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				if (n_sizes == MAX_SIZES || kvc_parse_size(t, &arg_sizes[n_sizes]) < 0 ||
				    arg_sizes[n_sizes] == 0 || arg_sizes[n_sizes] > (256u << 20)) {
					fprintf(stderr, "kvcache-bench: bad size '%s' (1 .. 256M)\n", t);
					return 2;
				}
				n_sizes++;
			}
			free(s);
			break;
		}
		case 'o':
			arg_ops = optarg;
			break;
		case 'd':
			arg_duration = atof(optarg);
			if (arg_duration <= 0 || arg_duration > 600) {
				fprintf(stderr, "kvcache-bench: bad --duration '%s'\n", optarg);
				return 2;
			}
			break;
		case 'j':
			arg_json = true;
			break;
		case 'p':
			arg_peers = true;
			break;
		case 's':
			arg_socket = optarg;
			break;
		case 'k':
			arg_kvcached = optarg;
			break;
		case 'D':
			arg_dir = optarg;
			break;
		case 'Z':
			arg_zstd = true;
			break;
		case 'O':
		case 'P': {
			char *end;
			unsigned long long v = strtoull(optarg, &end, 10);

			if (*end || !*optarg || v == 0 || v > 100000000) {
				fprintf(stderr, "kvcache-bench: bad count '%s'\n", optarg);
				return 2;
			}
			if (opt == 'O')
				arg_objects = v;
			else
				arg_pinned = v;
			break;
		}
		case 'F':
			arg_fill_disk = true;
			break;
		case 'L':
			arg_leased = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (strcmp(argv[1], "burst") == 0)
		return run_burst();
	if (strcmp(argv[1], "recovery") == 0)
		return run_recovery();
	if (arg_pinned)
		return run_pinned();
	if (arg_leased)
		return run_leased();
	if (arg_objects || arg_fill_disk)
		return run_objects();
	if (strcmp(argv[1], "churn") == 0)
		return run_churn(n_sizes == 5 && arg_sizes[0] == 4096 ? 64 << 10 : arg_sizes[0]);
	if (strcmp(argv[1], "disk") == 0) {
		static const uint64_t dflt[] = { 1 << 20, 16 << 20 };
		bool given = !(n_sizes == 5 && arg_sizes[0] == 4096);

		run_disk(arg_dir, given ? arg_sizes : dflt, given ? n_sizes : 2, "none");
		if (arg_zstd)
			run_disk(arg_dir, given ? arg_sizes : dflt, given ? n_sizes : 2, "zstd");
		zstd_figures();
		return 0;
	}
	for (size_t i = 0; i < n_sizes; i++)
		if (arg_sizes[i] > max_size)
			max_size = arg_sizes[i];
	lat = malloc(MAX_SAMPLES * sizeof(*lat));
	src = malloc(max_size + 4096);
	dst = malloc(max_size + 4096);
	if (!lat || !src || !dst)
		die(0, "%s", "out of memory");
	for (uint64_t i = 0; i < max_size; i++)
		src[i] = (uint8_t) (i * 131 + (i >> 12));
	memset(dst, 0, max_size);

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!mkdtemp(tmpdir))
		die(0, "%s", "cannot make a temporary directory");
	if (arg_socket)
		snprintf(sock, sizeof(sock), "%s", arg_socket);
	else /* no leases: each cell removes what it read before the next */
		start_daemon(sock, sizeof(sock), "2GiB", "0");
	r = kvc_connect(sock, &c);
	if (r < 0)
		die(r, "cannot reach kvcached at %s", sock);
	check(kvc_status_get(c, &st), "status");
	counters_init(&k, (pid_t) st->pid);
	if (!arg_json) {
		printf("kvcache-bench local: kvcached %s (pid %u), dram %.1f GiB, %s pages, "
		       "%.1f s per cell, one client thread\n",
		       st->version, st->pid, (double) st->tiers[0].capacity / (1 << 30),
		       st->hugepages ? "2 MiB" : "4 KiB", arg_duration);
		printf("sys/op c|d: system calls per operation in the bench | in the server%s\n",
		       k.self < 0 ? " (n/a: no raw_syscalls tracepoint)" : "");
		print_header();
	}
	kvc_status_free(st);

	if (want_op("exists")) {
		bench_exists(c, &k, &res[n_res]);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}
	for (size_t s = 0; s < n_sizes; s++) {
		uint64_t size = arg_sizes[s];
		static const char *const sized[] = { "get", "put", "acquire" };

		for (size_t o = 0; o < 3; o++) {
			struct result *x = &res[n_res];

			if (!want_op(sized[o]))
				continue;
			if (o == 1)
				bench_put(c, &k, x, size, src);
			else
				bench_get(c, &k, x, size, src, dst, o == 2);
			if (!arg_json)
				print_result(x);
			n_res++;
		}
	}
	if (want_op("prefix64")) {
		bench_keys(c, &k, &res[n_res], true);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}
	if (want_op("batch64")) {
		bench_keys(c, &k, &res[n_res], false);
		if (!arg_json)
			print_result(&res[n_res]);
		n_res++;
	}

	if (arg_peers) {
		struct peer peers[2] = { { .name = "memcached", .fd = -1 }, { .name = "redis", .fd = -1 } };
		peer_fn fns[2] = { mc_op, redis_op };
		bool up[2];
		char mem[32];

		chmod(tmpdir, 0777); /* memcached drops root for nobody */
		snprintf(peers[0].sock, sizeof(peers[0].sock), "%s/memcached.sock", tmpdir);
		snprintf(peers[1].sock, sizeof(peers[1].sock), "%s/redis.sock", tmpdir);
		snprintf(mem, sizeof(mem), "%" PRIu64, (max_size * 80 >> 20) + 256);
		up[0] = peer_start(&peers[0], (char *[]) { "memcached", "-s", peers[0].sock, "-a", "0777",
							  "-m", mem, "-I", "64m", "-t", "1", "-U", "0",
							  "-u", "nobody", NULL });
		up[1] = peer_start(&peers[1], (char *[]) { "redis-server", "--port", "0", "--unixsocket",
							  peers[1].sock, "--unixsocketperm", "700",
							  "--save", "", "--appendonly", "no",
							  "--proto-max-bulk-len", "512mb", NULL });
		if (!arg_json)
			printf("\npeers over Unix sockets, same workload, same run:\n");
		for (int p = 0; p < 2; p++) {
			struct counters pk;

			if (!up[p]) {
				if (!arg_json)
					printf("%s: not installed or did not start; skipped\n", peers[p].name);
				continue;
			}
			counters_init(&pk, peers[p].pid);
			if (!arg_json) {
				printf("%s (pid %d)\n", peers[p].name, (int) peers[p].pid);
				print_header();
			}
			for (int op = 0; op < 3; op++) {
				static const char *const names[] = { "put", "get", "exists" };

				if (!want_op(names[op]))
					continue;
				for (size_t s = 0; s < (op == 2 ? 1 : n_sizes); s++) {
					struct result *x = &peer_res[p][n_peer[p]++];

					bench_peer(&peers[p], fns[p], op == 0 ? P_PUT : op == 1 ? P_GET : P_EXISTS,
						   arg_sizes[s], src, dst, &pk, x);
					if (!arg_json)
						print_result(x);
				}
			}
			counters_done(&pk);
			peer_stop(&peers[p]);
		}
		if (!arg_json) {
			printf("\nspeed-up of kvcache (p50 latency ratio, throughput ratio):\n");
			printf("%-9s %5s %22s %22s\n", "op", "size", "vs memcached", "vs redis");
			for (size_t i = 0; i < n_res; i++) {
				char sz[32], cells[2][32];

				if (strcmp(res[i].op, "put") && strcmp(res[i].op, "get") &&
				    strcmp(res[i].op, "exists"))
					continue;
				for (int p = 0; p < 2; p++) {
					snprintf(cells[p], sizeof(cells[p]), "-");
					for (size_t j = 0; j < n_peer[p]; j++)
						if (!strcmp(peer_res[p][j].op, res[i].op) &&
						    peer_res[p][j].size == res[i].size)
							snprintf(cells[p], sizeof(cells[p]), "%6.1fx p50 %6.1fx ops",
								 peer_res[p][j].p50 / res[i].p50,
								 ops_s(&res[i]) / ops_s(&peer_res[p][j]));
				}
				size_name(sz, sizeof(sz), res[i].size);
				printf("%-9s %5s %22s %22s\n", res[i].op, sz, cells[0], cells[1]);
			}
		}
	}

	if (arg_json) {
		printf("{\n  \"version\": \"%s\",\n  \"duration_s\": %.2f,\n  \"results\": [\n", KVC_VERSION,
		       arg_duration);
		for (size_t i = 0; i < n_res; i++)
			json_result(stdout, &res[i], "kvcache", i + 1 < n_res || n_peer[0] || n_peer[1]);
		for (int p = 0; p < 2; p++)
			for (size_t i = 0; i < n_peer[p]; i++)
				json_result(stdout, &peer_res[p][i], p ? "redis" : "memcached",
					    i + 1 < n_peer[p] || (p == 0 && n_peer[1]));
		printf("  ]\n}\n");
	}
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	rmdir(tmpdir);
	free(src);
	free(dst);
	free(lat);
	return 0;
}
