/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench engine: the load an inference engine makes, shaped by a
 * model.  A fresh process (engine A) stores N prompts' KV blocks; another
 * fresh process (engine B) finds them and loads them into its own KV cache,
 * on the same node and then (as root, two namespaced hosts) on the other
 * node.  It prints the lookup phase and the data phase apart, GB/s and
 * tokens of KV loaded per second, against limits measured in the same run:
 * warm memcpy, a fresh process copying out of memory another one filled,
 * and iperf3 between the same hosts.  The daemons run their defaults.
 */
#include <sys/mman.h>

#include "bench.h"

struct model {
	const char *name;
	unsigned layers, kv_heads, head_dim, dtype_bytes;
};

static const struct model models[] = {
	{ "llama3-8b", 32, 8, 128, 2 },
	{ "llama3-70b", 80, 8, 128, 2 },
	{ "qwen2-7b", 28, 4, 128, 2 },
	{ "mistral-7b", 32, 8, 128, 2 },
};

#define BLOCK_TOKENS 16

/* options (main.c) */
const char *arg_model = "llama3-8b";
unsigned arg_prompts = 8, arg_prompt_tokens = 1024, arg_tp = 1;
/* Seconds the daemon took to fault a registered cache in (longest rank). */
static double buffer_warm_s;
bool arg_layerwise;
bool arg_across_only; /* only the load from the other node */

struct shape {
	const struct model *m;
	unsigned blocks;        /* per prompt */
	unsigned objects;       /* per block and rank: 1, or layers when layerwise */
	uint64_t object_bytes;  /* one object */
	uint64_t rank_bytes;    /* one rank's share of every prompt */
};

static void shape_of(struct shape *s)
{
	s->m = NULL;
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		if (!strcmp(models[i].name, arg_model))
			s->m = &models[i];
	if (!s->m)
		die(0, "unknown --model %s (llama3-8b, llama3-70b, qwen2-7b, mistral-7b)", arg_model);
	if (arg_tp == 0 || s->m->kv_heads % arg_tp)
		die(0, "--tp %u does not divide the model's %u KV heads", arg_tp, s->m->kv_heads);
	s->blocks = arg_prompt_tokens / BLOCK_TOKENS;
	if (!s->blocks)
		die(0, "%s", "--prompt-tokens is less than a block");
	s->objects = arg_layerwise ? s->m->layers : 1;
	/* K and V of every layer (or one) for 16 tokens of this rank's heads */
	s->object_bytes = (uint64_t) 2 * BLOCK_TOKENS * (s->m->kv_heads / arg_tp) * s->m->head_dim *
			  s->m->dtype_bytes * (arg_layerwise ? 1 : s->m->layers);
	s->rank_bytes = (uint64_t) arg_prompts * s->blocks * s->objects * s->object_bytes;
}

static void key_of(char *buf, size_t len, unsigned rank, unsigned prompt, unsigned block,
		   unsigned layer)
{
	int n = snprintf(buf, len, "kv1@bench/%s@bfloat16@vllm-%s@b%u@tp%uof%u@%08x%08x", arg_model,
			 arg_layerwise ? "NHD-layer" : "NHD", BLOCK_TOKENS, rank, arg_tp,
			 prompt * 2654435761u, block);

	if (arg_layerwise && n > 0 && (size_t) n < len)
		snprintf(buf + n, len - (size_t) n, "-%u", layer);
}

static uint8_t fill_byte(unsigned rank, uint64_t off)
{
	return (uint8_t) (off * 131 + (off >> 12) + rank * 7);
}

/* A fresh process: what it prints goes to out (a pipe the parent reads). */
typedef void (*engine_fn)(const char *sock, unsigned rank, const struct shape *s, FILE *out);

static pid_t run_fresh(engine_fn fn, const char *sock, unsigned rank, const struct shape *s,
		       FILE **ret)
{
	int p[2];
	pid_t pid;

	if (pipe(p) < 0)
		die(errno, "%s", "pipe");
	pid = fork();
	if (pid < 0)
		die(errno, "%s", "fork");
	if (pid == 0) {
		FILE *out = fdopen(p[1], "w");

		close(p[0]);
		fn(sock, rank, s, out);
		fclose(out);
		_exit(0);
	}
	close(p[1]);
	*ret = fdopen(p[0], "r");
	return pid;
}

