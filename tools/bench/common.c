/* SPDX-License-Identifier: MIT */
/* kvcache-bench: timing, results, system call counters, the private daemon. */
#include "bench.h"

uint64_t *lat;
pid_t daemon_pid;
char tmpdir[64];

void stop_daemon(void)
{
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
	}
	daemon_pid = 0;
}


void die(int err, const char *fmt, ...)
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

void counters_init(struct counters *c, pid_t server)
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

void counters_done(struct counters *c)
{
	if (c->self >= 0)
		close(c->self);
	for (int i = 0; i < c->n_server; i++)
		close(c->server[i]);
}

void counters_start(struct counters *c)
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

void counters_stop(struct counters *c, int64_t *self, int64_t *server)
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

void finish(struct result *r, uint64_t n, uint64_t t0, uint64_t t1, int64_t sc, int64_t sd)
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

double ops_s(const struct result *r)
{
	return (double) r->n / r->secs;
}

double gb_s(const struct result *r)
{
	return ops_s(r) * (double) r->size / 1e9;
}

/*
 * Single-thread memcpy bandwidth on the same buffers kvcache copies between:
 * for get, from each stored object in the pool into the bench's buffer; for
 * put, from the bench's buffer into pool space of the same sizes.  Cycling
 * through the same regions keeps caches out of one side's favour.
 */
double memcpy_cycle(uint8_t *const *dsts, const uint8_t *const *srcs, size_t n,
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

/* ---- output ---- */

static void fmt_sys(char *buf, size_t len, double v)
{
	if (v < 0)
		snprintf(buf, len, "n/a");
	else
		snprintf(buf, len, "%.3f", v);
}

void size_name(char *buf, size_t len, uint64_t s)
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

void print_header(void)
{
	printf("%-9s %5s %11s %8s %8s %8s %9s %8s %8s %8s %9s\n", "op", "size", "ops/s", "GB/s",
	       "p50 us", "p99 us", "p999 us", "sys/op c", "sys/op d", "memcpy", "vs memcpy");
}

void print_result(const struct result *r)
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

void json_result(FILE *f, const struct result *r, const char *system, bool comma)
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
void start_daemon_args(char *sock, size_t len, const char *const *extra)
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

void start_daemon(char *sock, size_t len, const char *dram, const char *lease_ms)
{
	const char *extra[] = { "--dram-size", dram, "--default-kv-lease-ttl", lease_ms, NULL };

	start_daemon_args(sock, len, extra);
}

void bench_setup(void)
{
	if (!lat)
		lat = malloc(MAX_SAMPLES * sizeof(*lat));
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcache-bench-XXXXXX");
	if (!lat || !mkdtemp(tmpdir))
		die(0, "%s", "cannot set up (memory or a directory in /tmp)");
}
