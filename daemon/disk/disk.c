/* SPDX-License-Identifier: MIT */
/*
 * The disk tier: objects spilled from memory into one record file each,
 * written and read with io_uring, O_DIRECT where the filesystem allows.
 *
 * Spilling happens ahead of need: when the lowest memory tier fills up, the
 * loop's maintenance writes clean copies of the objects at its LRU tail.
 * Evicting an object that has a clean copy then only frees its memory (the
 * object stays in the index, on disk).  A write that fails (a full
 * filesystem, a read-only directory, an I/O error) costs nothing but the
 * copy: the object stays in memory, the failure is counted and logged, and
 * spilling backs off for a moment.
 *
 * Reading back is asynchronous too: a get of a disk-only object starts a
 * read and parks the request (see channel.c); when the read completes and
 * the checksum matches, the object moves into dram and the request runs.
 * The loop never waits for the disk.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <zstd.h>

#include "disk.h"
#include "disk-record.h"
#include "handoff.h"
#include "worker.h"
#include "loop.h"
#include "log.h"

#define LOG_TOPIC "disk"

#define RING_ENTRIES 64
#define MAX_INFLIGHT 16
#define MAX_INFLIGHT_BYTES (UINT64_C(256) << 20)
#define BACKOFF_MS 1000 /* (ms) */
#define BACKOFF (BACKOFF_MS * USEC_PER_MSEC)

enum io_kind {
	IO_WRITE,
	IO_RENAME,  /* a written record: <id>.tmp becomes <id>.kvr */
	IO_READ,
	IO_UNLINK,
};

struct disk_io {
	struct work work;              /* on the worker, then back on the loop */
	struct disk *k;
	struct disk_io *next, *prev;   /* all I/O in flight */
	struct disk_io *qnext;         /* k->space_wait */
	enum io_kind kind;
	bool preparing;                /* write: the worker is building the record */
	bool cancelled;                /* its object went away while it was */
	struct object *o;              /* NULL once its object went away */
	const uint8_t *src;            /* write: the value (pinned) */
	uint64_t vlen;
	struct shm_block *block;       /* read: where the value goes in dram */
	uint8_t *dst;
	struct disk_record_hdr hdr;
	int res;                       /* read: the worker's verdict */
	char key[512];
	uint32_t key_len;
	uint64_t id;
	int fd;
	uint8_t *buf;
	uint64_t cap;                  /* buf's size, for the pool */
	uint64_t len;
	char name[32];
	char final[32];                /* writes: the name it is renamed to */
	usec_t deadline;               /* reads: give up waiting for dram */
};

/* Counters for stats (be_stats()); false when there is no disk tier. */
struct disk_counters {
	uint64_t records, bytes, raw_bytes, writes, write_bytes, reads, read_bytes;
	uint64_t checksum_failures, io_errors, enospc, recovered, skipped, pending;
	uint64_t flush_pending;
	uint64_t flush_unwritten, flush_error; /* how the last flush ended */
	uint64_t recovering, recovery_total;   /* records found at start */
	bool direct, compress;
};

/* Bounce buffers are kept for reuse: a fresh 16 MiB allocation costs
 * page faults and zeroing on every record. */
#define POOL_MAX 16

struct pooled {
	uint8_t *buf;
	uint64_t cap;
};

struct disk {
	struct store *st;
	int dirfd;
	struct pooled pool[POOL_MAX];
	unsigned n_pool;
	XXH3_state_t *hash;            /* the worker's */
	uint8_t *scratch;              /* the worker's: decompressed values */
	uint64_t scratch_cap;
	/* the worker builds records (copy, hash, compress) and checks what
	 * is read back, so the loop never spends milliseconds on a large
	 * value */
	struct worker *wk;
	bool stopping;                 /* disk_free(): what the worker ends is let be */
	struct {
		struct object *head, *tail;
		uint64_t n;
	} dirty;                       /* the objects to copy (dirty_update()) */
	struct store_listener listener; /* objects published */
	char dir[4096];
	struct io_uring ring;
	int efd;
	struct loop_source *bell, *poller, *space_timer;
	bool direct;                   /* O_DIRECT works here */
	bool zstd;
	int level;
	ZSTD_CCtx *cctx;
	ZSTD_DCtx *dctx;
	uint64_t next_id;
	struct disk_io *ios;
	unsigned inflight, queued;     /* queued: prepared, not yet submitted */
	uint64_t inflight_bytes;
	usec_t backoff_until;
	bool flushing;
	int last_err;                  /* errno of the latest failed write */
	/* recovery (see recover()): the thread's stack, and the loop's part
	 * of it not indexed yet, in order */
	struct worker *rec_wk;         /* one thread while recovering */
	struct work rec_work;          /* its one piece: the whole walk */
	bool rec_stop, rec_thread_done, recovering;
	struct found *rec_found;
	size_t rec_n;
	uint64_t rec_posted, rec_taken, rec_skipped;
	struct rec_item *rec_ready, *rec_mine, **rec_mine_tail;
	struct disk_io *space_wait;    /* reads waiting for dram (qnext) */
	bool space_freed;              /* a copy ended since reads last looked */
	usec_t space_check;
	struct disk_counters c;
};

static void queue_job(struct disk *k, struct disk_io *io);
static void io_prepared(struct work *w);
static void submit_after(void *data);
static bool disk_poll(struct disk *k);
static void disk_submit(struct disk *k);
static void disk_flush_start(struct disk *k);

static int disk_spill(struct disk *k, struct object *o);
static void disk_forget(struct disk *k, struct object *o);
static int disk_load(struct disk *k, struct object *o);
static bool disk_accepting(const struct disk *k, const struct object *o);
static bool disk_maintain(struct disk *k);
static const struct below_ops disk_backend;

/*
 * The objects to copy: memory objects without a copy here yet (nor one
 * being taken), newest at the head; spilling takes the oldest, at the
 * tail, with no walk.  Kept here from what the store tells (an object
 * published; forget()) and what the tier does itself (a copy begun,
 * failed).
 */
static void dirty_unlist(struct disk *k, struct object *o)
{
	if (!o->below_listed)
		return;
	if (o->below_prev)
		o->below_prev->below_next = o->below_next;
	else
		k->dirty.head = o->below_next;
	if (o->below_next)
		o->below_next->below_prev = o->below_prev;
	else
		k->dirty.tail = o->below_prev;
	o->below_prev = o->below_next = NULL;
	k->dirty.n--;
	o->below_listed = false;
}

