/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench: what the cases share (options, timing, results, counters,
 * the private daemon).  One file per case: local.c (the fast path, with
 * peers.c for memcached and Redis), churn.c, pressure.c, disk.c; main.c
 * parses the command line.
 */
#pragma once

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

#include "clock.h"
#include "kvc-config.h"
#include <kvcache/kvcache.h>

#define MAX_SAMPLES 4000000
#define MAX_SIZES 16

/* options (main.c) */
extern double arg_duration;
extern bool arg_json, arg_peers, arg_zstd, arg_fill_disk, arg_leased;
extern const char *arg_dir, *arg_socket, *arg_kvcached, *arg_ops, *arg_plot;
extern uint64_t arg_sizes[MAX_SIZES], arg_objects, arg_pinned;
#define MAX_ROUNDS 50
extern bool arg_local_only; /* cluster: only local requests while B fetches */
extern unsigned arg_rounds; /* cluster: each figure is the median of this many */
extern size_t n_sizes;

/* splitmix64: deterministic values and keys */
static inline uint64_t bench_rand(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* state (common.c) */
extern uint64_t *lat;        /* latency samples, ns */
extern pid_t daemon_pid;     /* the private daemon, 0 = none */
extern char tmpdir[64];

static inline uint64_t now_ns(void)
{
	return mono_ns();
}

#define MAX_THREADS 64

struct counters {
	int self;
	int server[MAX_THREADS];
	int n_server;
};

void counters_init(struct counters *c, pid_t server);
void counters_done(struct counters *c);
void counters_start(struct counters *c);
void counters_stop(struct counters *c, int64_t *self, int64_t *server);

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

void finish(struct result *r, uint64_t n, uint64_t t0, uint64_t t1, int64_t sc, int64_t sd);
double ops_s(const struct result *r);
double gb_s(const struct result *r);
double memcpy_cycle(uint8_t *const *dsts, const uint8_t *const *srcs, size_t n, uint64_t size);
void size_name(char *buf, size_t len, uint64_t s);
void print_header(void);
void print_result(const struct result *r);
void json_result(FILE *f, const struct result *r, const char *system, bool comma);

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

/* Latency samples and the run's temporary directory (tmpdir). */
void bench_setup(void);
void die(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void check(int r, const char *what);
bool want_op(const char *op);

/* A private kvcached on a socket in tmpdir, with extra arguments
 * (NULL-terminated); stop_daemon() ends it. */
void start_daemon_args(char *sock, size_t len, const char *const *extra);
void start_daemon(char *sock, size_t len, const char *dram, const char *lease_ms);
void stop_daemon(void);
uint64_t pool_capacity(struct kvc_client *c);
uint64_t counter(struct kvc_client *c, const char *name);
/* disk.c: kvcache-bench disk --shared */
int run_shared(const char *dir, const uint64_t *sizes, size_t n);
/* Until the daemon at sock has faulted its tiers in (--prefault): seconds. */
double wait_prefault(const char *sock);

/* local.c */
void make_key(char *buf, size_t len, const char *what, uint64_t size, uint64_t i);
void bench_exists(struct kvc_client *c, struct counters *k, struct result *r);
void bench_put(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
	       uint8_t *src);
void bench_get(struct kvc_client *c, struct counters *k, struct result *r, uint64_t size,
	       uint8_t *src, uint8_t *dst, bool acquire);
void bench_keys(struct kvc_client *c, struct counters *k, struct result *r, bool prefix);
int run_local(void);

/* peers.c */
struct peer {
	const char *name;
	char sock[100];
	pid_t pid;
	int fd;
	uint8_t *rbuf;
	size_t rlen, rcap, roff;
};

enum peer_op { P_PUT, P_GET, P_EXISTS };
typedef void (*peer_fn)(struct peer *, enum peer_op, const char *, const void *, size_t, void *);
bool peer_start(struct peer *p, char *const argv[]);
void peer_stop(struct peer *p);
void mc_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len, void *dst);
void redis_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len,
	      void *dst);
void bench_peer(struct peer *p, peer_fn fn, enum peer_op op, uint64_t size, uint8_t *src,
		uint8_t *dst, struct counters *k, struct result *r);

/* plot.c: the figures a case printed as an SVG chart (gnuplot), one panel
 * per measure, series against value size; reference series (limits,
 * peers) are dashed. */
#define PLOT_PANELS 2
#define PLOT_SERIES 12

struct plot_series {
	char title[48];
	bool reference;
	size_t n;
	double x[MAX_SIZES], y[MAX_SIZES];
};

struct plot_panel {
	char title[48], ylabel[32];
	bool logy;
	struct plot_series series[PLOT_SERIES];
	size_t n;
};

struct plot {
	struct plot_panel panels[PLOT_PANELS];
	size_t n;
};

void plot_add(struct plot *p, const char *panel, const char *ylabel, bool logy,
	      const char *series, bool reference, double x, double y);
/* get/put/acquire results by size: latency, bandwidth (and memcpy). */
void plot_results(struct plot *p, const struct result *res, size_t n, const char *system,
		  bool reference);
int plot_draw(const struct plot *p, const char *file, const char *title);
/* With --plot: draw, and say where (or why not). */
void plot_finish(const struct plot *p, const char *title);

/* the other cases */
int run_churn(uint64_t size);
int run_objects(void);
int run_pinned(void);
int run_hangup(uint64_t size);
int run_leased(void);
int run_burst(void);
int run_cluster(void);
int run_engine(void);
/* The build tree's python/ directory next to this binary (python.c). */
bool build_python_dir(char *buf, size_t len);
/* engine.c's: the two hosts of cluster.c and their daemons (dram each),
 * node A's socket in sa, B's in sb; *ret_link: iperf3 A->B, GB/s */
void cluster_up(char *sa, char *sb, double *ret_link, const char *dram);
extern const char *arg_model;
extern unsigned arg_prompts, arg_prompt_tokens, arg_tp;
extern bool arg_layerwise;
extern bool arg_across_only;
int run_rdma(void);
int run_python(void);
int run_recovery(void);
int run_disk(const char *dir, const uint64_t *sizes, size_t n, const char *compress);
void zstd_figures(void);