static double read_figure(FILE *f, const char *name)
{
	char line[256], pat[64];
	double v = -1;

	snprintf(pat, sizeof(pat), "%s ", name);
	rewind(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, pat, strlen(pat)))
			v = strtod(line + strlen(pat), NULL);
	return v;
}

/* Engine A: its KV cache (warm: computed), every prompt's blocks stored,
 * one chained batch per prompt. */
static void engine_store(const char *sock, unsigned rank, const struct shape *s, FILE *out)
{
	uint64_t per_prompt = (uint64_t) s->blocks * s->objects;
	uint8_t *cache = malloc(s->rank_bytes);
	char (*keys)[160] = calloc(per_prompt, sizeof(*keys));
	const char **kp = calloc(per_prompt, sizeof(*kp));
	struct kvc_iovec *iov = calloc(per_prompt, sizeof(*iov));
	const struct kvc_iovec **iovp = calloc(per_prompt, sizeof(*iovp));
	size_t *n_iov = calloc(per_prompt, sizeof(*n_iov));
	int *res = calloc(per_prompt, sizeof(*res));
	struct kvc_put_opts o = { .flags = KVC_PUT_CHAIN };
	struct kvc_client *c;
	uint64_t t0, t = 0;

	if (!cache || !keys || !kp || !iov || !iovp || !n_iov || !res)
		die(0, "%s", "out of memory");
	for (uint64_t i = 0; i < s->rank_bytes; i++)
		cache[i] = fill_byte(rank, i);
	check(kvc_connect(sock, &c), "connect");
	for (unsigned p = 0; p < arg_prompts; p++) {
		uint64_t n = 0;

		for (unsigned b = 0; b < s->blocks; b++)
			for (unsigned l = 0; l < s->objects; l++, n++) {
				key_of(keys[n], sizeof(keys[n]), rank, p, b, l);
				kp[n] = keys[n];
				iov[n] = (struct kvc_iovec) {
					cache + ((uint64_t) p * per_prompt + n) * s->object_bytes,
					s->object_bytes };
				iovp[n] = &iov[n];
				n_iov[n] = 1;
			}
		t0 = now_ns();
		if (kvc_batch_put(c, n, kp, iovp, n_iov, &o, res) != (int) n)
			die(0, "engine A: a put failed: %s", kvc_strerror(res[0]));
		t += now_ns() - t0;
	}
	fprintf(out, "store_s %.6f\n", (double) t / 1e9);
	kvc_disconnect(c);
}

/* Engine B: a fresh process with its own (warm) KV cache; per prompt, the
 * lookup of every block, then the load: copied by the library
 * (kvc_batch_get), or with registered=1 by the daemon into a registered
 * buffer that is the cache (kvc_batch_get_into). */