static void dirty_update(struct disk *k, struct object *o)
{
	bool want = store_object_resident(o) && !o->below_ref && !o->below_io;

	if (want == o->below_listed)
		return;
	if (!want) {
		dirty_unlist(k, o);
		return;
	}
	o->below_prev = NULL;
	o->below_next = k->dirty.head;
	if (k->dirty.head)
		k->dirty.head->below_prev = o;
	else
		k->dirty.tail = o;
	k->dirty.head = o;
	k->dirty.n++;
	o->below_listed = true;
}

static void on_published(void *data, struct object *o)
{
	dirty_update(data, o);
}

static void on_space_freed(void *data)
{
	((struct disk *) data)->space_freed = true;
}

static const struct store_events disk_events = {
	.version = STORE_EVENTS_VERSION,
	.published = on_published,
	.space_freed = on_space_freed,
};
static void decode_record(struct disk *k, struct disk_io *io);
static void read_finish(struct disk *k, struct disk_io *io, int r);

int disk_record_check(const void *buf, size_t len, uint64_t file_size, struct disk_record_hdr *ret)
{
	struct disk_record_hdr h;

	if (len < sizeof(h))
		return -EBADMSG;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != DISK_RECORD_MAGIC || h.version != DISK_RECORD_VERSION)
		return -EBADMSG;
	if (h.key_len == 0 || h.key_len > 511 || sizeof(h) + h.key_len > len)
		return -EBADMSG;
	if (h.flags & ~DISK_REC_ZSTD)
		return -EBADMSG;
	if (h.value_len == 0 || h.value_len > (UINT64_C(1) << 30) || h.stored_len > (UINT64_C(1) << 31))
		return -EBADMSG;
	if (!(h.flags & DISK_REC_ZSTD) && h.stored_len != h.value_len)
		return -EBADMSG;
	if (disk_record_size(h.key_len, h.stored_len) > file_size)
		return -EBADMSG; /* partial: the file ends before the record does */
	if (disk_record_header_sum(&h, (const uint8_t *) buf + sizeof(h)) != h.header_sum)
		return -EBADMSG;
	if (memchr((const uint8_t *) buf + sizeof(h), '\0', h.key_len))
		return -EBADMSG;
	*ret = h;
	return 0;
}

uint64_t disk_record_header_sum(const struct disk_record_hdr *h, const void *key)
{
	struct disk_record_hdr copy = *h;

	copy.header_sum = 0;
	/* the header's hash seeds the key's: one sum over both */
	return XXH3_64bits_withSeed(key, copy.key_len, XXH3_64bits(&copy, sizeof(copy)));
}

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static void record_name(char *buf, size_t len, uint64_t id, bool tmp)
{
	snprintf(buf, len, "%016llx.%s", (unsigned long long) id, tmp ? "tmp" : "kvr");
}

/* ---- set-up and recovery ---- */

static int open_record(struct disk *k, const char *name, int flags)
{
	int fd = -1;

	/* the worker opens records it writes, the loop those it reads */
	if (__atomic_load_n(&k->direct, __ATOMIC_RELAXED)) {
		fd = openat(k->dirfd, name, flags | O_DIRECT | O_CLOEXEC, 0600);
		if (fd < 0 && errno == EINVAL &&
		    __atomic_exchange_n(&k->direct, false, __ATOMIC_RELAXED))
			log_warn("%s refuses O_DIRECT; using buffered I/O", k->dir);
	}
	if (fd < 0 && !__atomic_load_n(&k->direct, __ATOMIC_RELAXED))
		fd = openat(k->dirfd, name, flags | O_CLOEXEC, 0600);
	return fd < 0 ? -errno : fd;
}

struct found {
	uint64_t id;
	uint64_t size;
};

static int cmp_found(const void *a, const void *b)
{
	uint64_t x = ((const struct found *) a)->id, y = ((const struct found *) b)->id;

	return x < y ? -1 : x > y;
}

/*
 * Recovery.  At start the directory is listed (one getdents pass: fast) and
 * the ids sorted; records are indexed newest first, each at the old end of
 * the LRU, so the newest record of a key wins and LRU order follows age.  Reading the records' headers (an open and a 4 KiB read
 * each: seconds for 100K records) is done by a thread; the loop indexes what
 * it posts, a bounded batch per turn, and serves clients meanwhile.  Objects
 * not yet indexed are misses.  A put made meanwhile gets an id above every
 * recovered one, so an older record of its key, found later, is deleted.
 */
struct rec_item {
	struct rec_item *next;
	uint64_t id;
	uint64_t file_size;
	struct disk_record_hdr h;
	char key[];
};

#define RECOVER_BATCH 1024

static void recover_run(struct work *w)
{
	struct disk *k = (struct disk *) ((char *) w - offsetof(struct disk, rec_work));
	uint8_t *buf = aligned_alloc(DISK_ALIGN, DISK_ALIGN);
	unsigned pause_ms = store_config(k->st)->test.recovery_pause_ms;
	uint64_t one = 1;

	for (size_t i = 0; buf && i < k->rec_n && !__atomic_load_n(&k->rec_stop, __ATOMIC_ACQUIRE);
	     i++) {
		struct disk_record_hdr h;
		struct rec_item *it;
		struct stat sb;
		char name[32];
		ssize_t got = -1;
		int fd;

		if (pause_ms && i % 1000 == 0) /* tests: recovery that takes a while */
			usleep(pause_ms * (useconds_t) USEC_PER_MSEC);
		/* newest first: the first record of a key wins, and each older
		 * one goes behind it on the LRU */
		record_name(name, sizeof(name), k->rec_found[k->rec_n - 1 - i].id, false);
		fd = openat(k->dirfd, name, O_RDONLY | O_CLOEXEC);
		if (fd >= 0 && fstat(fd, &sb) == 0)
			got = pread(fd, buf, DISK_ALIGN, 0);
		if (fd >= 0)
			close(fd);
		if (got < 0 || disk_record_check(buf, (size_t) got, (uint64_t) sb.st_size, &h) < 0) {
			log_warn("skipping damaged or partial record %s/%s", k->dir, name);
			unlinkat(k->dirfd, name, 0);
			__atomic_add_fetch(&k->rec_skipped, 1, __ATOMIC_RELAXED);
			continue;
		}
		it = malloc(sizeof(*it) + h.key_len + 1);
		if (!it)
			break;
		it->next = NULL;
		it->id = k->rec_found[k->rec_n - 1 - i].id;
		it->file_size = (uint64_t) sb.st_size;
		it->h = h;
		memcpy(it->key, buf + sizeof(h), h.key_len);
		it->key[h.key_len] = '\0';
		handoff_push(&k->rec_ready, it, next);
		if (__atomic_add_fetch(&k->rec_posted, 1, __ATOMIC_RELEASE) % 256 == 0 &&
		    write(k->efd, &one, sizeof(one)) < 0)
			break;
	}
	free(buf);
	__atomic_store_n(&k->rec_thread_done, true, __ATOMIC_RELEASE);
	if (write(k->efd, &one, sizeof(one)) < 0) {
		/* the counter is full: the loop is awake anyway */
	}
}

