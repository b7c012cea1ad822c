/* SPDX-License-Identifier: MIT */
/*
 * The shared tier: one record file per object in a directory several
 * nodes mount (docs/shared-tier.rst), below memory and beside the private
 * disk tier.  Core asks it for a copy of an object leaving memory (or of
 * each put, with --shared-write-through), and looks for a key there after
 * every other place missed.
 *
 * A key's file is found by its name, derived from the key (XXH3-128, fanned
 * out over 256 x 256 directories): nothing is listed to find a key.  A
 * record is the disk tier's (disk-record.h), written under a temporary
 * name and published by a rename that never replaces (one writer of a key
 * wins), and checked whole before it is served: layout, key, checksum.
 *
 * Every call on the filesystem runs on the tier's helper threads (the
 * loop never waits for a filesystem that may hang); reads and the
 * existence checks of a lookup go through io_uring there, the checks of a
 * batch submitted together.  A call that fails the way a sick or missing
 * directory fails, or that takes too long, turns the tier off (a miss
 * there is a miss); a probe every second turns it on again.  Capacity is
 * kept by every node together: each scans one of the 256 top directories
 * at a time, counts what is there and, above --shared-size's watermark,
 * deletes the oldest records (by their time, never one younger than
 * SHARED_LEASE).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "clock.h"
#include "disk-record.h"
#include "log.h"
#include "loop.h"
#include "shared.h"
#include "wire.h"
#include "worker.h"

#define LOG_TOPIC "shared"

#define THREADS 4            /* blocking filesystem calls at once */
#define WRITES_MAX 8         /* copies in flight, at most; the rest wait */
/* copies asked for and not done, at most (their objects are held in
 * memory meanwhile): a quarter of dram, up to this */
#define QUEUED_BYTES_MAX (UINT64_C(1) << 30)
#define CALL_TIMEOUT (5 * USEC_PER_SEC) /* a call that takes longer: the tier goes off */
#define CALL_RATE (UINT64_C(64) << 20)  /* ... plus a second per this many bytes */
#define PROBE_EVERY USEC_PER_SEC     /* while off */
#define PROBE_ON_EVERY (5 * USEC_PER_SEC) /* while on: is it still the same filesystem? */
#define CACHE_SLOTS 8192     /* what a lookup learnt, by key */
#define CACHE_TTL USEC_PER_SEC
#define STAT_MAX 512         /* keys checked by one call */
#define SCAN_GAP (250 * USEC_PER_MSEC) /* between two top directories' scans */
#define SHARED_LEASE 60      /* (s) a record younger than this is never evicted */
#define TMP_AGE 600          /* (s) a temporary file older than this is a dead writer's */
#define AGE_BUCKETS 320      /* record bytes by age: eight buckets an octave of seconds */
#define SUBDIRS 256
#define ROOM_RETRY (50 * USEC_PER_MSEC) /* a read waiting for room in memory tries again */

enum sjob_kind {
	SJ_PROBE,  /* is the directory there; can it be written? */
	SJ_WRITE,  /* a copy of a held object */
	SJ_HEAD,   /* a record read whole into a buffer, its header checked */
	SJ_COPY,   /* its value into the landing place, its checksum checked */
	SJ_STAT,   /* which of these keys have a record */
	SJ_SCAN,   /* one top directory: usage, ages, evictions, dead temporaries */
	SJ_UNLINK, /* a removed key's record */
	SJ_REMOVE, /* a removal by prefix, for every node: its file */
};

/* Removals by prefix (or of everything) that every node heeds: a record
 * of a matching key written at or before ms is not served.  Kept as one
 * small file each in kvcache-v1/removals, named by time, until no record
 * that old is left. */
#define REMOVALS_MAX 1024
#define REMOVALS_DIR "removals"
#define REMOVAL_FRESH_MS 30000 /* this node's own, kept until a probe lists them */

struct removal {
	uint64_t ms;
	uint32_t len;
	char prefix[WIRE_MAX_KEY + 1];
};

struct khash {
	uint64_t hi, lo;
};

struct sjob {
	struct work w;
	struct shared *sh;
	struct sjob *next, *prev; /* in flight, oldest first */
	enum sjob_kind kind;
	usec_t deadline;
	bool detached;            /* out of time: the loop let its waiters go */
	int res;
	struct khash h;
	struct object *o;
	/* a write */
	const uint8_t *src;
	uint64_t len, sum, rec_size;
	bool summed, replace;
	char key[WIRE_MAX_KEY + 1];
	uint32_t key_len;
	/* a read */
	uint8_t *buf;
	struct disk_record_hdr hdr;
	uint8_t *dst;
	bool direct;
	/* a lookup: keys[i]'s hash in, present[i] out; its waiters */
	size_t n;
	struct khash *keys;
	uint8_t *present;
	struct fetch *f;
	/* a scan */
	unsigned dir;
	time_t cutoff;            /* records older than this go (0: none) */
	uint64_t bytes, records, evicted, evicted_bytes, tmp_removed;
	uint64_t age_bytes[AGE_BUCKETS];
	/* a probe (write_test: try a write too); the removals it found, and
	 * the time at or before which every record counts as removed (more
	 * removals than are kept); the removal files it deletes (older than
	 * any record).  rm_before is also a removal's time (SJ_REMOVE, its
	 * prefix in key), and for a write the last removal of its key (a
	 * record older than that is replaced, not kept) */
	bool readable, writable, write_test, listed;
	struct removal *rm;
	unsigned n_rm;
	uint64_t rm_before, prune_before;
	/* a lookup: when a removal of each key's prefix was (0: none) */
	uint64_t *rm_ms;
};

struct cache_slot {
	struct khash h;
	usec_t until;
	bool present;
};

struct shared {
	struct store *st;
	struct loop *loop;
	char dir[4096];           /* --shared-dir */
	char root[4200];          /* its kvcache-v1 */
	uint64_t tag;             /* this run's: temporary names */
	/* the filesystem the directory was on when first found (atomic:
	 * threads compare): another one there later is a mount gone */
	uint64_t dev;
	struct worker *wk;
	struct loop_source *timer;
	struct store_listener listener;
	struct sjob *head, *tail; /* calls in flight, oldest first */
	unsigned n_writes;        /* copies in flight */
	struct sjob *wait_head, *wait_tail; /* copies asked for, waiting for one to end */
	uint64_t queued_bytes;    /* of copies in flight or waiting */
	uint64_t queue_max;       /* at most (QUEUED_BYTES_MAX) */
	/* reads whose records are in, waiting for room in memory (oldest
	 * first), and whether a copy ended since they last tried */
	struct sjob *room_head, *room_tail;
	bool room_freed;
	bool on, writable;        /* found and readable; writable too */
	bool probing, probed;      /* a probe in flight; one has answered */
	unsigned n_hung;          /* calls let go that have not come back */
	usec_t probe_at;
	char why[160];            /* why it is off or not written */
	struct cache_slot cache[CACHE_SLOTS];
	struct removal *rm;       /* REMOVALS_MAX, by time */
	unsigned n_rm;
	uint64_t rm_before;
	/* usage, as the scans and this node's own writes found it */
	uint64_t dir_bytes[SUBDIRS], dir_records[SUBDIRS];
	uint64_t dir_age[SUBDIRS][AGE_BUCKETS];
	uint64_t usage, records, age_total[AGE_BUCKETS];
	bool scanning;
	unsigned scan_next, scanned; /* the next top directory; steps done */
	usec_t scan_at;
	time_t cutoff;
	struct {
		uint64_t writes, write_bytes, write_skips, write_errors;
		uint64_t reads, read_bytes, read_misses, read_errors;
		uint64_t skipped_newer, skipped_damaged, checksum_failures;
		uint64_t lookups, lookup_keys, cache_hits;
		uint64_t offs, timeouts, evicted, evicted_bytes, tmp_removed, unlinked;
		uint64_t direct_reads, removed_skips, removals_written, copies_deferred;
	} c;
};