static void engine_load(const char *sock, unsigned rank, const struct shape *s, FILE *out,
			bool registered)
{
	uint64_t per_prompt = (uint64_t) s->blocks * s->objects, bad = 0;
	char (*keys)[160] = calloc(per_prompt, sizeof(*keys));
	const char **kp = calloc(per_prompt, sizeof(*kp));
	struct kvc_iovec *iov = calloc(per_prompt, sizeof(*iov));
	const struct kvc_iovec **iovp = calloc(per_prompt, sizeof(*iovp));
	struct kvc_iov *riov = calloc(per_prompt, sizeof(*riov));
	const struct kvc_iov **riovp = calloc(per_prompt, sizeof(*riovp));
	size_t *n_iov = calloc(per_prompt, sizeof(*n_iov));
	ssize_t *res = calloc(per_prompt, sizeof(*res));
	struct kvc_buffer buf = { 0 };
	struct kvc_client *c;
	uint64_t tl = 0, td = 0, hits = 0, t0, before = 0;
	double warm_s;
	uint8_t *cache;

	if (!keys || !kp || !iov || !iovp || !riov || !riovp || !n_iov || !res)
		die(0, "%s", "out of memory");
	check(kvc_connect(sock, &c), "connect");
	if (registered) {
		before = counter(c, "buffer_prefaulted_bytes");
		check(kvc_buffer_alloc(c, s->rank_bytes, &buf), "buffer_alloc");
		cache = buf.data;
	} else {
		cache = malloc(s->rank_bytes);
		if (!cache)
			die(0, "%s", "out of memory");
	}
	/* the engine's cache is in use: warm (not 0, which a compiler may turn
	 * into calloc() and leave untouched) */
	memset(cache, 0x5a, s->rank_bytes);
	/* An engine registers its cache at start, long before it loads: the
	 * daemon has faulted the buffer in by then (--prefault; at most 60 s) */
	t0 = now_ns();
	for (int i = 0; registered && i < 3000; i++) {
		if (counter(c, "buffer_prefaulted_bytes") - before >= s->rank_bytes)
			break;
		usleep(20 * 1000);
	}
	warm_s = (double) (now_ns() - t0) / 1e9;
	for (unsigned p = 0; p < arg_prompts; p++) {
		uint64_t n = 0;
		int hit;

		for (unsigned b = 0; b < s->blocks; b++)
			for (unsigned l = 0; l < s->objects; l++, n++) {
				uint64_t off = ((uint64_t) p * per_prompt + n) * s->object_bytes;

				key_of(keys[n], sizeof(keys[n]), rank, p, b, l);
				kp[n] = keys[n];
				iov[n] = (struct kvc_iovec) { cache + off, s->object_bytes };
				iovp[n] = &iov[n];
				riov[n] = (struct kvc_iov) { &buf, off, s->object_bytes };
				riovp[n] = &riov[n];
				n_iov[n] = 1;
			}
		t0 = now_ns();
		hit = kvc_prefix_lookup(c, kp, n);
		tl += now_ns() - t0;
		if (hit != (int) n)
			die(0, "engine B: prompt %u: %d of %" PRIu64 " found", p, hit, n);
		t0 = now_ns();
		if (registered)
			hit = kvc_batch_get_into(c, n, kp, riovp, n_iov, res);
		else
			hit = kvc_batch_get(c, n, kp, (const struct kvc_iovec *const *) iovp, n_iov, res);
		td += now_ns() - t0;
		if (hit != (int) n)
			die(0, "engine B: prompt %u: %d of %" PRIu64 " loaded", p, hit, n);
		hits += n;
	}
	for (uint64_t i = 0; i < s->rank_bytes; i += 4093)
		bad += cache[i] != fill_byte(rank, i);
	fprintf(out, "lookup_s %.6f\ndata_s %.6f\nobjects %" PRIu64 "\nbad %" PRIu64
		"\nbuffer_warm_s %.3f\n", (double) tl / 1e9, (double) td / 1e9, hits, bad, warm_s);
	if (registered)
		kvc_buffer_free(c, &buf);
	kvc_disconnect(c);
}

static void engine_load_copy(const char *sock, unsigned rank, const struct shape *s, FILE *out)
{
	engine_load(sock, rank, s, out, false);
}

static void engine_load_registered(const char *sock, unsigned rank, const struct shape *s,
				   FILE *out)
{
	engine_load(sock, rank, s, out, true);
}

/* Engine B through the Python adapters' core (kvcache.engine.BlockStore
 * over a vLLM FlashAttention cache of CPU tensors): a fresh interpreter. */