/* Loop: index one recovered record. */
static void recover_one(struct disk *k, struct rec_item *it)
{
	struct store *st = k->st;
	uint64_t disk_len = disk_record_size(it->h.key_len, it->h.stored_len);
	int r = store_recovered(st, it->key, it->h.key_len, it->h.value_len, it->h.value_sum,
				it->id, disk_len);

	if (r == -EEXIST) {
		/* stored since the start, or a newer record of the key: this
		 * record is an older version */
		char name[32];

		record_name(name, sizeof(name), it->id, false);
		unlinkat(k->dirfd, name, 0);
		k->c.skipped++;
		return;
	}
	if (r < 0)
		return;
	if (r == 1) /* in memory already: no copy to take any more */
		dirty_update(k, store_find(st, it->key, it->h.key_len));
	k->c.records++;
	k->c.bytes += disk_len;
	store_below_used(st, k->c.bytes);
	k->c.raw_bytes += it->h.value_len;
	k->c.recovered++;
}

/* Loop: index what the recovery thread posted, a batch per call. */
static bool recover_poll(struct disk *k)
{
	struct rec_item *fifo;
	unsigned n = 0;

	if (!k->recovering || (__atomic_load_n(&k->rec_posted, __ATOMIC_ACQUIRE) == k->rec_taken &&
			       !__atomic_load_n(&k->rec_thread_done, __ATOMIC_ACQUIRE)))
		return false;
	/* what was posted since, in posting order, behind what is left */
	fifo = handoff_take_fifo(&k->rec_ready, next);
	*k->rec_mine_tail = fifo;
	while (*k->rec_mine_tail)
		k->rec_mine_tail = &(*k->rec_mine_tail)->next;
	while (k->rec_mine && n < RECOVER_BATCH) {
		struct rec_item *it = k->rec_mine;

		k->rec_mine = it->next;
		recover_one(k, it);
		free(it);
		n++;
	}
	if (!k->rec_mine)
		k->rec_mine_tail = &k->rec_mine;
	k->rec_taken += n;
	if (k->rec_mine)
		return true;
	if (__atomic_load_n(&k->rec_thread_done, __ATOMIC_ACQUIRE) &&
	    k->rec_taken == __atomic_load_n(&k->rec_posted, __ATOMIC_ACQUIRE)) {
		worker_free(k->rec_wk); /* its walk is over: the thread ends */
		k->rec_wk = NULL;
		k->recovering = false;
		k->c.skipped += __atomic_load_n(&k->rec_skipped, __ATOMIC_RELAXED);
		free(k->rec_found);
		k->rec_found = NULL;
		log_notice("recovered %llu objects from %s, skipped %llu partial, damaged or stale",
			   (unsigned long long) k->c.recovered, k->dir,
			   (unsigned long long) k->c.skipped);
	}
	return n > 0;
}

/* List the directory (fast), then start the thread that reads headers. */
static int recover(struct disk *k)
{
	struct found *f = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	DIR *dir;
	int dfd, r;

	dfd = dup(k->dirfd);
	dir = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!dir)
		return -errno;
	while ((e = readdir(dir))) {
		unsigned long long id;
		char ext[8];

		if (sscanf(e->d_name, "%16llx.%3s", &id, ext) != 2 || strlen(e->d_name) != 20)
			continue;
		if (!strcmp(ext, "tmp")) {
			/* a write that never completed */
			unlinkat(k->dirfd, e->d_name, 0);
			k->c.skipped++;
			continue;
		}
		if (strcmp(ext, "kvr"))
			continue;
		if (n == cap) {
			struct found *nf = realloc(f, (cap = cap ? cap * 2 : 256) * sizeof(*f));

			if (!nf) {
				closedir(dir);
				free(f);
				return -ENOMEM;
			}
			f = nf;
		}
		f[n++] = (struct found) { id, 0 };
		if (id >= k->next_id)
			k->next_id = id + 1;
	}
	closedir(dir);
	if (!n) {
		free(f);
		return 0;
	}
	qsort(f, n, sizeof(*f), cmp_found);
	k->rec_found = f;
	k->rec_n = n;
	k->recovering = true;
	r = worker_new(NULL, "recover", 1, LOOP_HELPER_BATCH, &k->rec_wk); /* no done() */
	if (r == 0) {
		k->rec_work = (struct work) { .run = recover_run };
		r = worker_submit(k->rec_wk, &k->rec_work);
	}
	if (r < 0) {
		worker_free(k->rec_wk);
		k->rec_wk = NULL;
		k->recovering = false;
		free(f);
		k->rec_found = NULL;
		return r;
	}
	log_info("recovering %zu records from %s while serving", n, k->dir);
	return 0;
}


static bool disk_poller(void *userdata)
{
	return disk_poll(userdata);
}

/* Reads waiting for dram look again now and then, even when nothing else
 * wakes the loop; retry_landing() does the work in maintenance. */
static void space_deadline(struct loop_source *s, void *userdata)
{
}