/* ---- names ---- */

static struct khash key_hash(const void *key, size_t len)
{
	XXH128_hash_t x = XXH3_128bits(key, len);

	return (struct khash) { x.high64, x.low64 };
}

/* The record's path (tmp: this writer's temporary name beside it). */
static void record_path(const struct shared *sh, struct khash h, char *buf, size_t len,
			bool tmp)
{
	unsigned a = (unsigned) (h.hi >> 56), b = (unsigned) (h.hi >> 48) & 0xff;

	if (tmp)
		snprintf(buf, len, "%s/%02x/%02x/.%016" PRIx64 "%016" PRIx64 ".%016" PRIx64 ".tmp",
			 sh->root, a, b, h.hi, h.lo, sh->tag);
	else
		snprintf(buf, len, "%s/%02x/%02x/%016" PRIx64 "%016" PRIx64 ".kvr", sh->root, a,
			 b, h.hi, h.lo);
}

static unsigned top_dir(struct khash h)
{
	return (unsigned) (h.hi >> 56);
}

static uint64_t wall_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t) t.tv_sec * 1000 + (uint64_t) t.tv_nsec / 1000000;
}

/* ---- the helper threads' io_uring ---- */

static pthread_key_t ring_key;
static pthread_once_t ring_once = PTHREAD_ONCE_INIT;

static void ring_free(void *p)
{
	io_uring_queue_exit(p);
	free(p);
}

static void ring_key_init(void)
{
	pthread_key_create(&ring_key, ring_free);
}

/* This thread's ring (NULL: none could be made; plain calls then). */
static struct io_uring *thread_ring(void)
{
	struct io_uring *r;

	pthread_once(&ring_once, ring_key_init);
	r = pthread_getspecific(ring_key);
	if (r)
		return r;
	r = calloc(1, sizeof(*r));
	if (!r || io_uring_queue_init(64, r, 0) < 0) {
		free(r);
		return NULL;
	}
	pthread_setspecific(ring_key, r);
	return r;
}

/* Read len bytes at 0 from fd into buf: the bytes read, or -errno. */
static ssize_t read_all(int fd, uint8_t *buf, uint64_t len)
{
	struct io_uring *ring = thread_ring();
	uint64_t got = 0;

	while (got < len) {
		ssize_t n;

		if (ring) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
			struct io_uring_cqe *cqe;
			unsigned chunk = len - got > (1u << 30) ? 1u << 30 : (unsigned) (len - got);

			io_uring_prep_read(sqe, fd, buf + got, chunk, got);
			if (io_uring_submit_and_wait(ring, 1) < 0 || io_uring_wait_cqe(ring, &cqe) < 0)
				return -EIO;
			n = cqe->res;
			io_uring_cqe_seen(ring, cqe);
			if (n < 0) {
				if (n == -EINTR || n == -EAGAIN)
					continue;
				return n;
			}
		} else {
			n = pread(fd, buf + got, len - got, (off_t) got);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				return -errno;
			}
		}
		if (n == 0)
			break;
		got += (uint64_t) n;
	}
	return (ssize_t) got;
}

/* statx of each path, submitted together: ok[i] set for a regular file,
 * ms[i] its modification time (ms); the first error that is not "no such
 * file" (0: none). */
static int stat_batch(char (*paths)[4300], size_t n, uint8_t *ok, uint64_t *ms)
{
	struct io_uring *ring = thread_ring();
	struct statx *sx = calloc(n, sizeof(*sx));
	int err = 0;

	if (!sx)
		return -ENOMEM;
	for (size_t at = 0; at < n;) {
		size_t k = 0;

		if (!ring) {
			int r = statx(AT_FDCWD, paths[at], 0, STATX_TYPE | STATX_MTIME, &sx[at]);

			ok[at] = r == 0 && S_ISREG(sx[at].stx_mode);
			ms[at] = (uint64_t) sx[at].stx_mtime.tv_sec * 1000 +
				 sx[at].stx_mtime.tv_nsec / 1000000;
			if (r < 0 && errno != ENOENT && !err)
				err = -errno;
			at++;
			continue;
		}
		for (; at + k < n && k < 64; k++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			io_uring_prep_statx(sqe, AT_FDCWD, paths[at + k], 0, STATX_TYPE | STATX_MTIME,
					    &sx[at + k]);
			sqe->user_data = at + k;
		}
		if (io_uring_submit_and_wait(ring, (unsigned) k) < 0) {
			free(sx);
			return -EIO;
		}
		for (size_t i = 0; i < k; i++) {
			struct io_uring_cqe *cqe;
			size_t x;

			if (io_uring_wait_cqe(ring, &cqe) < 0) {
				free(sx);
				return -EIO;
			}
			x = (size_t) cqe->user_data;
			ok[x] = cqe->res == 0 && S_ISREG(sx[x].stx_mode);
			ms[x] = (uint64_t) sx[x].stx_mtime.tv_sec * 1000 +
				sx[x].stx_mtime.tv_nsec / 1000000;
			if (cqe->res < 0 && cqe->res != -ENOENT && cqe->res != -ENOTDIR && !err)
				err = cqe->res;
			io_uring_cqe_seen(ring, cqe);
		}
		at += k;
	}
	free(sx);
	return err;
}

/* ---- on a helper thread ---- */

static int mkdirs(const struct shared *sh, struct khash h)
{
	char p[4300];
	int n = snprintf(p, sizeof(p), "%s/%02x", sh->root, top_dir(h));

	/* (no kvcache-v1 any more: the directory is not what it was) */
	if (mkdir(p, 0755) < 0 && errno != EEXIST)
		return errno == ENOENT ? -ESTALE : -errno;
	snprintf(p + n, sizeof(p) - (size_t) n, "/%02x", (unsigned) (h.hi >> 48) & 0xff);
	if (mkdir(p, 0755) < 0 && errno != EEXIST)
		return errno == ENOENT ? -ESTALE : -errno;
	return 0;
}

/* Is fd on the filesystem the directory was found on?  0, or -ESTALE (an
 * unmounted directory shows the one below it). */
static int same_fs(const struct shared *sh, int fd)
{
	struct stat sb;
	uint64_t dev = __atomic_load_n(&sh->dev, __ATOMIC_RELAXED);

	if (fstat(fd, &sb) < 0)
		return -errno;
	return !dev || (uint64_t) sb.st_dev == dev ? 0 : -ESTALE;
}

/* Publish tmp as final: never over another writer's record unless
 * replace.  0, -EEXIST (one is there: it won), or -errno. */
static int publish(const char *tmp, const char *final, bool replace)
{
	if (replace)
		return rename(tmp, final) < 0 ? -errno : 0;
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	/* a filesystem without it (NFS): a link fails on an existing name
	 * just as atomically */
	if (link(tmp, final) < 0)
		return -errno;
	unlink(tmp);
	return 0;
}

