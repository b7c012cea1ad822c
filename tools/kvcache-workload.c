/* SPDX-License-Identifier: MIT */
/*
 * kvcache-workload — what an inference engine does with a KV pool, in small.
 *
 * Prompts share a system-prompt prefix and are cut into fixed-size KV blocks
 * (Llama-3-8B shape by default: 16 tokens x 32 layers x K,V x 8 heads x 128
 * dims x fp16 = 2 MiB).  Each block's key chains the hash of its prefix, as
 * vLLM's prefix caching does.  Engine A (prefill) looks up how much of each
 * prompt is cached and stores the rest; engine B, a separate process, finds
 * every prompt fully cached, loads all blocks and checks every byte.  B
 * loads as the engine adapters do: each prompt's cached blocks in one
 * kvc_batch_get_into() into its KV region, a buffer registered once at
 * start (--per-block-get: one kvc_get() a block, into private memory).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "clock.h"

static const char *arg_socket;
static const char *arg_cluster; /* engine B's daemon, on another node */
static double arg_link_gbs;     /* the link's GB/s measured in the same run (0: none) */
static bool arg_per_block;      /* engine B loads a block a kvc_get() */
static unsigned arg_prompts = 24, arg_blocks = 16, arg_shared = 4;
static uint64_t arg_block_size = 16 * 32 * 2 * 8 * 128 * 2;

#define KEY_LEN 96

static double now_s(void)
{
	return (double) mono_ns() / 1e9;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= UINT64_C(0xff51afd7ed558ccd);
	x ^= x >> 33;
	x *= UINT64_C(0xc4ceb9fe1a85ec53);
	return x ^ (x >> 33);
}

/* Content hash of block b of prompt p: blocks before arg_shared are the
 * shared system prompt, the same for every prompt. */
static uint64_t block_content(unsigned p, unsigned b)
{
	return b < arg_shared ? mix(0x5157 + b) : mix((uint64_t) p << 32 | b);
}

/* key = model@tp_rank@hash(prefix hash, this block's tokens), 64 hex chars;
 * kp[] points at them, as kvc_prefix_lookup() wants */
static void block_keys(unsigned p, char (*keys)[KEY_LEN], uint64_t *seeds, const char **kp)
{
	uint64_t h = 0;

	for (unsigned b = 0; b < arg_blocks; b++) {
		h = mix(h ^ block_content(p, b));
		seeds[b] = h;
		snprintf(keys[b], KEY_LEN, "llama3-8b@tp_rank:0@%016" PRIx64 "%016" PRIx64 "%016" PRIx64
			 "%016" PRIx64, h, mix(h + 1), mix(h + 2), mix(h + 3));
		kp[b] = keys[b];
	}
}

/* fp16 values of a KV tensor: small magnitudes, both signs, no NaN/Inf */
static inline uint64_t kv_word(uint64_t seed, uint64_t i)
{
	uint64_t r = mix(seed + i), w = 0;

	for (int k = 0; k < 4; k++) {
		uint16_t bits = (uint16_t) (r >> (16 * k));
		uint16_t h = (uint16_t) ((bits & 0x8000) | (uint16_t) (0x2c00 + (bits & 0x0fff) * 2));

		w |= (uint64_t) h << (16 * k);
	}
	return w;
}

static void kv_fill(void *buf, uint64_t len, uint64_t seed)
{
	uint64_t *w = buf;

	for (uint64_t i = 0; i < len / 8; i++)
		w[i] = kv_word(seed, i);
}

static int kv_check(const void *buf, uint64_t len, uint64_t seed)
{
	const uint64_t *w = buf;

	for (uint64_t i = 0; i < len / 8; i++)
		if (w[i] != kv_word(seed, i))
			return -EBADMSG;
	return 0;
}

static int connect_or_say(const char *sock, struct kvc_client **c)
{
	int r = kvc_connect(sock, c);

	if (r < 0) {
		char path[108] = "?";

		kvc_socket_path(sock, path, sizeof(path));
		fprintf(stderr, "kvcache-workload: cannot reach kvcached at %s: %s\n", path,
			kvc_strerror(r));
	}
	return r;
}