int disk_new(struct store *st, struct disk **ret)
{
	struct disk *k;
	int r;

	*ret = NULL;
	if (!store_config(st)->disk_dir[0])
		return 0;
	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->st = st;
	k->efd = -1;
	snprintf(k->dir, sizeof(k->dir), "%s", store_config(st)->disk_dir);
	k->dirfd = open(k->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (k->dirfd < 0) {
		r = log_error_errno(errno, "Failed to open disk directory %s%s", k->dir,
				    store_config(st)->disk_from_ssd_offload ?
				    " (the config's enable_ssd_offload: its ssd_offload_path, or"
				    " Mooncake's default directory)" : "");
		free(k);
		return r;
	}
	k->direct = true;
	k->zstd = store_config(st)->disk_zstd;
	k->level = store_config(st)->disk_zstd_level;
	k->next_id = 1;
	k->hash = XXH3_createState();
	if (!k->hash) {
		close(k->dirfd);
		free(k);
		return -ENOMEM;
	}
	if (k->zstd) {
		k->cctx = ZSTD_createCCtx();
		k->dctx = ZSTD_createDCtx();
	} else
		k->dctx = ZSTD_createDCtx(); /* records written with zstd earlier */
	r = io_uring_queue_init(RING_ENTRIES, &k->ring, 0);
	if (r < 0) {
		log_error_errno(r, "Failed to set up io_uring for the disk tier");
		close(k->dirfd);
		free(k);
		return r;
	}
	{
		/* Blocking work (allocating writes, renames, unlinks) runs on
		 * io_uring's worker threads; a few are enough for one disk, and
		 * dozens of runnable kernel workers would take the CPUs the loop
		 * and clients need.  Not fatal where the kernel lacks it. */
		unsigned int max[2] = { 2, 2 };

		io_uring_register_iowq_max_workers(&k->ring, max);
	}
	k->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (k->efd < 0 || io_uring_register_eventfd(&k->ring, k->efd) < 0) {
		r = -errno;
		io_uring_queue_exit(&k->ring);
		close(k->dirfd);
		free(k);
		return r ? r : -EIO;
	}
	/* from here on disk_free() undoes what is done */
	*ret = k;
	/* the lowest memory tier spills here */
	store_below_attach(st, &disk_backend, k, store_config(st)->disk_size);
	store_add_listener(st, &k->listener, &disk_events, k);
	/* what a warm start kept in memory is to be copied too (before the
	 * daemon serves: a walk once, at start) */
	store_walk(st, 0, SIZE_MAX, SIZE_MAX, on_published, k);
	/* completions and the worker's results: the loop polls for them,
	 * and the eventfd wakes it when it sleeps */
	r = loop_add_doorbell(store_loop(st), k->efd, &k->bell);
	if (r == 0)
		r = loop_add_poller(store_loop(st), disk_poller, NULL, k, &k->poller);
	if (r == 0)
		r = loop_add_timer(store_loop(st), space_deadline, k, &k->space_timer);
	if (r < 0)
		return r;
	k->rec_mine_tail = &k->rec_mine;
	r = recover(k);
	if (r < 0)
		return r;
	r = worker_new(store_loop(st), "disk", 1, LOOP_HELPER_BATCH, &k->wk);
	if (r < 0)
		return r;
	worker_set_after(k->wk, submit_after, k);
	/* a directory we cannot write to still serves what it holds */
	{
		int fd = openat(k->dirfd, ".kvcache-probe", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);

		if (fd < 0) {
			log_error("disk directory %s is not writable (%m): spilling will fail and be "
				  "counted; serving from memory", k->dir);
			k->c.io_errors++;
		} else {
			close(fd);
			unlinkat(k->dirfd, ".kvcache-probe", 0);
		}
	}
	log_info("disk tier: %s, %llu bytes, compression %s", k->dir,
		 (unsigned long long) store_config(st)->disk_size, k->zstd ? "zstd" : "none");
	return 0;
}

static uint8_t *buf_get(struct disk *k, uint64_t len)
{
	unsigned best = POOL_MAX;

	for (unsigned i = 0; i < k->n_pool; i++)
		if (k->pool[i].cap >= len && (best == POOL_MAX || k->pool[i].cap < k->pool[best].cap))
			best = i;
	if (best != POOL_MAX) {
		uint8_t *b = k->pool[best].buf;

		k->pool[best] = k->pool[--k->n_pool];
		return b;
	}
	return aligned_alloc(DISK_ALIGN, (len + DISK_ALIGN - 1) & ~(uint64_t) (DISK_ALIGN - 1));
}

static void buf_put(struct disk *k, uint8_t *b, uint64_t cap)
{
	if (!b)
		return;
	if (k->n_pool == POOL_MAX) {
		/* keep the bigger ones */
		unsigned small = 0;

		for (unsigned i = 1; i < k->n_pool; i++)
			if (k->pool[i].cap < k->pool[small].cap)
				small = i;
		if (k->pool[small].cap >= cap) {
			free(b);
			return;
		}
		free(k->pool[small].buf);
		k->pool[small] = k->pool[--k->n_pool];
	}
	k->pool[k->n_pool++] = (struct pooled) { b, cap };
}

static void io_free(struct disk *k, struct disk_io *io)
{
	if (io->prev)
		io->prev->next = io->next;
	else
		k->ios = io->next;
	if (io->next)
		io->next->prev = io->prev;
	buf_put(k, io->buf, io->cap);
	free(io);
}

void disk_free(struct disk *k)
{
	if (!k)
		return;
	if (k->rec_wk) { /* still recovering */
		__atomic_store_n(&k->rec_stop, true, __ATOMIC_RELEASE);
		worker_free(k->rec_wk); /* the walk stops at its next record */
		for (int i = 0; i < 2; i++) {
			struct rec_item *it = i ? k->rec_mine : k->rec_ready, *next;

			for (; it; it = next) {
				next = it->next;
				free(it);
			}
		}
		free(k->rec_found);
	}
	/* the worker finishes what it was given; what it built is let be
	 * (io_prepared() with stopping) */
	k->stopping = true;
	worker_free(k->wk);
	k->wk = NULL;
	/* wait for what is in flight: its buffers are ours */
	while (k->inflight) {
		struct io_uring_cqe *cqe;

		if (k->queued)
			disk_submit(k);
		if (io_uring_wait_cqe(&k->ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(&k->ring, cqe);
		k->inflight--;
	}
	k->space_wait = NULL; /* on k->ios too, freed below */
	while (k->ios) {
		if (k->ios->fd >= 0)
			close(k->ios->fd);
		io_free(k, k->ios);
	}
	io_uring_queue_exit(&k->ring);
	loop_source_free(k->bell);
	loop_source_free(k->poller);
	loop_source_free(k->space_timer);
	close(k->efd);
	close(k->dirfd);
	ZSTD_freeCCtx(k->cctx);
	ZSTD_freeDCtx(k->dctx);
	XXH3_freeState(k->hash);
	free(k->scratch);
	for (unsigned i = 0; i < k->n_pool; i++)
		free(k->pool[i].buf);
	store_remove_listener(k->st, &k->listener);
	store_below_detach(k->st);
	free(k);
}

/* ---- writing ---- */

static struct disk_io *io_new(struct disk *k, enum io_kind kind, struct object *o)
{
	struct disk_io *io = calloc(1, sizeof(*io));

	if (!io)
		return NULL;
	io->kind = kind;
	io->o = o;
	io->fd = -1;
	io->next = k->ios;
	if (io->next)
		io->next->prev = io;
	k->ios = io;
	return io;
}

static struct io_uring_sqe *get_sqe(struct disk *k)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&k->ring);

	if (!sqe) {
		disk_submit(k);
		sqe = io_uring_get_sqe(&k->ring);
	}
	return sqe;
}

/*
 * Every request is marked IOSQE_ASYNC: io_uring would otherwise try it in
 * the submitting thread first, and a buffered write or a read that hits the
 * page cache would then run its copy (and the filesystem's work) on the
 * loop: milliseconds for a 16 MiB record.  The io-wq workers do it instead.
 */

/* Worker thread: build the record for io (header, key, payload, padding). */
static void build_record(struct disk *k, struct disk_io *io)
{
	struct disk_record_hdr h = {
		.magic = DISK_RECORD_MAGIC,
		.version = DISK_RECORD_VERSION,
		.value_len = io->vlen,
		.key_len = io->key_len,
		.created_ms = wall_ms(),
	};
	uint64_t off = disk_record_payload_off(io->key_len), stored = io->vlen;
	uint8_t *buf = io->buf;

	if (k->zstd) {
		size_t bound = ZSTD_compressBound(io->vlen);
		size_t z = ZSTD_compressCCtx(k->cctx, buf + off, bound, io->src, io->vlen, k->level);

		/* stored raw when it does not shrink */
		if (!ZSTD_isError(z) && z < io->vlen) {
			stored = z;
			h.flags |= DISK_REC_ZSTD;
		}
		h.value_sum = XXH3_64bits(io->src, io->vlen);
	}
	if (!(h.flags & DISK_REC_ZSTD)) {
		/* copy and hash in one pass over memory: each chunk is hashed
		 * from cache right after it is copied */
		const uint64_t chunk = 256 << 10;

		XXH3_64bits_reset(k->hash);
		for (uint64_t at = 0; at < io->vlen; at += chunk) {
			uint64_t n = io->vlen - at < chunk ? io->vlen - at : chunk;

			memcpy(buf + off + at, io->src + at, n);
			XXH3_64bits_update(k->hash, buf + off + at, n);
		}
		h.value_sum = XXH3_64bits_digest(k->hash);
	}
	h.stored_len = stored;
	h.header_sum = disk_record_header_sum(&h, io->key);
	io->hdr = h; /* the loop keeps value_sum on the object */
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), io->key, io->key_len);
	memset(buf + sizeof(h) + io->key_len, 0, off - sizeof(h) - io->key_len);
	io->len = disk_record_size(io->key_len, stored);
	memset(buf + off + stored, 0, io->len - off - stored);
}