static void run_write(struct sjob *j)
{
	struct shared *sh = j->sh;
	char final[4300], tmp[4300];
	uint64_t off = disk_record_payload_off(j->key_len);
	struct disk_record_hdr h = { 0 };
	struct statx sx;
	struct timespec now;
	int fd, r;

	record_path(sh, j->h, final, sizeof(final), false);
	record_path(sh, j->h, tmp, sizeof(tmp), true);
	if (!j->replace && statx(AT_FDCWD, final, 0, STATX_TYPE | STATX_MTIME, &sx) == 0) {
		uint64_t mtime = (uint64_t) sx.stx_mtime.tv_sec * 1000 + sx.stx_mtime.tv_nsec / 1000000;

		if (!j->rm_before || mtime > j->rm_before) {
			j->res = -EEXIST; /* another node wrote it: nothing to do */
			return;
		}
		j->replace = true; /* written before its key's removal: stale */
	}
	clock_gettime(CLOCK_REALTIME, &now);
	h.magic = DISK_RECORD_MAGIC;
	h.version = DISK_RECORD_VERSION;
	h.value_len = h.stored_len = j->len;
	h.value_sum = j->summed ? j->sum : XXH3_64bits(j->src, j->len);
	h.key_len = j->key_len;
	h.created_ms = (uint64_t) now.tv_sec * 1000 + (uint64_t) now.tv_nsec / 1000000;
	h.header_sum = disk_record_header_sum(&h, j->key);
	j->rec_size = disk_record_size(j->key_len, j->len);
	/* the whole record in one aligned buffer: one O_DIRECT write, the
	 * page cache of neither node filled with it */
	j->buf = aligned_alloc(DISK_ALIGN, j->rec_size);
	if (!j->buf) {
		j->res = -ENOMEM;
		return;
	}
	memcpy(j->buf, &h, sizeof(h));
	memcpy(j->buf + sizeof(h), j->key, j->key_len);
	memset(j->buf + sizeof(h) + j->key_len, 0, off - sizeof(h) - j->key_len);
	memcpy(j->buf + off, j->src, j->len);
	memset(j->buf + off + j->len, 0, j->rec_size - off - j->len);
	j->direct = true;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0644);
	if (fd < 0 && errno == ENOENT) {
		/* its directories are not there yet */
		r = mkdirs(sh, j->h);
		if (r < 0) {
			j->res = r;
			return;
		}
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0644);
	}
	if (fd < 0 && errno == EINVAL) {
		j->direct = false; /* a filesystem without it */
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	}
	if (fd < 0) {
		j->res = -errno;
		return;
	}
	r = same_fs(sh, fd);
	if (r < 0) {
		close(fd);
		unlink(tmp);
		j->res = r;
		return;
	}
	for (uint64_t done = 0; done < j->rec_size;) {
		ssize_t n = pwrite(fd, j->buf + done, j->rec_size - done, (off_t) done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			break;
		}
		done += (uint64_t) n;
	}
	free(j->buf);
	j->buf = NULL;
	/* a network filesystem may say only now that the bytes did not go */
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0)
		r = publish(tmp, final, j->replace);
	if (r < 0)
		unlink(tmp);
	j->sum = h.value_sum;
	j->res = r;
}

/* The record of j's key, read whole and checked but for its value's
 * checksum; j->len is the value's length. */
static void run_head(struct sjob *j)
{
	char path[4300];
	struct stat sb;
	uint64_t size;
	ssize_t got;
	int fd;

	record_path(j->sh, j->h, path, sizeof(path), false);
	j->direct = true;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
	if (fd < 0 && errno == EINVAL) {
		j->direct = false; /* a filesystem without it */
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0) {
		j->res = errno == ENOENT || errno == ENOTDIR ? -ENOENT : -errno;
		return;
	}
	if (fstat(fd, &sb) < 0 || same_fs(j->sh, fd) < 0) {
		j->res = fstat(fd, &sb) < 0 ? -errno : -ESTALE;
		close(fd);
		return;
	}
	size = (uint64_t) sb.st_size;
	if (size < sizeof(struct disk_record_hdr) ||
	    size > disk_record_size(WIRE_MAX_KEY, UINT64_C(1) << 30)) {
		j->res = -EBADMSG;
		close(fd);
		return;
	}
	j->buf = aligned_alloc(DISK_ALIGN, (size + DISK_ALIGN - 1) & ~(uint64_t) (DISK_ALIGN - 1));
	if (!j->buf) {
		j->res = -ENOMEM;
		close(fd);
		return;
	}
	got = read_all(fd, j->buf, (size + DISK_ALIGN - 1) & ~(uint64_t) (DISK_ALIGN - 1));
	if (got == -EINVAL && j->direct) {
		/* O_DIRECT taken at open but refused at read */
		close(fd);
		j->direct = false;
		fd = open(path, O_RDONLY | O_CLOEXEC);
		got = fd < 0 ? -errno : read_all(fd, j->buf, size);
	}
	if (fd >= 0)
		close(fd);
	if (got < 0) {
		j->res = got == -ENOENT ? -ENOENT : (int) got;
		return;
	}
	j->res = shared_record_parse(j->buf, (size_t) got, j->key, j->key_len, &j->hdr);
	j->len = j->hdr.value_len;
}

int shared_record_parse(const void *buf, size_t len, const void *key, uint32_t key_len,
			struct disk_record_hdr *ret)
{
	struct disk_record_hdr raw;

	memset(ret, 0, sizeof(*ret));
	if (len >= sizeof(raw)) {
		memcpy(&raw, buf, sizeof(raw));
		if (raw.magic == DISK_RECORD_MAGIC && raw.version > DISK_RECORD_VERSION)
			return -EPROTONOSUPPORT; /* a newer writer's: never served */
	}
	if (disk_record_check(buf, len, len, &raw) < 0 || (raw.flags & DISK_REC_ZSTD) ||
	    raw.key_len != key_len ||
	    memcmp((const uint8_t *) buf + sizeof(raw), key, key_len) != 0)
		return -EBADMSG; /* torn, damaged, or another key's */
	*ret = raw;
	return 0;
}

static void run_copy(struct sjob *j)
{
	const uint8_t *v = j->buf + disk_record_payload_off(j->hdr.key_len);

	memcpy(j->dst, v, j->len);
	j->sum = XXH3_64bits(j->dst, j->len);
	j->res = j->sum == j->hdr.value_sum ? 0 : -EBADMSG;
}

static void run_stat(struct sjob *j)
{
	char (*paths)[4300] = malloc(j->n * sizeof(*paths));

	if (!paths) {
		j->res = -ENOMEM;
		return;
	}
	for (size_t i = 0; i < j->n; i++)
		record_path(j->sh, j->keys[i], paths[i], sizeof(paths[i]), false);
	j->res = stat_batch(paths, j->n, j->present, j->rm_ms + STAT_MAX);
	free(paths);
}

/* A record's age (s) to its bucket: ages under 8 each their own, then
 * eight buckets from each power of two to the next. */
static unsigned age_bucket(time_t now, time_t t)
{
	uint64_t age = now > t ? (uint64_t) (now - t) : 0;
	unsigned msb, b;

	if (age < 8)
		return (unsigned) age;
	msb = 63u - (unsigned) __builtin_clzll(age);
	b = 8 * (msb - 2) + (unsigned) ((age >> (msb - 3)) & 7);
	return b < AGE_BUCKETS ? b : AGE_BUCKETS - 1;
}

/* The youngest age in bucket b. */
static uint64_t age_floor(unsigned b)
{
	return b < 8 ? b : (uint64_t) (8 + b % 8) << (b / 8 + 2 - 3);
}

/* One subdirectory of a scan. */
static int scan_subdir(struct sjob *j, const char *path, time_t now)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int fd;

	if (!d)
		return errno == ENOENT ? 0 : -errno;
	fd = dirfd(d);
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		struct stat sb;

		if (l < 5)
			continue;
		if (e->d_name[0] == '.' && !strcmp(e->d_name + l - 4, ".tmp")) {
			if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
			    sb.st_mtime + TMP_AGE < now && unlinkat(fd, e->d_name, 0) == 0)
				j->tmp_removed++; /* a writer that died mid-write */
			continue;
		}
		if (strcmp(e->d_name + l - 4, ".kvr") ||
		    fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode))
			continue;
		if (j->cutoff && sb.st_mtime <= j->cutoff && sb.st_mtime + SHARED_LEASE < now &&
		    unlinkat(fd, e->d_name, 0) == 0) {
			/* a reader that opened it reads on: unlink is safe */
			j->evicted++;
			j->evicted_bytes += (uint64_t) sb.st_size;
			continue;
		}
		j->records++;
		j->bytes += (uint64_t) sb.st_size;
		j->age_bytes[age_bucket(now, sb.st_mtime)] += (uint64_t) sb.st_size;
	}
	closedir(d);
	return 0;
}