/* Engine A: look up, store what is missing. */
static int prefill(void)
{
	char (*keys)[KEY_LEN] = calloc(arg_blocks, KEY_LEN);
	uint64_t *seeds = calloc(arg_blocks, sizeof(*seeds));
	const char **kp = calloc(arg_blocks, sizeof(*kp));
	unsigned stored = 0, reused = 0;
	struct kvc_client *c;
	double t0;
	int r;

	if (!keys || !seeds || !kp || connect_or_say(arg_socket, &c) < 0)
		return 1;
	t0 = now_s();
	for (unsigned p = 0; p < arg_prompts; p++) {
		int hit;

		block_keys(p, keys, seeds, kp);
		hit = kvc_prefix_lookup(c, kp, arg_blocks);
		if (hit < 0) {
			fprintf(stderr, "prefix lookup: %s\n", kvc_strerror(hit));
			return 1;
		}
		reused += (unsigned) hit;
		for (unsigned b = (unsigned) hit; b < arg_blocks; b++) {
			struct kvc_put_opts o = { .parent_key = b ? keys[b - 1] : NULL };
			struct kvc_buf buf;

			/* compute the KV straight into the pool: no extra copy */
			r = kvc_reserve(c, keys[b], arg_block_size, &o, &buf);
			if (r < 0) {
				fprintf(stderr, "reserve %s: %s (%s)\n", keys[b], kvc_strerror(r),
					kvc_last_error_msg());
				return 1;
			}
			kv_fill(buf.data, buf.len, seeds[b]);
			r = kvc_commit(c, &buf);
			if (r < 0) {
				fprintf(stderr, "commit %s: %s\n", keys[b], kvc_strerror(r));
				return 1;
			}
			stored++;
		}
	}
	printf("engine A (prefill): %u prompts x %u blocks of %.1f MiB: stored %u blocks, "
	       "reused %u from the shared prefix, %.2f s\n",
	       arg_prompts, arg_blocks, (double) arg_block_size / (1 << 20), stored, reused,
	       now_s() - t0);
	kvc_disconnect(c);
	free(keys);
	free(seeds);
	free(kp);
	return 0;
}