/* The worker: a record built, or one read back checked. */
static void io_run(struct work *w)
{
	struct disk_io *io = (struct disk_io *) w;
	struct disk *k = io->k;

	if (io->kind == IO_WRITE) {
		build_record(k, io);
		/* creating a file can take a while in a big directory: here,
		 * never on the loop thread */
		io->fd = open_record(k, io->name, O_WRONLY | O_CREAT | O_TRUNC);
	} else
		decode_record(k, io);
}

static int disk_spill(struct disk *k, struct object *o)
{
	struct store *st = k->st;
	uint64_t bound;
	struct disk_io *io;
	uint8_t *buf;

	if (o->below_ref || o->below_io || !o->block)
		return -EALREADY;
	if (k->inflight >= MAX_INFLIGHT || k->inflight_bytes + o->len > MAX_INFLIGHT_BYTES)
		return -EAGAIN;
	if (store_now(st) < k->backoff_until)
		return -EAGAIN;
	bound = disk_record_size(o->key_len, k->zstd ? ZSTD_compressBound(o->len) : o->len);
	buf = buf_get(k, bound);
	if (!buf)
		return -ENOMEM;
	io = io_new(k, IO_WRITE, o);
	if (!io) {
		buf_put(k, buf, bound);
		return -ENOMEM;
	}
	io->buf = buf;
	io->cap = bound;
	io->src = store_object_ptr(o);
	io->vlen = o->len;
	memcpy(io->key, o->key, o->key_len);
	io->key_len = o->key_len;
	io->preparing = true;
	io->id = k->next_id++;
	record_name(io->name, sizeof(io->name), io->id, true);
	/* pinned like a view: not moved, not freed while the worker reads it */
	o->below_io = io;
	store_below_hold(st, o);
	dirty_update(k, o); /* off the list while its copy is taken */
	k->inflight++;
	k->inflight_bytes += io->vlen;
	queue_job(k, io);
	return 0;
}

static void queue_job(struct disk *k, struct disk_io *io)
{
	io->k = k;
	io->work = (struct work) { .run = io_run, .done = io_prepared };
	worker_submit(k->wk, &io->work);
}

/* Loop, after a turn's records came back: out together. */
static void submit_after(void *data)
{
	disk_submit(data);
}

/* Loop: a record the worker built goes to the device (disk_submit()
 * sends a turn's together, while the next is being built), or one read
 * back lands. */