static void run_scan(struct sjob *j)
{
	char path[4300];
	time_t now = time(NULL);
	int r = 0;

	for (unsigned b = 0; b < SUBDIRS && r == 0; b++) {
		snprintf(path, sizeof(path), "%s/%02x/%02x", j->sh->root, j->dir, b);
		r = scan_subdir(j, path, now);
	}
	j->res = r;
}

static int cmp_removal(const void *a, const void *b)
{
	uint64_t x = ((const struct removal *) a)->ms, y = ((const struct removal *) b)->ms;

	return x < y ? -1 : x > y;
}

/* The removals every node wrote (the newest REMOVALS_MAX; what is older
 * than those counts as all removed), deleting those older than any record
 * left (j->prune_before). */
static void list_removals(struct sjob *j)
{
	char path[4300];
	struct removal *all = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "%s/" REMOVALS_DIR, j->sh->root);
	d = opendir(path);
	j->listed = d || errno == ENOENT; /* (none yet) */
	if (!d)
		return;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		char *end;
		uint64_t ms;
		int fd;
		ssize_t got;

		if (l != 16 + 1 + 16 + 3 || strcmp(e->d_name + l - 3, ".rm"))
			continue;
		ms = strtoull(e->d_name, &end, 16);
		if (end != e->d_name + 16)
			continue;
		if (ms < j->prune_before) {
			unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		if (n == cap) {
			struct removal *g = realloc(all, (cap = cap ? 2 * cap : 64) * sizeof(*all));

			if (!g)
				break;
			all = g;
		}
		fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		got = read(fd, all[n].prefix, WIRE_MAX_KEY + 1);
		close(fd);
		if (got < 0 || got > WIRE_MAX_KEY)
			continue; /* not one of ours */
		all[n].len = (uint32_t) got;
		all[n].prefix[got] = '\0';
		all[n].ms = ms;
		n++;
	}
	closedir(d);
	qsort(all, n, sizeof(*all), cmp_removal);
	if (n > REMOVALS_MAX) {
		j->rm_before = all[n - REMOVALS_MAX - 1].ms;
		memmove(all, all + n - REMOVALS_MAX, REMOVALS_MAX * sizeof(*all));
		n = REMOVALS_MAX;
	}
	j->rm = all;
	j->n_rm = (unsigned) n;
}

/* A removal's file, for every node to read: its prefix, named by its time. */
static void run_remove(struct sjob *j)
{
	char dir[4300], tmp[4400], final[4400];
	int fd;

	snprintf(dir, sizeof(dir), "%s/" REMOVALS_DIR, j->sh->root);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		j->res = -errno;
		return;
	}
	snprintf(final, sizeof(final), "%s/%016" PRIx64 "-%016" PRIx64 ".rm", dir, j->rm_before,
		 j->sh->tag);
	snprintf(tmp, sizeof(tmp), "%s/.%016" PRIx64 "-%016" PRIx64 ".tmp", dir, j->rm_before,
		 j->sh->tag);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		j->res = -errno;
		return;
	}
	j->res = write(fd, j->key, j->key_len) == (ssize_t) j->key_len ? 0 : -EIO;
	if (close(fd) < 0 && j->res == 0)
		j->res = -errno;
	if (j->res == 0 && rename(tmp, final) < 0)
		j->res = -errno;
	if (j->res < 0)
		unlink(tmp);
}