static void engine_load_python(const char *sock, unsigned rank, const struct shape *s, FILE *out)
{
	const char *py = getenv("KVCACHE_PYTHON");
	char dir[4200], path[8500], a[7][32];
	const char *old = getenv("PYTHONPATH");

	if (arg_layerwise)
		_exit(3); /* the adapters store whole blocks */
	if (!py)
		py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
	if (build_python_dir(dir, sizeof(dir))) {
		snprintf(path, sizeof(path), "%s%s%s", dir, old ? ":" : "", old ? old : "");
		setenv("PYTHONPATH", path, 1);
	}
	snprintf(a[0], sizeof(a[0]), "%u", s->m->layers);
	snprintf(a[1], sizeof(a[1]), "%u", s->m->kv_heads / arg_tp);
	snprintf(a[2], sizeof(a[2]), "%u", s->m->head_dim);
	snprintf(a[3], sizeof(a[3]), "%u", arg_prompts);
	snprintf(a[4], sizeof(a[4]), "%u", s->blocks);
	snprintf(a[5], sizeof(a[5]), "%u", rank);
	snprintf(a[6], sizeof(a[6]), "%u", arg_tp);
	fflush(out);
	dup2(fileno(out), 1);
	execlp(py, py, "-m", "kvcache.bench", "--engine", "--socket", sock, "--model", arg_model,
	       "--layers", a[0], "--kv-heads", a[1], "--head-dim", a[2], "--prompts", a[3],
	       "--blocks", a[4], "--rank", a[5], "--tp", a[6], (char *) NULL);
	_exit(127);
}

/* Every rank at once, each a fresh process; fills the slowest rank's
 * times (what the engine waits for). */
static void ranks(engine_fn fn, const char *sock, const struct shape *s, double *ret_store,
		  double *ret_lookup, double *ret_data)
{
	FILE *f[64];
	pid_t pid[64];

	*ret_store = *ret_lookup = *ret_data = 0;
	for (unsigned r = 0; r < arg_tp; r++)
		pid[r] = run_fresh(fn, sock, r, s, &f[r]);
	for (unsigned r = 0; r < arg_tp; r++) {
		char buf[4096];
		size_t got = fread(buf, 1, sizeof(buf) - 1, f[r]);
		FILE *m;
		int st;

		buf[got] = '\0';
		if (waitpid(pid[r], &st, 0) != pid[r] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fclose(f[r]);
			if (fn == engine_load_python) { /* no torch, no module: say so */
				*ret_data = -1;
				continue;
			}
			die(0, "engine rank %u failed", r);
		}
		m = fmemopen(buf, got + 1, "r");
		if (read_figure(m, "bad") > 0)
			die(0, "engine rank %u loaded wrong bytes", r);
		if (read_figure(m, "store_s") > *ret_store)
			*ret_store = read_figure(m, "store_s");
		if (read_figure(m, "lookup_s") > *ret_lookup)
			*ret_lookup = read_figure(m, "lookup_s");
		if (read_figure(m, "data_s") > *ret_data)
			*ret_data = read_figure(m, "data_s");
		if (read_figure(m, "buffer_warm_s") > buffer_warm_s)
			buffer_warm_s = read_figure(m, "buffer_warm_s");
		fclose(m);
		fclose(f[r]);
	}
}

/* A rank's share (s->rank_bytes at src, whole-block objects) into a vLLM
 * FlashAttention cache at dst, as the Python adapters load it: per layer,
 * a K tensor and a V tensor of every block, so each block's object goes
 * in 2 x layers pieces, each into its layer's tensor. */
static void copy_into_layout(const struct shape *s, uint8_t *dst, const uint8_t *src)
{
	uint64_t nb = s->rank_bytes / s->object_bytes, pieces = 2ull * s->m->layers;
	uint64_t piece = s->object_bytes / pieces;

	for (uint64_t k = 0; k < nb; k++)
		for (uint64_t j = 0; j < pieces; j++) /* layer j / 2, K or V */
			memcpy(dst + (j / 2) * 2 * nb * piece + ((j & 1) * nb + k) * piece,
			       src + k * s->object_bytes + j * piece, piece);
}

/* Limits: warm memcpy of this much, and a fresh process copying out of a
 * memfd another one filled (each page's first touch in a new mapping).
 * With layout, the warm copy into that shape's FlashAttention layout
 * instead (copy_into_layout()): a contiguous memcpy is not that copy's
 * limit, the same bytes in that pattern moved 85-88% as fast on the bench
 * host. */