static void io_prepared(struct work *w)
{
	struct disk_io *io = (struct disk_io *) w;
	struct disk *k = io->k;
	struct store *st = k->st;
	struct object *o = io->o;
	struct io_uring_sqe *sqe;
	int fd;

	io->preparing = false;
	if (k->stopping) {
		/* its object is freed with everything else at shutdown */
		k->inflight--;
		return;
	}
	if (io->kind == IO_READ) {
		read_finish(k, io, io->res);
		k->inflight--;
		io_free(k, io);
		return;
	}
	if (io->cancelled || store_object_gone(o)) {
		if (io->fd >= 0) {
			close(io->fd);
			io->fd = -1;
			unlinkat(k->dirfd, io->name, 0);
		}
		if (o->below_io == io)
			o->below_io = NULL;
		store_below_unhold(st, o); /* freed if it was its last hold */
		goto drop;
	}
	store_below_unhold(st, o);
	/* spilling picks the oldest objects: back to the old end */
	store_below_changed(st, o, true);
	fd = io->fd; /* opened by the worker */
	io->fd = -1;
	if (fd < 0) {
		k->c.io_errors++;
		k->last_err = -fd;
		if (fd == -ENOSPC)
			k->c.enospc++;
		if (store_now(st) >= k->backoff_until)
			log_warn("Failed to create a record in %s: %s; spilling paused", k->dir,
				 strerror(-fd));
		k->backoff_until = store_now(st) + BACKOFF;
		o->below_io = NULL;
		store_below_changed(st, o, false);
		dirty_update(k, o);
		goto drop;
	}
	io->fd = fd;
	sqe = get_sqe(k);
	if (!sqe) {
		close(fd);
		unlinkat(k->dirfd, io->name, 0);
		o->below_io = NULL;
		store_below_changed(st, o, false);
		dirty_update(k, o);
		goto drop;
	}
	io_uring_prep_write(sqe, fd, io->buf, (unsigned) io->len, 0);
	io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
	io_uring_sqe_set_data(sqe, io);
	k->queued++;
	return;
drop:
	k->inflight--;
	k->inflight_bytes -= io->vlen;
	io_free(k, io);
	store_space_freed(st);
}

static void disk_submit(struct disk *k)
{

	if (k && k->queued) {
		int r = io_uring_submit(&k->ring);

		if (r >= 0)
			k->queued = 0;
	}
}

/* The record is written: rename it into place, through io_uring (a
 * rename in a big directory is no call for the loop to wait on).  True if
 * io lives on. */
static bool write_done(struct disk *k, struct disk_io *io, int res)
{
	struct store *st = k->st;
	struct object *o = io->o;
	struct io_uring_sqe *sqe;

	close(io->fd);
	io->fd = -1;
	k->inflight_bytes -= io->vlen;
	if (res != (int) io->len) {
		/* a short write to a regular file means the filesystem is full */
		int err = res < 0 ? -res : ENOSPC;

		k->c.io_errors++;
		k->last_err = err;
		if (err == ENOSPC)
			k->c.enospc++;
		/* once per backoff period, not once per record */
		if (store_now(st) >= k->backoff_until)
			log_warn("Failed to write a record to %s: %s; objects stay in memory, "
				 "spilling paused for %d ms", k->dir, strerror(err), BACKOFF_MS);
		k->backoff_until = store_now(st) + BACKOFF;
		unlinkat(k->dirfd, io->name, 0);
		if (o) {
			o->below_io = NULL;
			store_below_changed(st, o, false);
			dirty_update(k, o);
		}
		store_space_freed(st); /* whoever waits for a spill looks again */
		return false;
	}
	record_name(io->final, sizeof(io->final), io->id, false);
	sqe = get_sqe(k);
	if (!sqe) {
		unlinkat(k->dirfd, io->name, 0);
		if (o) {
			o->below_io = NULL;
			store_below_changed(st, o, false);
			dirty_update(k, o);
		}
		store_space_freed(st);
		return false;
	}
	io->kind = IO_RENAME;
	io_uring_prep_renameat(sqe, k->dirfd, io->name, k->dirfd, io->final, 0);
	io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
	io_uring_sqe_set_data(sqe, io);
	k->inflight++;
	k->queued++;
	disk_submit(k);
	return true;
}

static void rename_done(struct disk *k, struct disk_io *io, int res)
{
	struct store *st = k->st;
	struct object *o = io->o;

	store_space_freed(st); /* whoever waits for a spill looks again */
	if (res < 0) {
		k->c.io_errors++;
		k->last_err = -res;
		unlinkat(k->dirfd, io->name, 0);
		if (o) {
			o->below_io = NULL;
			store_below_changed(st, o, false);
			dirty_update(k, o);
		}
		return;
	}
	if (!o) {
		/* its object went away meanwhile */
		unlinkat(k->dirfd, io->final, 0);
		return;
	}
	o->below_io = NULL;
	o->below_ref = io->id;
	o->below_len = io->len;
	/* the record's XXH3 of the value is the transfer checksum: a peer
	 * served this object gets it without a hash */
	object_keep_sum(o, io->hdr.value_sum);
	k->c.records++;
	k->c.bytes += io->len;
	store_below_used(st, k->c.bytes);
	k->c.raw_bytes += o->len;
	k->c.writes++;
	k->c.write_bytes += io->len;
}

static void unlink_record(struct disk *k, uint64_t id)
{
	struct io_uring_sqe *sqe = get_sqe(k);
	struct disk_io *io;

	io = sqe ? io_new(k, IO_UNLINK, NULL) : NULL;
	if (!io) {
		char name[32];

		record_name(name, sizeof(name), id, false);
		unlinkat(k->dirfd, name, 0);
		return;
	}
	record_name(io->name, sizeof(io->name), id, false);
	io_uring_prep_unlinkat(sqe, k->dirfd, io->name, 0);
	io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
	io_uring_sqe_set_data(sqe, io);
	k->inflight++;
	k->queued++;
}

static void disk_forget(struct disk *k, struct object *o)
{
	struct store *st = k->st;

	dirty_unlist(k, o);
	if (o->below_io) {
		struct disk_io *io = o->below_io;

		if (io->kind == IO_READ)
			io->o = NULL; /* the read finishes for nobody (core tells the waiters) */
		else if (io->preparing)
			io->cancelled = true; /* a record: unpinned when the worker is done */
		else
			io->o = NULL;
		o->below_io = NULL;
	}
	if (o->below_ref) {
		k->c.records--;
		k->c.bytes -= o->below_len;
		store_below_used(st, k->c.bytes);
		k->c.raw_bytes -= o->len;
		unlink_record(k, o->below_ref);
		o->below_ref = 0;
		o->below_len = 0;
	}
}