static void run_probe(struct sjob *j)
{
	struct shared *sh = j->sh;
	char p[4300];
	struct stat sb;
	int fd;

	j->readable = j->writable = false;
	if (stat(sh->dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
		j->res = errno ? -errno : -ENOTDIR;
		return;
	}
	if (!__atomic_load_n(&sh->dev, __ATOMIC_RELAXED))
		__atomic_store_n(&sh->dev, (uint64_t) sb.st_dev, __ATOMIC_RELAXED);
	else if ((uint64_t) sb.st_dev != __atomic_load_n(&sh->dev, __ATOMIC_RELAXED)) {
		j->res = -ESTALE; /* not the filesystem it was: unmounted */
		return;
	}
	if (mkdir(sh->root, 0755) < 0 && errno != EEXIST) {
		/* a read-only directory that has no records yet */
		j->res = -errno;
		return;
	}
	if (stat(sh->root, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
		j->res = -ENOTDIR;
		return;
	}
	j->readable = true;
	list_removals(j);
	if (!j->write_test) {
		j->writable = true; /* as it was: copies say otherwise when not */
		j->res = 0;
		return;
	}
	snprintf(p, sizeof(p), "%s/.probe.%016" PRIx64, sh->root, sh->tag);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		j->res = -errno;
		return;
	}
	j->res = write(fd, &sh->tag, sizeof(sh->tag)) == sizeof(sh->tag) ? 0 : -errno;
	if (close(fd) < 0 && j->res == 0)
		j->res = -errno;
	unlink(p);
	j->writable = j->res == 0;
}

static void run_unlink(struct sjob *j)
{
	char path[4300];

	record_path(j->sh, j->h, path, sizeof(path), false);
	j->res = unlink(path) < 0 ? -errno : 0;
}

static void job_run(struct work *w)
{
	struct sjob *j = (struct sjob *) w;

	switch (j->kind) {
	case SJ_PROBE:
		run_probe(j);
		break;
	case SJ_WRITE:
		if (store_config(j->sh->st)->test.shared_write_ms) /* tests: a slow directory */
			usleep(store_config(j->sh->st)->test.shared_write_ms * 1000u);
		run_write(j);
		break;
	case SJ_HEAD:
		run_head(j);
		break;
	case SJ_COPY:
		run_copy(j);
		break;
	case SJ_STAT:
		run_stat(j);
		break;
	case SJ_SCAN:
		run_scan(j);
		break;
	case SJ_UNLINK:
		run_unlink(j);
		break;
	case SJ_REMOVE:
		run_remove(j);
		break;
	}
}

/* One queue all the threads take from, oldest first: a call that hangs
 * holds its own thread, never the calls behind it. */
static unsigned take_one(void *data, struct work *head, struct work **run, unsigned max,
			 void **hold)
{
	(void) data;
	(void) max;
	*hold = NULL;
	run[0] = head;
	return head ? 1 : 0;
}

static void run_taken(void *data, struct work **run, unsigned k)
{
	struct shared *sh = data;

	for (unsigned i = 0; i < k; i++) {
		job_run(run[i]);
		worker_hand_back(sh->wk, run[i]);
	}
}

static const struct worker_choice one_queue = {
	.take = take_one,
	.run = run_taken,
};

/* ---- on the loop ---- */

static void job_done(struct work *w);

static void job_free(struct sjob *j)
{
	free(j->buf);
	free(j->keys);
	free(j->present);
	free(j->rm_ms);
	free(j->rm);
	free(j);
}

/* When a removal of key (or of everything) was, the latest that applies
 * (0: none): a record written at or before it is not served.  (At most
 * REMOVALS_MAX to look at, and removals by prefix are rare.) */
static uint64_t removed_at(const struct shared *sh, const void *key, size_t len)
{
	uint64_t at = sh->rm_before;

	for (unsigned i = 0; i < sh->n_rm; i++) {
		const struct removal *r = &sh->rm[i];

		if (r->ms > at && r->len <= len && !memcmp(r->prefix, key, r->len))
			at = r->ms;
	}
	return at;
}

/* The oldest call in flight not yet let go (those let go wait at the head
 * for their threads: as many as calls hung, at most). */
static struct sjob *oldest_live(struct shared *sh)
{
	struct sjob *j = sh->head;

	while (j && j->detached)
		j = j->next;
	return j;
}

static void arm(struct shared *sh)
{
	struct sjob *live = oldest_live(sh);
	usec_t at = sh->probe_at;

	if (live && live->deadline < at)
		at = live->deadline;
	if (sh->on && !sh->scanning && sh->scan_at < at)
		at = sh->scan_at;
	if (sh->room_head) {
		usec_t retry = sh->room_freed ? loop_now(sh->loop) : loop_now(sh->loop) + ROOM_RETRY;

		at = retry < at ? retry : at;
	}
	/* (at 0 would disarm it: due now is the turn's time) */
	loop_timer_arm_by(sh->timer, at > loop_now(sh->loop) ? at : loop_now(sh->loop));
}

/* Hand j to a thread, in flight until it is done (extra: its bytes). */
static int submit(struct shared *sh, struct sjob *j, uint64_t bytes)
{
	j->sh = sh;
	j->w.run = job_run;
	j->w.done = job_done;
	j->deadline = loop_now(sh->loop) + CALL_TIMEOUT + bytes / CALL_RATE * USEC_PER_SEC;
	j->prev = sh->tail;
	j->next = NULL;
	if (sh->tail)
		sh->tail->next = j;
	else
		sh->head = j;
	sh->tail = j;
	if (worker_submit(sh->wk, &j->w) < 0) {
		if (j->prev)
			j->prev->next = NULL;
		else
			sh->head = NULL;
		sh->tail = j->prev;
		return -ENODEV;
	}
	arm(sh);
	return 0;
}

static void unlink_job(struct shared *sh, struct sjob *j)
{
	if (j->prev)
		j->prev->next = j->next;
	else
		sh->head = j->next;
	if (j->next)
		j->next->prev = j->prev;
	else
		sh->tail = j->prev;
	j->next = j->prev = NULL;
}

/* The copies still waiting give their objects back, uncopied. */
static void drop_waiting(struct shared *sh)
{
	while (sh->wait_head) {
		struct sjob *j = sh->wait_head;

		sh->wait_head = j->next;
		sh->queued_bytes -= j->len;
		store_shared_copied(sh->st, j->o, false);
		job_free(j);
	}
	sh->wait_tail = NULL;
}

/* The tier goes off (reads too unless only writes failed), once said. */
static void go_off(struct shared *sh, int err, const char *what, bool writes_only)
{
	bool was = writes_only ? sh->writable : sh->on;

	drop_waiting(sh);
	if (writes_only)
		sh->writable = false;
	else
		sh->on = sh->writable = false;
	if (!was)
		return;
	sh->c.offs++;
	snprintf(sh->why, sizeof(sh->why), "%s: %s", what, strerror(-err));
	log_warn("shared tier %s %s (%s); serving from memory and this node, trying again "
		 "every second (stat shared.offs)", sh->dir,
		 writes_only ? "takes no more copies" : "is off", sh->why);
	sh->probe_at = loop_now(sh->loop) + PROBE_EVERY;
	arm(sh);
}

/* What an error of a call says of the directory. */
static void note_error(struct shared *sh, int err, const char *what)
{
	switch (err) {
	case -ENOSPC:
	case -EDQUOT:
	case -EROFS:
	case -EACCES:
	case -EPERM:
	case -EFBIG:
		go_off(sh, err, what, true);
		break;
	case -ENOMEM:
	case -EEXIST:
	case -ENOENT:
		break;
	default: /* EIO, ESTALE, ENOTCONN, ENODEV, ...: the directory is sick */
		go_off(sh, err, what, false);
	}
}

static struct cache_slot *cache_slot(struct shared *sh, struct khash h)
{
	return &sh->cache[h.lo % CACHE_SLOTS];
}

static void cache_put(struct shared *sh, struct khash h, bool present)
{
	struct cache_slot *s = cache_slot(sh, h);

	*s = (struct cache_slot) { h, loop_now(sh->loop) + CACHE_TTL, present };
}

/* 1 present, 0 absent, -1 not known lately. */
static int cache_get(struct shared *sh, struct khash h)
{
	struct cache_slot *s = cache_slot(sh, h);

	if (s->until <= loop_now(sh->loop) || s->h.hi != h.hi || s->h.lo != h.lo)
		return -1;
	sh->c.cache_hits++;
	return s->present;
}

static void count_usage(struct shared *sh, unsigned dir, int64_t bytes, int64_t records)
{
	sh->dir_bytes[dir] += (uint64_t) bytes;
	sh->dir_records[dir] += (uint64_t) records;
	sh->usage += (uint64_t) bytes;
	sh->records += (uint64_t) records;
}

static void write_done(struct shared *sh, struct sjob *j)
{
	struct object *o = j->o;
	bool ok = j->res == 0 || j->res == -EEXIST;

	sh->n_writes--;
	sh->queued_bytes -= j->len;
	if (j->res == 0) {
		sh->c.writes++;
		sh->c.write_bytes += j->len;
		count_usage(sh, top_dir(j->h), (int64_t) j->rec_size, 1);
		sh->dir_age[top_dir(j->h)][0] += j->rec_size;
		sh->age_total[0] += j->rec_size;
	} else if (j->res == -EEXIST)
		sh->c.write_skips++;
	else {
		sh->c.write_errors++;
		note_error(sh, j->res, "writing a record");
	}
	if (ok)
		cache_put(sh, j->h, true);
	store_shared_copied(sh->st, o, ok);
}

/* A read ends: its placeholder lands or misses (unless it was let go). */
static void read_end(struct shared *sh, struct sjob *j, int res)
{
	if (j->detached) {
		store_land_free(sh->st, j->o);
		return;
	}
	if (res == 0) {
		sh->c.reads++;
		sh->c.read_bytes += j->len;
		if (j->direct)
			sh->c.direct_reads++;
		store_land_done(sh->st, j->o, 0, true, j->sum);
		return;
	}
	if (res == -ENOENT) {
		sh->c.read_misses++;
		cache_put(sh, j->h, false);
	} else if (res == -EPROTONOSUPPORT)
		sh->c.skipped_newer++;
	else if (res == -EBADMSG)
		sh->c.skipped_damaged++;
	else {
		sh->c.read_errors++;
		note_error(sh, res, "reading a record");
	}
	/* whatever went wrong there, a miss here */
	store_land_done(sh->st, j->o, -ENOENT, false, 0);
}

/* A place in memory for a read whose record is in: false while there is
 * no room yet and time is left (what must give way may be being copied
 * first); true once it is placed and copying, or has ended. */
static bool try_place(struct shared *sh, struct sjob *j)
{
	int r;

	j->o->len = j->len;
	r = store_land_place(sh->st, j->o);
	if (r == 0) {
		j->dst = store_object_ptr(j->o);
		j->kind = SJ_COPY;
		if (submit(sh, j, j->len) == 0)
			return true;
		r = -ENODEV;
	}
	j->o->len = 0;
	if (r == -ENOSPC && loop_now(sh->loop) < j->deadline)
		return false;
	/* no room here: its waiters hear so */
	store_land_done(sh->st, j->o, r, false, 0);
	job_free(j);
	return true;
}

static void unlink_record(struct shared *sh, struct khash h)
{
	struct sjob *j = calloc(1, sizeof(*j));

	if (!j)
		return;
	j->kind = SJ_UNLINK;
	j->h = h;
	cache_put(sh, h, false);
	if (submit(sh, j, 0) < 0)
		free(j);
}

static void head_done(struct shared *sh, struct sjob *j)
{
	if (j->res == 0 && !j->detached) {
		uint64_t rm = removed_at(sh, j->key, j->key_len);

		if (rm && j->hdr.created_ms <= rm) {
			/* removed since it was written: a miss, and it goes */
			sh->c.removed_skips++;
			if (sh->writable)
				unlink_record(sh, j->h);
			store_land_done(sh->st, j->o, -ENOENT, false, 0);
			job_free(j);
			return;
		}
		j->deadline = loop_now(sh->loop) + CALL_TIMEOUT;
		if (try_place(sh, j))
			return;
		j->next = NULL;
		if (sh->room_tail)
			sh->room_tail->next = j;
		else
			sh->room_head = j;
		sh->room_tail = j;
		arm(sh);
		return;
	}
	read_end(sh, j, j->res);
	job_free(j);
}

/* Reads waiting for room try again, oldest first, until one still finds
 * none (those out of time end). */
static void retry_room(struct shared *sh)
{
	sh->room_freed = false;
	while (sh->room_head) {
		struct sjob *j = sh->room_head;

		sh->room_head = j->next;
		if (!sh->room_head)
			sh->room_tail = NULL;
		j->next = NULL;
		if (!try_place(sh, j)) {
			/* still none: back at the head, the rest wait behind */
			j->next = sh->room_head;
			sh->room_head = j;
			if (!sh->room_tail)
				sh->room_tail = j;
			break;
		}
	}
}

static void copy_done(struct shared *sh, struct sjob *j)
{
	if (j->res == -EBADMSG) {
		sh->c.checksum_failures++;
		log_warn_ratelimited("shared record of %s: checksum mismatch; not served", j->key);
	}
	read_end(sh, j, j->res);
	job_free(j);
}

static void stat_done(struct shared *sh, struct sjob *j)
{
	if (j->res < 0)
		note_error(sh, j->res, "looking for records");
	else
		for (size_t i = 0; i < j->n; i++) {
			/* a record written before its key's removal is not there */
			uint64_t rm = j->rm_ms[i], mtime = j->rm_ms[STAT_MAX + i];

			cache_put(sh, j->keys[i], j->present[i] && !(rm && mtime <= rm));
		}
	if (j->f) {
		fetch_wake(j->f, 0); /* each asks again, settled: the cache answers */
		free(j->f);
	}
	job_free(j);
}

/* The records older than the oldest ages whose bytes, with the ages
 * before them, make up what must go to bring usage to the low watermark
 * (0: nothing must go). */
static time_t eviction_cutoff(struct shared *sh)
{
	double high = store_config(sh->st)->high_watermark;
	double ratio = store_config(sh->st)->eviction_ratio;
	uint64_t size = store_config(sh->st)->shared_size;
	uint64_t hi = (uint64_t) ((double) size * high), lo = (uint64_t) ((double) size * (high - ratio));
	uint64_t need, got = 0;

	/* (until every directory was counted once, usage is a guess low) */
	if (sh->usage <= hi || sh->scanned < SUBDIRS)
		return 0;
	need = sh->usage - lo;
	/* whole buckets, oldest first, until they make up what must go (at
	 * most one bucket, an eighth of an octave of ages, more) */
	for (int b = AGE_BUCKETS - 1; b >= 0; b--) {
		got += sh->age_total[b];
		if (got >= need)
			return time(NULL) - (time_t) age_floor((unsigned) b);
	}
	return time(NULL); /* everything (but what is younger than a lease) */
}

static void scan_done(struct shared *sh, struct sjob *j)
{
	unsigned d = j->dir;

	sh->scanning = false;
	if (j->res < 0)
		note_error(sh, j->res, "scanning records");
	else {
		count_usage(sh, d, (int64_t) j->bytes - (int64_t) sh->dir_bytes[d],
			    (int64_t) j->records - (int64_t) sh->dir_records[d]);
		for (unsigned b = 0; b < AGE_BUCKETS; b++) {
			sh->age_total[b] += j->age_bytes[b] - sh->dir_age[d][b];
			sh->dir_age[d][b] = j->age_bytes[b];
		}
		sh->c.evicted += j->evicted;
		sh->c.evicted_bytes += j->evicted_bytes;
		sh->c.tmp_removed += j->tmp_removed;
		sh->scan_next = (d + 1) % SUBDIRS;
		sh->scanned++;
	}
	/* the first time round at once; above the watermark soon */
	sh->cutoff = eviction_cutoff(sh);
	sh->scan_at = loop_now(sh->loop) +
		      (sh->scanned < SUBDIRS ? 0 : sh->cutoff ? SCAN_GAP / 16 : SCAN_GAP);
	job_free(j);
	arm(sh);
}

/* A probe found the tier gone while it was on. */
static void go_off_logged(struct shared *sh)
{
	drop_waiting(sh);
	sh->c.offs++;
	log_warn("shared tier %s is off (%s); serving from memory and this node, trying again "
		 "every second (stat shared.offs)", sh->dir, sh->why);
}

/* The removals a probe listed become this node's, with its own of the
 * last moments that the listing may not have seen yet. */
static void take_removals(struct shared *sh, struct sjob *j)
{
	uint64_t now = wall_ms();

	for (unsigned i = 0; i < sh->n_rm && j->n_rm < REMOVALS_MAX; i++) {
		const struct removal *r = &sh->rm[i];
		bool listed = false;

		if (r->ms + REMOVAL_FRESH_MS < now)
			continue;
		for (unsigned k = 0; k < j->n_rm && !listed; k++)
			listed = j->rm[k].ms == r->ms && j->rm[k].len == r->len &&
				 !memcmp(j->rm[k].prefix, r->prefix, r->len);
		if (!listed)
			j->rm[j->n_rm++] = *r;
	}
	qsort(j->rm, j->n_rm, sizeof(*j->rm), cmp_removal);
	if (j->n_rm != sh->n_rm || j->rm_before > sh->rm_before ||
	    memcmp(j->rm, sh->rm, j->n_rm * sizeof(*j->rm)))
		memset(sh->cache, 0, sizeof(sh->cache)); /* some may be removed now */
	memcpy(sh->rm, j->rm, j->n_rm * sizeof(*j->rm));
	sh->n_rm = j->n_rm;
	if (j->rm_before > sh->rm_before)
		sh->rm_before = j->rm_before;
}

static void probe_done(struct shared *sh, struct sjob *j)
{
	bool was_on = sh->on, was_writable = sh->writable;

	if (j->listed) {
		/* (room for this node's own too) */
		struct removal *g = realloc(j->rm, REMOVALS_MAX * sizeof(*j->rm));

		if (g) {
			j->rm = g;
			take_removals(sh, j);
		}
	}
	sh->probing = false;
	/* not back while a call is still hung in it */
	sh->on = j->readable && !sh->n_hung;
	sh->writable = j->writable && sh->on;
	if (j->readable && sh->n_hung)
		snprintf(sh->why, sizeof(sh->why), "%u call(s) still hung in it", sh->n_hung);
	else if (!j->readable && j->res < 0)
		snprintf(sh->why, sizeof(sh->why), "%s",
			 j->res == -ESTALE ? "another filesystem is there now (unmounted?)"
					   : strerror(-j->res));
	else if (!j->writable && j->res < 0)
		snprintf(sh->why, sizeof(sh->why), "not writable: %s", strerror(-j->res));
	else
		sh->why[0] = '\0';
	if (sh->on && (!was_on || (sh->writable && !was_writable)))
		log_notice("shared tier %s is %s", sh->dir,
			   sh->writable ? "on" : "on for reads (not writable)");
	if (was_on && !sh->on)
		go_off_logged(sh);
	else if (!sh->probed && !sh->on)
		log_warn("shared tier %s cannot be used (%s); serving from memory and this node, "
			 "trying again every second", sh->dir, sh->why);
	else if (!sh->probed && !sh->writable)
		log_warn("shared tier %s takes no copies (%s); reading what is there", sh->dir,
			 sh->why);
	sh->probed = true;
	sh->probe_at = loop_now(sh->loop) + (sh->on && sh->writable ? PROBE_ON_EVERY : PROBE_EVERY);
	job_free(j);
	arm(sh);
}

/* Copies that waited, as others end. */
static void pump_writes(struct shared *sh)
{
	while (sh->wait_head && sh->n_writes < WRITES_MAX) {
		struct sjob *j = sh->wait_head;

		sh->wait_head = j->next;
		if (!sh->wait_head)
			sh->wait_tail = NULL;
		j->next = NULL;
		if (submit(sh, j, j->len) < 0) {
			sh->queued_bytes -= j->len;
			store_shared_copied(sh->st, j->o, false);
			job_free(j);
			continue;
		}
		sh->n_writes++;
	}
}

static void job_done(struct work *w)
{
	struct sjob *j = (struct sjob *) w;
	struct shared *sh = j->sh;

	unlink_job(sh, j);
	if (j->detached)
		sh->n_hung--; /* back at last */
	switch (j->kind) {
	case SJ_PROBE:
		probe_done(sh, j);
		break;
	case SJ_WRITE:
		write_done(sh, j);
		job_free(j);
		pump_writes(sh);
		break;
	case SJ_HEAD:
		head_done(sh, j);
		break;
	case SJ_COPY:
		copy_done(sh, j);
		break;
	case SJ_STAT:
		stat_done(sh, j);
		break;
	case SJ_SCAN:
		scan_done(sh, j);
		break;
	case SJ_UNLINK:
		if (j->res == 0)
			sh->c.unlinked++;
		job_free(j);
		break;
	case SJ_REMOVE:
		if (j->res < 0)
			note_error(sh, j->res, "writing a removal");
		else
			sh->c.removals_written++;
		job_free(j);
		break;
	}
}

static void start_probe(struct shared *sh)
{
	struct sjob *j = calloc(1, sizeof(*j));

	if (!j)
		return;
	j->kind = SJ_PROBE;
	j->write_test = !sh->on || !sh->writable;
	/* removals older than the oldest record the scans found go */
	if (sh->scanned >= SUBDIRS && sh->writable) {
		int b = AGE_BUCKETS - 1;

		while (b > 0 && !sh->age_total[b])
			b--;
		if (b < AGE_BUCKETS - 1) {
			uint64_t age_ms = (age_floor((unsigned) b + 1) + 3600) * 1000, now = wall_ms();

			j->prune_before = now > age_ms ? now - age_ms : 0;
		}
	}
	sh->probing = true;
	if (submit(sh, j, 0) < 0) {
		sh->probing = false;
		free(j);
	}
}

static void start_scan(struct shared *sh)
{
	struct sjob *j = calloc(1, sizeof(*j));

	if (!j)
		return;
	j->kind = SJ_SCAN;
	j->dir = sh->scan_next;
	j->cutoff = sh->writable ? sh->cutoff : 0;
	sh->scanning = true;
	if (submit(sh, j, 0) < 0) {
		sh->scanning = false;
		free(j);
	}
}

/* Calls out of time (oldest first): the tier goes off, and whoever waits
 * on them is let go; each stays in memory until its thread comes back. */
static void on_timer(struct loop_source *s, void *u)
{
	struct shared *sh = u;
	usec_t now = loop_now(sh->loop);

	(void) s;
	for (struct sjob *j = oldest_live(sh); j && j->deadline <= now; j = j->next) {
		if (j->detached)
			continue;
		j->detached = true;
		sh->n_hung++;
		sh->c.timeouts++;
		go_off(sh, -ETIMEDOUT, "a call did not return in time", false);
		if ((j->kind == SJ_HEAD || j->kind == SJ_COPY) && j->o)
			store_land_detach(sh->st, j->o, -ENOENT);
		else if (j->kind == SJ_STAT && j->f) {
			fetch_wake(j->f, 0);
			free(j->f);
			j->f = NULL;
		}
	}
	if (sh->room_head)
		retry_room(sh);
	if (!sh->probing && now >= sh->probe_at)
		start_probe(sh);
	if (sh->on && !sh->scanning && now >= sh->scan_at)
		start_scan(sh);
	arm(sh);
}

/* ---- the backend table ---- */

static int be_spill(void *be, struct object *o)
{
	struct shared *sh = be;
	struct sjob *j;
	const char *key = o->key;

	if (sh->queued_bytes && sh->queued_bytes + o->len > sh->queue_max) {
		sh->c.copies_deferred++;
		return -EBUSY; /* held objects would crowd memory: later */
	}
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->kind = SJ_WRITE;
	j->o = o;
	j->src = store_object_ptr(o);
	j->len = o->len;
	j->summed = o->flags & OBJ_SUMMED;
	j->sum = o->sum;
	j->replace = o->flags & OBJ_REPLACED;
	j->rm_before = removed_at(sh, key, o->key_len);
	j->key_len = o->key_len;
	memcpy(j->key, key, o->key_len);
	j->h = key_hash(key, o->key_len);
	sh->queued_bytes += o->len;
	if (sh->wait_tail)
		sh->wait_tail->next = j;
	else
		sh->wait_head = j;
	sh->wait_tail = j;
	pump_writes(sh);
	return 0;
}

static bool be_accepting(void *be, const struct object *o)
{
	const struct shared *sh = be;

	return sh->on && sh->writable && o->key_len <= WIRE_MAX_KEY;
}

static int be_locate(void *be, struct object *o)
{
	struct shared *sh = be;
	struct khash h = key_hash(o->key, o->key_len);
	struct sjob *j;

	if (!sh->on || o->key_len > WIRE_MAX_KEY || cache_get(sh, h) == 0)
		return -ENOENT;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOENT;
	j->kind = SJ_HEAD;
	j->o = o;
	j->h = h;
	j->key_len = o->key_len;
	memcpy(j->key, o->key, o->key_len);
	if (submit(sh, j, 0) < 0) {
		free(j);
		return -ENOENT;
	}
	return 0;
}

static int be_where(void *be, const char *const *keys, const size_t *lens, size_t n,
		    uint8_t *present, bool settle, struct fetch **ret)
{
	struct shared *sh = be;
	struct sjob *j = NULL;

	if (!sh->on)
		return 0;
	sh->c.lookups++;
	for (size_t i = 0; i < n; i++) {
		struct khash h;
		int c;

		if (present[i] || lens[i] > WIRE_MAX_KEY)
			continue;
		h = key_hash(keys[i], lens[i]);
		c = cache_get(sh, h);
		if (c >= 0) {
			present[i] = (uint8_t) c;
			continue;
		}
		if (settle)
			continue; /* not known by now: absent */
		if (!j) {
			j = calloc(1, sizeof(*j));
			if (j) {
				j->keys = calloc(n < STAT_MAX ? n : STAT_MAX, sizeof(*j->keys));
				j->present = calloc(n < STAT_MAX ? n : STAT_MAX, 1);
				/* removals' times, then the records' (mtime) */
				j->rm_ms = calloc(2 * STAT_MAX, sizeof(*j->rm_ms));
				j->f = calloc(1, sizeof(*j->f));
			}
			if (!j || !j->keys || !j->present || !j->rm_ms || !j->f) {
				if (j)
					free(j->f);
				if (j)
					job_free(j);
				return 0;
			}
		}
		if (j->n < STAT_MAX) {
			j->rm_ms[j->n] = removed_at(sh, keys[i], lens[i]);
			j->keys[j->n++] = h;
		}
		sh->c.lookup_keys++;
	}
	if (!j)
		return 0;
	j->kind = SJ_STAT;
	if (submit(sh, j, 0) < 0) {
		free(j->f);
		job_free(j);
		return 0;
	}
	*ret = j->f;
	return -EINPROGRESS;
}

static void be_stats(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	const struct shared *sh = be;

	emit(u, "shared.on", sh->on);
	emit(u, "shared.writable", sh->writable);
	emit(u, "shared.size", store_config(sh->st)->shared_size);
	emit(u, "shared.bytes", sh->usage);
	emit(u, "shared.records", sh->records);
	emit(u, "shared.scanned_dirs", sh->scanned);
	emit(u, "shared.writes", sh->c.writes);
	emit(u, "shared.write_bytes", sh->c.write_bytes);
	emit(u, "shared.write_skips", sh->c.write_skips);
	emit(u, "shared.write_errors", sh->c.write_errors);
	emit(u, "shared.write_queued_bytes", sh->queued_bytes);
	emit(u, "shared.reads", sh->c.reads);
	emit(u, "shared.read_bytes", sh->c.read_bytes);
	emit(u, "shared.direct_reads", sh->c.direct_reads);
	emit(u, "shared.read_misses", sh->c.read_misses);
	emit(u, "shared.read_errors", sh->c.read_errors);
	emit(u, "shared.skipped_newer", sh->c.skipped_newer);
	emit(u, "shared.skipped_damaged", sh->c.skipped_damaged);
	emit(u, "shared.checksum_failures", sh->c.checksum_failures);
	emit(u, "shared.lookups", sh->c.lookups);
	emit(u, "shared.lookup_keys", sh->c.lookup_keys);
	emit(u, "shared.cache_hits", sh->c.cache_hits);
	emit(u, "shared.offs", sh->c.offs);
	emit(u, "shared.timeouts", sh->c.timeouts);
	emit(u, "shared.evicted", sh->c.evicted);
	emit(u, "shared.evicted_bytes", sh->c.evicted_bytes);
	emit(u, "shared.tmp_removed", sh->c.tmp_removed);
	emit(u, "shared.unlinked", sh->c.unlinked);
	emit(u, "shared.removals", sh->n_rm);
	emit(u, "shared.removals_written", sh->c.removals_written);
	emit(u, "shared.removed_skips", sh->c.removed_skips);
	emit(u, "shared.copies_deferred", sh->c.copies_deferred);
}

static const struct below_ops shared_backend = {
	.version = BELOW_OPS_VERSION,
	.name = "shared",
	.spill = be_spill,
	.accepting = be_accepting,
	.stats = be_stats,
	.locate = be_locate,
	.where = be_where,
};

/* A client removed key: its record goes too (a prefix: see
 * docs/shared-tier.rst). */

/* A removal heeded here at once (the newest; the oldest kept gives way). */
static void add_removal(struct shared *sh, uint64_t ms, const void *prefix, size_t len)
{
	if (sh->n_rm == REMOVALS_MAX) {
		sh->rm_before = sh->rm[0].ms > sh->rm_before ? sh->rm[0].ms : sh->rm_before;
		memmove(sh->rm, sh->rm + 1, (REMOVALS_MAX - 1) * sizeof(*sh->rm));
		sh->n_rm--;
	}
	sh->rm[sh->n_rm].ms = ms;
	sh->rm[sh->n_rm].len = (uint32_t) len;
	if (len) /* (everything: no prefix at all) */
		memcpy(sh->rm[sh->n_rm].prefix, prefix, len);
	sh->rm[sh->n_rm].prefix[len] = '\0';
	sh->n_rm++;
	memset(sh->cache, 0, sizeof(sh->cache)); /* what it said may be removed now */
}

/* A client removed key, or every key starting with it (prefix; empty:
 * all): its record goes; a removal by prefix is written for every node,
 * which then serves no record of such a key written before it. */
static void on_removed(void *data, const void *key, size_t len, bool prefix)
{
	struct shared *sh = data;
	struct sjob *j;

	if (!sh->on || !sh->writable || len > WIRE_MAX_KEY || (!prefix && !len))
		return;
	if (!prefix) {
		unlink_record(sh, key_hash(key, len));
		return;
	}
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->kind = SJ_REMOVE;
	j->rm_before = wall_ms();
	j->key_len = (uint32_t) len;
	if (len)
		memcpy(j->key, key, len);
	add_removal(sh, j->rm_before, key, len);
	if (submit(sh, j, 0) < 0)
		free(j);
}

/* A copy below ended: reads waiting for room try again (from the timer:
 * a listener never calls back into the store). */
static void on_space_freed(void *data)
{
	struct shared *sh = data;

	if (!sh->room_head)
		return;
	sh->room_freed = true;
	arm(sh);
}

static const struct store_events shared_events = {
	.version = STORE_EVENTS_VERSION,
	.removed = on_removed,
	.space_freed = on_space_freed,
};

int shared_new(struct store *st, struct shared **ret)
{
	const struct config *cfg = store_config(st);
	struct shared *sh;
	int r;

	*ret = NULL;
	if (!cfg->shared_dir[0])
		return 0;
	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return -ENOMEM;
	sh->st = st;
	sh->loop = store_loop(st);
	sh->queue_max = cfg->dram_size / 4 < QUEUED_BYTES_MAX ? cfg->dram_size / 4 : QUEUED_BYTES_MAX;
	if (cfg->test.shared_write_ms)
		log_warn("KVCACHE_TEST_SHARED_WRITE_MS: each copy to the shared tier waits %u ms first",
			 cfg->test.shared_write_ms);
	sh->rm = calloc(REMOVALS_MAX, sizeof(*sh->rm));
	if (!sh->rm) {
		free(sh);
		return -ENOMEM;
	}
	snprintf(sh->dir, sizeof(sh->dir), "%s", cfg->shared_dir);
	snprintf(sh->root, sizeof(sh->root), "%s/kvcache-v1", cfg->shared_dir);
	{
		struct timespec t;

		clock_gettime(CLOCK_REALTIME, &t);
		sh->tag = XXH3_64bits_withSeed(&t, sizeof(t), (uint64_t) getpid());
	}
	r = worker_new_shared(sh->loop, "shared", THREADS, LOOP_HELPER_NORMAL, &one_queue, sh, &sh->wk);
	if (r == 0)
		r = loop_add_timer(sh->loop, on_timer, sh, &sh->timer);
	if (r < 0) {
		worker_free(sh->wk);
		free(sh->rm);
		free(sh);
		return r;
	}
	*ret = sh;
	r = store_shared_attach(st, &shared_backend, sh);
	if (r < 0)
		return r;
	store_add_listener(st, &sh->listener, &shared_events, sh);
	sh->probe_at = 0;
	start_probe(sh); /* on at its answer */
	log_info("shared tier: %s, %llu bytes%s", sh->dir, (unsigned long long) cfg->shared_size,
		 cfg->shared_write_through ? ", written through" : "");
	return 0;
}

/* A tier left behind at exit with a call hung in the filesystem (kept
 * reachable: its memory goes with the process, not leaked before). */
static struct shared *left_hung;

void shared_free(struct shared *sh)
{
	bool hung = false;

	if (!sh)
		return;
	store_remove_listener(sh->st, &sh->listener);
	for (struct sjob *j = sh->head; j; j = j->next)
		hung |= j->detached;
	if (hung)
		/* a call still hangs in the filesystem: waiting for it could
		 * be forever; the process ends without it, and its memory
		 * with the process */
		log_warn("shared tier %s: a call is still hung in the filesystem; not waiting "
			 "for it", sh->dir);
	else
		/* what is in flight ends; its done() runs here (copies let
		 * their objects go, reads end their placeholders) */
		worker_free(sh->wk);
	drop_waiting(sh);
	while (sh->room_head) {
		struct sjob *j = sh->room_head;

		sh->room_head = j->next;
		store_land_done(sh->st, j->o, -ESHUTDOWN, false, 0);
		job_free(j);
	}
	store_shared_detach(sh->st);
	loop_source_free(sh->timer);
	if (hung)
		left_hung = sh;
	else {
		free(sh->rm);
		free(sh);
	}
}
