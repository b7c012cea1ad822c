/* SPDX-License-Identifier: MIT */
/* kvcache-bench disk: the device's limits against spill and read-back. */
#include "bench.h"

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
		uint64_t r = bench_rand(&s);
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
		uint64_t r = bench_rand(&s);
		float f = (float) (((double) (r & 0xffff) + (double) ((r >> 16) & 0xffff) +
				    (double) ((r >> 32) & 0xffff) - 98302.5) / 65536.0);
		uint32_t bits;
		uint16_t top;

		memcpy(&bits, &f, 4);
		top = (uint16_t) (bits >> 16);
		memcpy(buf + i, &top, 2);
	}
}

void zstd_figures(void)
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

/* Load objs values of size, named prefix/0.., into buf (8 slots), 8 in
 * flight by get_into; dies on any answer but the whole value. */
static void load_all(struct kvc_client *c, struct kvc_buffer *buf, const char *prefix,
		     uint64_t size, uint64_t objs)
{
	uint64_t loaded = 0, next = 0, inflight = 0;
	char keys[8][64];

	while (loaded < objs) {
		struct kvc_completion cp[8];
		int r;

		while (inflight < 8 && next < objs) {
			struct kvc_op op = { .opcode = KVC_OP_GET_INTO, .buf = buf };

			snprintf(keys[next % 8], 64, "%s/%" PRIu64, prefix, next);
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
				die((int) cp[k].res, "load of %s/%" PRIu64, prefix, cp[k].user_data);
		loaded += (uint64_t) r;
		inflight -= (uint64_t) r;
	}
}

/* kvcache's spill and read-back bandwidth for `size` objects, `total` bytes. */
static void kvcache_disk(const char *dir, uint64_t size, uint64_t total, const char *compress,
			 double *ret_spill, double *ret_back)
{
	uint64_t objs = total / size, t0;
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
	load_all(c, &buf, "disk", size, objs);
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

int run_disk(const char *dir, const uint64_t *sizes, size_t n, const char *compress)
{
	const uint64_t total = 384 << 20;
	static struct plot chart;

	if (!dir)
		dir = "/var/tmp";
	bench_setup();
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
		{
			char t[48];

			snprintf(t, sizeof(t), "spill (%s)", compress);
			plot_add(&chart, "write", "GB/s", false, t, false, (double) sizes[i], spill);
			plot_add(&chart, "write", "GB/s", false, "raw O_DIRECT write", true,
				 (double) sizes[i], raw_w);
			snprintf(t, sizeof(t), "read-back (%s)", compress);
			plot_add(&chart, "read", "GB/s", false, t, false, (double) sizes[i], back);
			plot_add(&chart, "read", "GB/s", false, "raw O_DIRECT read", true,
				 (double) sizes[i], raw_r);
		}
	}
	if (arg_plot && (strcmp(compress, "zstd") == 0 || !arg_zstd))
		plot_finish(&chart, "kvcache-bench disk");
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

/* ---- disk --shared: the shared tier against the same directory's limits ---- */

static void start_daemon_shared(char *sock, size_t len, const char *sdir, bool through)
{
	const char *extra[] = { "--dram-size", "1GiB", "--shared-dir", sdir, "--default-kv-lease-ttl",
				"0", through ? "--shared-write-through" : NULL, NULL };

	start_daemon_args(sock, len, extra);
	{
		struct kvc_client *c;
		int i;

		check(kvc_connect(sock, &c), "connect");
		for (i = 0; i < 500 && !counter(c, "shared.on"); i++)
			usleep(10000);
		if (!counter(c, "shared.on"))
			die(0, "the shared tier in %s did not come on", sdir);
		kvc_disconnect(c);
	}
}

/* A node writes `objs` values of `size` through to the shared directory
 * (from the first put to the last record published: GB/s). */
static double shared_write(const char *sdir, const char *prefix, uint64_t size, uint64_t objs,
			   const uint8_t *val)
{
	char sock[200], key[64];
	struct kvc_client *c;
	uint64_t t0;

	start_daemon_shared(sock, sizeof(sock), sdir, true);
	check(kvc_connect(sock, &c), "connect");
	t0 = now_ns();
	for (uint64_t j = 0; j < objs; j++) {
		snprintf(key, sizeof(key), "%s/%" PRIu64, prefix, j);
		check(kvc_put(c, key, val, size, NULL), "put");
	}
	while (counter(c, "shared.writes") < objs) {
		if (counter(c, "shared.write_errors") || !counter(c, "shared.writable"))
			die(0, "%s", "the shared tier failed to take the copies");
		usleep(200);
	}
	t0 = now_ns() - t0;
	kvc_disconnect(c);
	stop_daemon();
	return (double) (objs * size) / (double) t0;
}

/* Another node, fresh, loads them all into a registered buffer, 8 in
 * flight: GB/s. */
static double shared_read(const char *sdir, const char *prefix, uint64_t size, uint64_t objs,
			  const uint8_t *val)
{
	uint64_t t0;
	char sock[200];
	struct kvc_client *c;
	struct kvc_buffer buf;

	start_daemon_shared(sock, sizeof(sock), sdir, false);
	check(kvc_connect(sock, &c), "connect");
	check(kvc_buffer_alloc(c, size * 8, &buf), "buffer");
	memset(buf.data, 0, size * 8);
	t0 = now_ns();
	load_all(c, &buf, prefix, size, objs);
	t0 = now_ns() - t0;
	if (memcmp((uint8_t *) buf.data, val, size) != 0)
		die(0, "%s", "the shared tier returned wrong bytes");
	if (counter(c, "shared.reads") != objs)
		die(0, "%s", "not every value came from the shared tier");
	kvc_buffer_free(c, &buf);
	kvc_disconnect(c);
	stop_daemon();
	return (double) (objs * size) / (double) t0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

	return x < y ? -1 : x > y;
}

#define SHARED_BLOCKS 1000

/* A node's first lookup-and-load of SHARED_BLOCKS blocks another node
 * wrote: each block asked for (kvc_exists: a statx) and loaded
 * (kvc_get_into), one after the other, as an engine's first request after
 * a restart does. */
static void shared_first_loads(const char *sdir, uint64_t size, const uint8_t *val)
{
	uint64_t *look = calloc(SHARED_BLOCKS, sizeof(*look)), *load = calloc(SHARED_BLOCKS, 8);
	uint64_t *both = calloc(SHARED_BLOCKS, sizeof(*both));
	char sock[200], key[64], sz[32];
	struct kvc_client *c;
	struct kvc_buffer buf;

	if (!look || !load || !both)
		die(0, "%s", "out of memory");
	shared_write(sdir, "first", size, SHARED_BLOCKS, val);
	start_daemon_shared(sock, sizeof(sock), sdir, false);
	check(kvc_connect(sock, &c), "connect");
	check(kvc_buffer_alloc(c, size, &buf), "buffer");
	memset(buf.data, 0, size);
	for (unsigned i = 0; i < SHARED_BLOCKS; i++) {
		uint64_t t0, t1;
		int64_t r;

		snprintf(key, sizeof(key), "first/%u", i);
		t0 = now_ns();
		if (kvc_exists(c, key) != 1)
			die(0, "%s not found", key);
		t1 = now_ns();
		r = kvc_get_into(c, key, &buf, 0, size);
		if (r != (int64_t) size)
			die((int) r, "load of %s", key);
		look[i] = t1 - t0;
		load[i] = now_ns() - t1;
		both[i] = now_ns() - t0;
	}
	kvc_buffer_free(c, &buf);
	kvc_disconnect(c);
	stop_daemon();
	qsort(look, SHARED_BLOCKS, 8, cmp_u64);
	qsort(load, SHARED_BLOCKS, 8, cmp_u64);
	qsort(both, SHARED_BLOCKS, 8, cmp_u64);
	size_name(sz, sizeof(sz), size);
	printf("first lookup-and-load of %d blocks of %s another node wrote, one at a time:\n"
	       "  lookup p50 %.1f us p99 %.1f us; load p50 %.1f us p99 %.1f us; "
	       "both p50 %.1f us p99 %.1f us\n", SHARED_BLOCKS, sz,
	       look[SHARED_BLOCKS / 2] / 1e3, look[SHARED_BLOCKS * 99 / 100] / 1e3,
	       load[SHARED_BLOCKS / 2] / 1e3, load[SHARED_BLOCKS * 99 / 100] / 1e3,
	       both[SHARED_BLOCKS / 2] / 1e3, both[SHARED_BLOCKS * 99 / 100] / 1e3);
	free(look);
	free(load);
	free(both);
}

static void rm_rf(const char *d)
{
	char cmd[4300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	if (system(cmd) != 0)
		fprintf(stderr, "kvcache-bench: could not remove %s\n", d);
}

int run_shared(const char *dir, const uint64_t *sizes, size_t n)
{
	const uint64_t total = 384 << 20;

	if (!dir)
		dir = "/var/tmp";
	bench_setup();
	printf("kvcache-bench disk --shared: %s as the shared directory, %" PRIu64 " MiB per "
	       "measurement, medians of %d runs interleaved;\n"
	       "write: one node's puts written through until the last record is published; "
	       "read: a fresh node loads them all (8 in flight);\n"
	       "raw: sequential io_uring I/O of one file in the same directory (O_DIRECT where "
	       "it is taken)\n", dir, total >> 20, DISK_REPS);
	printf("%6s %10s %10s %10s %10s %9s %9s\n", "size", "raw write", "write", "raw read",
	       "read", "write/raw", "read/raw");
	for (size_t i = 0; i < n; i++) {
		double rw[DISK_REPS], rr[DISK_REPS], w[DISK_REPS], r[DISK_REPS];
		uint64_t objs = total / sizes[i];
		uint8_t *val = malloc(sizes[i]);
		char sz[32];

		if (!val)
			die(0, "%s", "out of memory");
		fill_kv16(val, sizes[i], 9);
		for (int rep = 0; rep < DISK_REPS; rep++) {
			char sdir[4200];

			snprintf(sdir, sizeof(sdir), "%s/kvcache-bench-shared-XXXXXX", dir);
			if (!mkdtemp(sdir))
				die(-errno, "cannot make a directory under %s", dir);
			rw[rep] = raw_io(sdir, sizes[i], total, true);
			rr[rep] = raw_io(sdir, sizes[i], total, false);
			w[rep] = shared_write(sdir, "v", sizes[i], objs, val);
			r[rep] = shared_read(sdir, "v", sizes[i], objs, val);
			rm_rf(sdir);
		}
		size_name(sz, sizeof(sz), sizes[i]);
		printf("%6s %5.2f GB/s %5.2f GB/s %5.2f GB/s %5.2f GB/s %8.0f%% %8.0f%%\n", sz,
		       median3(rw), median3(w), median3(rr), median3(r),
		       100.0 * median3(w) / median3(rw), 100.0 * median3(r) / median3(rr));
		fflush(stdout);
		free(val);
	}
	{
		char sdir[4200];
		uint8_t *val = malloc(256 << 10);

		if (!val)
			die(0, "%s", "out of memory");
		fill_kv16(val, 256 << 10, 11);
		snprintf(sdir, sizeof(sdir), "%s/kvcache-bench-shared-XXXXXX", dir);
		if (!mkdtemp(sdir))
			die(-errno, "cannot make a directory under %s", dir);
		shared_first_loads(sdir, 256 << 10, val);
		rm_rf(sdir);
		free(val);
	}
	rmdir(tmpdir);
	return 0;
}