/* ---- reading back ---- */

/* The backend's fetch: read o's record back (core keeps one fetch per
 * object, so this runs once per read-back). */
static int disk_load(struct disk *k, struct object *o)
{
	struct store *st = k->st;
	struct io_uring_sqe *sqe;
	struct disk_io *io;
	int fd;

	if (o->below_io)
		return 0;
	if (!o->below_ref)
		return -EIO;
	io = io_new(k, IO_READ, o);
	if (!io)
		return -ENOMEM;
	io->id = o->below_ref;
	io->len = o->below_len;
	io->deadline = store_now(st) + store_config(st)->spill_wait_ms * USEC_PER_MSEC;
	io->buf = buf_get(k, io->len);
	io->cap = io->len;
	record_name(io->name, sizeof(io->name), io->id, false);
	fd = io->buf ? open_record(k, io->name, O_RDONLY) : -ENOMEM;
	sqe = fd >= 0 ? get_sqe(k) : NULL;
	if (!sqe) {
		if (fd >= 0)
			close(fd);
		io_free(k, io);
		k->c.io_errors++;
		return fd < 0 ? fd : -EAGAIN;
	}
	io->fd = fd;
	io_uring_prep_read(sqe, fd, io->buf, (unsigned) io->len, 0);
	io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
	io_uring_sqe_set_data(sqe, io);
	o->below_io = io;
	store_below_changed(st, o, false);
	k->inflight++;
	k->queued++;
	/* reads go out at once: someone is waiting */
	disk_submit(k);
	return 0;
}

/*
 * Worker thread: the value into its dram block, checked.  The check runs on
 * bytes no client can write (the private read buffer, or private scratch
 * for a compressed record) before they are copied out: dram is mapped by
 * every client, and a scribble there must never condemn a good record.
 */
static void decode_record(struct disk *k, struct disk_io *io)
{
	const struct disk_record_hdr *h = &io->hdr;
	const uint8_t *payload = io->buf + disk_record_payload_off(h->key_len);
	const uint64_t chunk = 256 << 10;

	io->res = 0;
	if (h->flags & DISK_REC_ZSTD) {
		size_t n;

		if (k->scratch_cap < h->value_len) {
			free(k->scratch);
			k->scratch = malloc(h->value_len);
			k->scratch_cap = k->scratch ? h->value_len : 0;
			if (!k->scratch) {
				io->res = -ENOMEM;
				return;
			}
		}
		n = ZSTD_decompressDCtx(k->dctx, k->scratch, h->value_len, payload, h->stored_len);
		if (ZSTD_isError(n) || n != h->value_len) {
			io->res = -EBADMSG;
			return;
		}
		payload = k->scratch;
	}
	/* hash each chunk from cache, then copy it out */
	XXH3_64bits_reset(k->hash);
	for (uint64_t at = 0; at < h->value_len; at += chunk) {
		uint64_t n = h->value_len - at < chunk ? h->value_len - at : chunk;

		XXH3_64bits_update(k->hash, payload + at, n);
		memcpy(io->dst + at, payload + at, n);
	}
	if (XXH3_64bits_digest(k->hash) != h->value_sum)
		io->res = -EBADMSG;
}

/* Loop: the read finished (res < 0) or was decoded (res from the worker). */
static void read_finish(struct disk *k, struct disk_io *io, int r)
{
	struct store *st = k->st;
	struct object *o = io->o;

	if (!o) {
		/* went away meanwhile; its waiters were told */
		store_readmit_cancel(st, NULL, io->block);
		return;
	}
	o->below_io = NULL;
	if (r == 0) {
		k->c.reads++;
		k->c.read_bytes += io->len;
		store_readmit(st, o, io->block, io->hdr.value_sum); /* checked as it came */
	} else {
		store_readmit_cancel(st, o, io->block);
		if (r == -EBADMSG) {
			k->c.checksum_failures++;
			log_error("record %s/%s of '%s' is damaged; dropped, never served", k->dir,
				  io->name, o->key);
		} else if (r != -ENOSPC) {
			k->c.io_errors++;
			log_warn_errno(r, "Failed to read %s/%s", k->dir, io->name);
		}
	}
	io->block = NULL;
	fetch_done(st, o, r); /* the waiters run their requests, or fail them */
	if (r == -EBADMSG)
		store_drop(st, o); /* unlinks the record too */
}

/* Loop: find dram for a read that is in, and hand it to the worker.  True
 * if io lives on with the worker.  Dram full of objects that have not
 * reached disk yet: io waits on k->space_wait for a spill to end. */
static bool land(struct disk *k, struct disk_io *io)
{
	struct store *st = k->st;
	int r = store_readmit_place(st, io->o, &io->block, &io->dst);

	if (r == -EAGAIN && store_now(st) < io->deadline) {
		io->qnext = k->space_wait;
		k->space_wait = io;
		loop_timer_arm_by(k->space_timer, store_now(st) + 20 * USEC_PER_MSEC);
		return true;
	}
	if (r < 0) {
		read_finish(k, io, r);
		return false;
	}
	io->preparing = true;
	k->inflight++; /* the worker's until it posts back */
	queue_job(k, io);
	return true;
}

/* Reads waiting for dram: try again after a spill ended, or give up. */
static bool retry_landing(struct disk *k)
{
	struct store *st = k->st;
	struct disk_io *list = k->space_wait;
	bool did = false;

	if (!list || (!k->space_freed && store_now(st) < k->space_check))
		return false;
	k->space_freed = false;
	k->space_check = store_now(st) + 100 * USEC_PER_MSEC;
	k->space_wait = NULL;
	while (list) {
		struct disk_io *io = list;

		list = io->qnext;
		did = true;
		if (!io->o) {
			io_free(k, io); /* its object went away; waiters were told */
			continue;
		}
		if (!land(k, io))
			io_free(k, io);
	}
	return did;
}

/* Loop: the bytes are in; check the header here (cheap), leave the copy,
 * decompression and checksum to the worker.  True if io lives on. */