/* Engine B, another process: every prompt is cached; load and verify. */
static int decode(void)
{
	char (*keys)[KEY_LEN] = calloc(arg_blocks, KEY_LEN);
	uint64_t *seeds = calloc(arg_blocks, sizeof(*seeds));
	const char **kp = calloc(arg_blocks, sizeof(*kp));
	struct kvc_iov *iov = calloc(arg_blocks, sizeof(*iov));
	const struct kvc_iov **iop = calloc(arg_blocks, sizeof(*iop));
	size_t *n_iov = calloc(arg_blocks, sizeof(*n_iov));
	ssize_t *res = calloc(arg_blocks, sizeof(*res));
	uint8_t *engine_buf = NULL;
	struct kvc_buffer kv = { 0 };
	unsigned loaded = 0, bad = 0, full = 0;
	struct kvc_client *c;
	double t_load = 0, t_lookup = 0, t0, gbs;
	int r;

	if (!keys || !seeds || !kp || !iov || !iop || !n_iov || !res ||
	    connect_or_say(arg_cluster ? arg_cluster : arg_socket, &c) < 0)
		return 1;
	/* the engine's KV region: one prompt's blocks */
	if (arg_per_block)
		engine_buf = malloc(arg_block_size);
	else if ((r = kvc_buffer_alloc(c, (size_t) arg_blocks * arg_block_size, &kv)) < 0) {
		fprintf(stderr, "kvcache-workload: registering the KV region: %s\n", kvc_strerror(r));
		return 1;
	}
	if (arg_per_block && !engine_buf)
		return 1;
	for (unsigned b = 0; b < arg_blocks; b++) {
		iov[b] = (struct kvc_iov) { &kv, (uint64_t) b * arg_block_size, arg_block_size };
		iop[b] = &iov[b];
		n_iov[b] = 1;
	}
	t0 = now_s();
	for (unsigned p = 0; p < arg_prompts; p++) {
		int hit;

		block_keys(p, keys, seeds, kp);
		t_lookup -= now_s();
		hit = kvc_prefix_lookup(c, kp, arg_blocks);
		t_lookup += now_s();
		if (hit < 0)
			return 1;
		full += (unsigned) hit == arg_blocks;
		if (!arg_per_block && hit > 0) {
			double t = now_s();

			r = kvc_batch_get_into(c, (size_t) hit, kp, iop, n_iov, res);
			t_load += now_s() - t;
			if (r < 0) {
				fprintf(stderr, "kvcache-workload: batch load: %s\n", kvc_strerror(r));
				return 1;
			}
			for (unsigned b = 0; b < (unsigned) hit; b++) {
				uint8_t *at = (uint8_t *) kv.data + (size_t) b * arg_block_size;

				if (res[b] != (ssize_t) arg_block_size ||
				    kv_check(at, arg_block_size, seeds[b]) < 0)
					bad++;
				loaded++;
			}
			continue;
		}
		for (unsigned b = 0; b < (unsigned) hit; b++) {
			double t = now_s();
			ssize_t n = kvc_get(c, keys[b], engine_buf, arg_block_size);

			t_load += now_s() - t;
			if (n != (ssize_t) arg_block_size || kv_check(engine_buf, (uint64_t) n, seeds[b]) < 0)
				bad++;
			loaded++;
		}
	}
	gbs = t_load > 0 ? (double) loaded * (double) arg_block_size / t_load / 1e9 : 0.0;
	printf("engine B (decode, pid %d%s): %u/%u prompts fully cached, loaded %u blocks "
	       "(%.1f MiB, %s) in %.3f s of load time = %.2f GB/s, %u bad blocks, total %.2f s "
	       "(lookups %.3f s)\n",
	       (int) getpid(), arg_cluster ? ", on the other node" : "", full, arg_prompts, loaded,
	       (double) loaded * (double) arg_block_size / (1 << 20),
	       arg_per_block ? "a kvc_get a block" : "a kvc_batch_get_into a prompt", t_load, gbs,
	       bad, now_s() - t0, t_lookup);
	if (arg_link_gbs > 0)
		printf("engine B loaded at %.0f%% of the link (iperf3 between the same hosts in this "
		       "run: %.2f GB/s)\n", 100.0 * gbs / arg_link_gbs, arg_link_gbs);
	if (kv.data)
		kvc_buffer_free(c, &kv);
	kvc_disconnect(c);
	free(engine_buf);
	free(keys);
	free(seeds);
	free(kp);
	free(iov);
	free(iop);
	free(n_iov);
	free(res);
	if (bad || full != arg_prompts) {
		fprintf(stderr, "kvcache-workload: verification FAILED\n");
		return 1;
	}
	printf("verification: every byte of every block matched\n");
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvcache-workload [--socket PATH] [--prompts N] [--blocks N] "
		   "[--shared N] [--block-size SIZE]\n"
		   "                        [--cluster PATH] [--link-gbs X]\n"
		   "  --cluster PATH   engine B uses the kvcached at PATH (another node of the\n"
		   "                   same cluster): everything it loads crosses nodes\n"
		   "  --link-gbs X     the link's GB/s measured in this run: B's load is put\n"
		   "                   beside it\n"
		   "  --per-block-get  engine B loads a block a kvc_get() into private memory\n"
		   "                   (default: a prompt's blocks a kvc_batch_get_into() into\n"
		   "                   a registered buffer, as the engine adapters load)\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "prompts", required_argument, NULL, 'p' },
		{ "blocks", required_argument, NULL, 'b' },
		{ "shared", required_argument, NULL, 'S' },
		{ "block-size", required_argument, NULL, 'z' },
		{ "cluster", required_argument, NULL, 'c' },
		{ "link-gbs", required_argument, NULL, 'l' },
		{ "per-block-get", no_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	pid_t pid;
	int opt, r;

	while ((opt = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			arg_socket = optarg;
			break;
		case 'c':
			arg_cluster = optarg;
			break;
		case 'l':
			arg_link_gbs = strtod(optarg, NULL);
			break;
		case 'g':
			arg_per_block = true;
			break;
		case 'p':
			arg_prompts = (unsigned) strtoul(optarg, NULL, 10);
			break;
		case 'b':
			arg_blocks = (unsigned) strtoul(optarg, NULL, 10);
			break;
		case 'S':
			arg_shared = (unsigned) strtoul(optarg, NULL, 10);
			break;
		case 'z':
			if (kvc_parse_size(optarg, &arg_block_size) < 0 || arg_block_size < 8 ||
			    arg_block_size % 8) {
				fprintf(stderr, "invalid --block-size '%s'\n", optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!arg_prompts || !arg_blocks || arg_shared > arg_blocks) {
		usage(stderr);
		return 2;
	}
	r = prefill();
	if (r)
		return r;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		r = decode();
		fflush(stdout);
		_exit(r);
	}
	while (waitpid(pid, &r, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(r) ? WEXITSTATUS(r) : 1;
}
