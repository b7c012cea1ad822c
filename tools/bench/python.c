/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench python: what a call costs through the Python module, beside
 * the same call through the C API in the same run, against the same
 * private daemon; and 16 MiB get_into against memcpy.  The Python half is
 * kvcache/bench.py, run with the interpreter the module was built for.
 */
#include "bench.h"

struct py_figure {
	char op[32];
	uint64_t size;
	double p50_us, gbs;
};

/* The build tree's python/ directory, when kvcache-bench runs from there. */
bool build_python_dir(char *buf, size_t len)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return false;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return false;
	*slash = '\0';
	snprintf(buf, len, "%s/../python/kvcache/__init__.py", self);
	if (access(buf, R_OK) != 0)
		return false;
	snprintf(buf, len, "%s/../python", self);
	return true;
}

static double json_num(const char *line, const char *field)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\": ", field);
	p = strstr(line, pat);
	return p ? strtod(p + strlen(pat), NULL) : 0;
}

/* Run the Python half; fills up to max figures, returns how many or -1. */
static int run_python_half(const char *sock, uint64_t big, struct py_figure *ret, int max)
{
	const char *py = getenv("KVCACHE_PYTHON");
	char dur[32], bigs[32], dir[4200], line[512];
	int pipefd[2], n = 0, st;
	pid_t pid;
	FILE *f;

	if (!py)
		py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
	snprintf(dur, sizeof(dur), "%g", arg_duration);
	snprintf(bigs, sizeof(bigs), "%" PRIu64, big);
	if (pipe(pipefd) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		const char *old = getenv("PYTHONPATH");
		char path[8500];

		if (build_python_dir(dir, sizeof(dir))) {
			snprintf(path, sizeof(path), "%s%s%s", dir, old ? ":" : "", old ? old : "");
			setenv("PYTHONPATH", path, 1);
		}
		dup2(pipefd[1], 1);
		close(pipefd[0]);
		close(pipefd[1]);
		execlp(py, py, "-m", "kvcache.bench", "--socket", sock, "--duration", dur, "--big",
		       bigs, (char *) NULL);
		fprintf(stderr, "kvcache-bench: cannot run %s: %s\n", py, strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	f = fdopen(pipefd[0], "r");
	while (f && fgets(line, sizeof(line), f)) {
		const char *op = strstr(line, "\"op\": \"");

		if (!op || n == max)
			continue;
		op += 7;
		snprintf(ret[n].op, sizeof(ret[n].op), "%.*s", (int) strcspn(op, "\""), op);
		ret[n].size = (uint64_t) json_num(line, "size");
		ret[n].p50_us = json_num(line, "p50_us");
		ret[n].gbs = json_num(line, "gbs");
		n++;
	}
	if (f)
		fclose(f);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? n : -1;
}

static const struct py_figure *find(const struct py_figure *v, int n, const char *op,
				    uint64_t size)
{
	for (int i = 0; i < n; i++)
		if (strcmp(v[i].op, op) == 0 && v[i].size == size)
			return &v[i];
	return NULL;
}

int run_python(void)
{
	const uint64_t big = 16 << 20;
	struct result ex, get4k, into;
	struct py_figure py[16];
	struct counters k;
	struct kvc_client *c;
	struct kvc_buffer buf;
	uint8_t *src, *dst;
	double memcpy_gbs;
	char sock[128];
	int n;

	bench_setup();
	start_daemon(sock, sizeof(sock), "1GiB", "10000");
	check(kvc_connect(sock, &c), "connect");
	counters_init(&k, daemon_pid);
	src = malloc(big);
	dst = malloc(big);
	if (!src || !dst)
		die(0, "%s", "out of memory");
	for (uint64_t i = 0; i < big; i++)
		src[i] = (uint8_t) (i * 131);

	/* the C API, in this run */
	bench_exists(c, &k, &ex);
	bench_get(c, &k, &get4k, 4096, src, dst, false);
	check(kvc_put(c, "bench/python/big", src, big, NULL), "put");
	check(kvc_buffer_alloc(c, big, &buf), "buffer_alloc");
	{
		struct kvc_view v;
		uint8_t *dsts[1] = { buf.data };
		const uint8_t *srcs[1];

		check(kvc_acquire(c, "bench/python/big", &v), "acquire");
		srcs[0] = v.data;
		memcpy_gbs = memcpy_cycle(dsts, srcs, 1, big);
		kvc_release(c, &v);
	}
	into = (struct result) { .op = "get_into", .size = big };
	TIMED_LOOP(&into, &k, {
		if (kvc_get_into(c, "bench/python/big", &buf, 0, big) != (ssize_t) big)
			die(0, "%s", "get_into returned a wrong length");
	});
	if (memcmp(buf.data, src, big) != 0)
		die(0, "%s", "get_into returned wrong bytes");
	kvc_buffer_free(c, &buf);
	kvc_remove(c, "bench/python/big");

	/* the module, against the same daemon */
	n = run_python_half(sock, big, py, 16);
	counters_done(&k);
	kvc_disconnect(c);
	stop_daemon();
	free(src);
	free(dst);
	if (n < 0) {
		printf("python: the kvcache module did not run (python3-dev at build time, "
		       "KVCACHE_PYTHON, PYTHONPATH)\n");
		return 1;
	}

	const struct py_figure *pe = find(py, n, "exists", 0), *pg = find(py, n, "get", 4096),
			       *pgi = find(py, n, "get_into", 4096),
			       *pb = find(py, n, "get_into_buffer", big),
			       *pp = find(py, n, "get_into", big);
	if (!pe || !pg || !pgi || !pb || !pp) {
		printf("python: the Python half printed too little\n");
		return 1;
	}
	double c_gbs = gb_s(&into);
	if (arg_json) {
		printf("{\"case\": \"python\", \"c\": {\"exists_p50_us\": %.3f, "
		       "\"get4k_p50_us\": %.3f, \"get_into16m_gbs\": %.3f}, \"memcpy_gbs\": %.3f, "
		       "\"python\": {\"exists_p50_us\": %.3f, \"get4k_p50_us\": %.3f, "
		       "\"get_into4k_p50_us\": %.3f, \"get_into16m_buffer_gbs\": %.3f, "
		       "\"get_into16m_bytearray_gbs\": %.3f}}\n",
		       ex.p50, get4k.p50, c_gbs, memcpy_gbs, pe->p50_us, pg->p50_us, pgi->p50_us,
		       pb->gbs, pp->gbs);
		return 0;
	}
	printf("kvcache-bench python: the module against the C API, same daemon, same run\n");
	printf("%-34s %12s %12s %10s\n", "call", "C API", "Python", "Python/C");
	printf("%-34s %9.2f us %9.2f us %9.2fx\n", "exists, p50", ex.p50, pe->p50_us,
	       pe->p50_us / ex.p50);
	printf("%-34s %9.2f us %9.2f us %9.2fx\n", "4 KiB get (C: kvc_get; Py: -> bytes)",
	       get4k.p50, pg->p50_us, pg->p50_us / get4k.p50);
	printf("%-34s %9.2f us %9.2f us %9.2fx\n", "4 KiB get_into a bytearray", get4k.p50,
	       pgi->p50_us, pgi->p50_us / get4k.p50);
	printf("%-34s %7.2f GB/s %7.2f GB/s %9.2fx\n", "16 MiB get_into a registered Buffer",
	       c_gbs, pb->gbs, pb->gbs / c_gbs);
	printf("%-34s %12s %7.2f GB/s\n", "16 MiB get_into a bytearray", "", pp->gbs);
	printf("memcpy of the same 16 MiB in this run: %.2f GB/s; Python get_into a Buffer is "
	       "%.0f%% of it\n", memcpy_gbs, 100 * pb->gbs / memcpy_gbs);
	return 0;
}