static double limit_warm(uint64_t bytes, const struct shape *layout)
{
	uint8_t *a = malloc(bytes), *b = malloc(bytes);
	uint64_t t0;
	double best = 0;

	if (!a || !b)
		die(0, "%s", "out of memory");
	memset(a, 1, bytes);
	memset(b, 2, bytes);
	for (int i = 0; i < 3; i++) {
		double g;

		t0 = now_ns();
		if (layout)
			copy_into_layout(layout, b, a);
		else
			memcpy(b, a, bytes);
		g = (double) bytes / (double) (now_ns() - t0);
		if (g > best)
			best = g;
	}
	free(a);
	free(b);
	return best;
}

static double limit_fresh(uint64_t bytes)
{
	int fd = memfd_create("kvcache-bench", MFD_CLOEXEC), p[2];
	uint8_t *a;
	double g = 0;
	pid_t pid;

	if (fd < 0 || ftruncate(fd, (off_t) bytes) < 0 || pipe(p) < 0)
		die(errno, "%s", "memfd");
	a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a == MAP_FAILED)
		die(errno, "%s", "mmap");
	memset(a, 3, bytes);
	pid = fork();
	if (pid == 0) {
		uint8_t *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0), *d = malloc(bytes);
		uint64_t t0;

		if (m == MAP_FAILED || !d)
			_exit(1);
		memset(d, 4, bytes);
		t0 = now_ns();
		memcpy(d, m, bytes);
		g = (double) bytes / (double) (now_ns() - t0);
		if (write(p[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		_exit(0);
	}
	if (read(p[0], &g, sizeof(g)) != sizeof(g))
		g = 0;
	waitpid(pid, NULL, 0);
	munmap(a, bytes);
	close(fd);
	close(p[0]);
	close(p[1]);
	return g;
}

static void report(const char *what, const struct shape *s, double lookup, double data,
		   double warm, double fresh, double link)
{
	double bytes = (double) s->rank_bytes * arg_tp;
	double tokens = (double) arg_prompts * s->blocks * BLOCK_TOKENS;
	double gbs = data > 0 ? bytes / data / 1e9 : 0;

	printf("%-26s lookup %7.1f ms  data %7.1f ms  %6.2f GB/s  %9.0f tokens/s", what,
	       lookup * 1e3, data * 1e3, gbs, data > 0 ? tokens / data : 0);
	if (link > 0)
		printf("  %3.0f%% of iperf3\n", 100 * gbs / link);
	else
		printf("  %3.0f%% of warm memcpy, %3.0f%% of a fresh mapping\n", 100 * gbs / warm,
		       100 * gbs / fresh);
}

/* B's copies of what A stored go (A keeps its own): the next load on B
 * fetches again. */
static void drop_replicas(const char *sb)
{
	struct kvc_client *b;

	check(kvc_connect(sb, &b), "connect B");
	kvc_set_get_flags(b, KVC_LOCAL_ONLY);
	if (kvc_remove_prefix(b, "kv1@bench/", KVC_REMOVE_FORCE, NULL) < 0)
		die(0, "%s", "dropping B's replicas");
	kvc_disconnect(b);
	usleep(500000); /* the directory hears of withdrawals in batches */
}

/* The store, then the loads on the same node: by copy, into a registered
 * cache, through the Python adapters. */
static void same_node(const char *sock, const struct shape *s, double warm, double fresh)
{
	double store, lookup, data;

	ranks(engine_store, sock, s, &store, &lookup, &data);
	printf("%-26s %.1f ms, %.2f GB/s\n", "engine A stores", store * 1e3,
	       (double) s->rank_bytes * arg_tp / store / 1e9);
	ranks(engine_load_copy, sock, s, &store, &lookup, &data);
	report("engine B, same node", s, lookup, data, warm, fresh, 0);
	ranks(engine_load_registered, sock, s, &store, &lookup, &data);
	report("engine B, registered cache", s, lookup, data, warm, fresh, 0);
	printf("  (the daemon faulted each registered cache in %.1f s after it was made, "
	       "before the loads)\n", buffer_warm_s);
	ranks(engine_load_python, sock, s, &store, &lookup, &data);
	if (data > 0) {
		double layout = limit_warm(s->rank_bytes, s);
		double gbs = (double) s->rank_bytes * arg_tp / data / 1e9;

		report("engine B, Python adapters", s, lookup, data, warm, fresh, 0);
		printf("  (%.0f%% of a warm copy into the FlashAttention layout the adapters fill, "
		       "%.2f GB/s: %u pieces a block)\n", 100 * gbs / layout, layout,
		       2 * s->m->layers);
	} else
		printf("engine B, Python adapters: did not run (torch, the kvcache module%s)\n",
		       arg_layerwise ? "; whole blocks only" : "");
}

int run_engine(void)
{
	struct shape s;
	char sock[256], sb[256];
	double store, lookup, data, warm, fresh, link;
	struct kvc_client *c;
	struct kvc_status *st;
	bool huge;

	char dram[32];

	shape_of(&s);
	if ((uint64_t) s.blocks * s.objects > 4096)
		die(0, "%s", "a prompt of more than 4096 objects: fewer --prompt-tokens");
	bench_setup();
	/* room for every rank's share, with the default 1 GiB at least */
	snprintf(dram, sizeof(dram), "%" PRIu64 "MiB",
		 ((s.rank_bytes * arg_tp * 3 / 2) >> 20) + 1024);
	start_daemon_args(sock, sizeof(sock), (const char *const[]) { "--dram-size", dram, NULL });
	check(kvc_connect(sock, &c), "connect");
	check(kvc_status_get(c, &st), "status");
	huge = st->hugepages;
	kvc_status_free(st);
	kvc_disconnect(c);
	printf("kvcache-bench engine: %s (%u layers, %u KV heads x %u, bf16), %u-token blocks, "
	       "TP %u, %s objects of %.0f KiB; %u prompts of %u tokens: %.1f MiB per rank; the "
	       "daemon on its defaults (%s pages)\n", arg_model, s.m->layers, s.m->kv_heads,
	       s.m->head_dim, BLOCK_TOKENS, arg_tp, arg_layerwise ? "per-layer" : "whole-block",
	       (double) s.object_bytes / 1024, arg_prompts, arg_prompt_tokens,
	       (double) s.rank_bytes / (1 << 20), huge ? "2 MiB" : "4 KiB");
	warm = limit_warm(s.rank_bytes, NULL);
	fresh = limit_fresh(s.rank_bytes);
	wait_prefault(sock);
	printf("limits in this run: warm memcpy %.2f GB/s, a fresh process copying out of "
	       "memory another filled %.2f GB/s\n", warm, fresh);
	if (!arg_across_only)
		same_node(sock, &s, warm, fresh);
	kill(daemon_pid, SIGTERM);
	waitpid(daemon_pid, NULL, 0);
	daemon_pid = 0;
	if (geteuid() != 0) {
		printf("across nodes: skipped (two hosts are network namespaces: run as root)\n");
		return 0;
	}
	cluster_up(sock, sb, &link, dram);
	wait_prefault(sock);
	wait_prefault(sb);
	ranks(engine_store, sock, &s, &store, &lookup, &data);
	ranks(engine_load_copy, sb, &s, &store, &lookup, &data);
	printf("link A->B: iperf3 %.2f GB/s (one stream, the same hosts, this run)\n", link);
	report("engine B, other node", &s, lookup, data, warm, fresh, link);
	drop_replicas(sb);
	ranks(engine_load_registered, sb, &s, &store, &lookup, &data);
	report("engine B, other, registered", &s, lookup, data, warm, fresh, link);
	printf("  (the daemon faulted each registered cache in %.1f s after it was made, "
	       "before the loads)\n", buffer_warm_s);
	check(kvc_connect(sock, &c), "connect");
	printf("node A served %" PRIu64 " object(s), %" PRIu64 " with a checksum known before "
	       "(%" PRIu64 " taken ahead in the background, %" PRIu64 " left to be hashed as "
	       "sent)\n", counter(c, "remote_served"), counter(c, "remote_served_summed"),
	       counter(c, "sums_ahead"), counter(c, "sums_ahead_skipped"));
	kvc_disconnect(c);
	return 0;
}