static bool read_done(struct disk *k, struct disk_io *io, int res)
{
	struct object *o = io->o;

	close(io->fd);
	io->fd = -1;
	if (!o)
		return false;
	if (res < 0) {
		read_finish(k, io, res);
		return false;
	}
	if (disk_record_check(io->buf, (size_t) res, (uint64_t) res, &io->hdr) < 0 ||
	    io->hdr.key_len != o->key_len ||
	    memcmp(io->buf + sizeof(io->hdr), o->key, o->key_len) != 0 ||
	    io->hdr.value_len != o->len) {
		read_finish(k, io, -EBADMSG);
		return false;
	}
	return land(k, io);
}

static bool disk_poll(struct disk *k)
{
	struct io_uring_cqe *cqe;
	unsigned n = 0;

	if (k->recovering && recover_poll(k))
		n++;
	if (!io_uring_cq_ready(&k->ring))
		return n > 0;
	while (io_uring_peek_cqe(&k->ring, &cqe) == 0) {
		struct disk_io *io = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&k->ring, cqe);
		k->inflight--;
		n++;
		if (io->kind == IO_WRITE) {
			if (write_done(k, io, res))
				continue; /* renaming */
		} else if (io->kind == IO_RENAME)
			rename_done(k, io, res);
		else if (io->kind == IO_READ && read_done(k, io, res))
			continue; /* the worker's, or waiting for dram */
		io_free(k, io);
	}
	return n > 0;
}

/* ---- background work ---- */

/* Drop disk-only objects, least recently used first, to get under low: a
 * bounded number per call. */
static bool disk_watermark(struct disk *k)
{
	return store_below_trim(k->st, k->c.bytes);
}

static bool disk_accepting(const struct disk *k, const struct object *o)
{
	const struct store *st = k->st;

	return store_now(st) >= k->backoff_until &&
	       k->c.bytes + o->len + DISK_ALIGN <= store_below_size(st);
}

static bool disk_maintain(struct disk *k)
{
	struct store *st = k->st;
	bool did = false;

	did = disk_watermark(k);
	did = retry_landing(k) || did;
	/* Spill ahead: clean copies of the oldest objects without one, once
	 * dram is past its low watermark less a margin, or all of them on a
	 * flush.  The tail of k->dirty is the next of those: no walk. */
	if (store_now(st) >= k->backoff_until && store_below_has_room(st, k->c.bytes) &&
	    (k->flushing || store_spill_due(st))) {
		struct object *o;

		while ((o = k->dirty.tail)) {
			int r = disk_spill(k, o); /* takes o off the dirty list */

			if (r < 0)
				break;
			did = true;
		}
	}
	if (k->flushing && k->inflight == 0 && !did) {
		bool left = k->dirty.n > 0;

		if (!left || store_now(st) < k->backoff_until) {
			k->flushing = false;
			k->c.flush_unwritten = k->dirty.n;
			k->c.flush_error = left ? (uint64_t) (k->last_err ? k->last_err : EIO) : 0;
			if (left)
				log_warn("flush failed: %llu objects could not be written to %s: %s",
					 (unsigned long long) k->c.flush_unwritten, k->dir,
					 strerror((int) k->c.flush_error));
			else
				log_info("flush done: %llu records on disk",
					 (unsigned long long) k->c.records);
		}
	}
	if (k->space_wait)
		loop_timer_arm_by(k->space_timer, store_now(st) + 20 * USEC_PER_MSEC);
	disk_submit(k);
	return did;
}

static void disk_flush_start(struct disk *k)
{
	k->flushing = true;
	k->c.flush_unwritten = k->c.flush_error = 0;
	/* a flush asked for now tries now, even right after a failure */
	k->backoff_until = 0;
	k->last_err = 0;
}

static void disk_counters(const struct disk *k, struct disk_counters *ret)
{
	*ret = k->c;
	ret->pending = k->inflight;
	ret->flush_pending = k->flushing;
	ret->recovering = k->recovering;
	ret->recovery_total = k->rec_n;
	ret->direct = __atomic_load_n(&k->direct, __ATOMIC_RELAXED);
	ret->compress = k->zstd;
}

/* ---- the disk tier as the backend below memory ---- */

static int be_fetch(void *be, struct object *o)
{
	return disk_load(be, o);
}

static int be_spill(void *be, struct object *o)
{
	return disk_spill(be, o);
}

static void be_forget(void *be, struct object *o)
{
	disk_forget(be, o);
}

static bool be_accepting(void *be, const struct object *o)
{
	return disk_accepting(be, o);
}

static bool be_maintain(void *be)
{
	return disk_maintain(be);
}

static void be_stats(void *be, void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	struct disk_counters dc;

	disk_counters(be, &dc);
	emit(u, "disk.records", dc.records);
	emit(u, "disk.bytes", dc.bytes);
	emit(u, "disk.raw_bytes", dc.raw_bytes);
	emit(u, "disk.writes", dc.writes);
	emit(u, "disk.write_bytes", dc.write_bytes);
	emit(u, "disk.reads", dc.reads);
	emit(u, "disk.read_bytes", dc.read_bytes);
	emit(u, "disk.checksum_failures", dc.checksum_failures);
	emit(u, "disk.io_errors", dc.io_errors);
	emit(u, "disk.enospc", dc.enospc);
	emit(u, "disk.recovered", dc.recovered);
	emit(u, "disk.skipped", dc.skipped);
	emit(u, "disk.pending", dc.pending);
	emit(u, "disk.flush_pending", dc.flush_pending);
	emit(u, "disk.flush_unwritten", dc.flush_unwritten);
	emit(u, "disk.flush_error", dc.flush_error);
	emit(u, "disk.recovering", dc.recovering);
	emit(u, "disk.recovery_total", dc.recovery_total);
	emit(u, "disk.direct_io", dc.direct);
	emit(u, "disk.compression", dc.compress);
	/* stored / raw, in per mille: 1000 = no gain */
	emit(u, "disk.compression_permille", dc.raw_bytes ? dc.bytes * 1000 / dc.raw_bytes : 1000);
}

static int be_flush(void *be)
{
	disk_flush_start(be);
	return 0;
}

static const struct below_ops disk_backend = {
	.version = BELOW_OPS_VERSION,
	.name = "disk",
	.stats = be_stats,
	.flush = be_flush,
	.fetch = be_fetch,
	.spill = be_spill,
	.forget = be_forget,
	.accepting = be_accepting,
	.maintain = be_maintain,
};
