/* SPDX-License-Identifier: MIT */
/*
 * Registered buffers: memory a client asked for and both sides map, so the
 * daemon can copy objects into it (get_into) and out of it (put_from) while
 * the client's thread does something else.  The daemon creates them, so it
 * never maps a file whose seals or size a client chose.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loop.h"
#include "buffer.h"

/* Per client; the pages are only touched when used. */
#define BUFFER_MAX_TOTAL (UINT64_C(64) << 30)

/* The limits, per client and daemon-wide; *ret_total: the bytes mapped. */
static int buffer_admit(struct session *s, uint64_t size, uint64_t *ret_total, char *msg)
{
	uint64_t total, limit;

	if (size == 0 || size > BUFFER_MAX_TOTAL - s->buffer_bytes) {
		snprintf(msg, STORE_MSG_MAX, "registered buffers are limited to %llu bytes per client",
			 (unsigned long long) BUFFER_MAX_TOTAL);
		return size == 0 ? -EINVAL : -E2BIG;
	}
	total = (size + 4095) & ~UINT64_C(4095);
	/* main() resolves 0 to half of RAM; 0 left here means no limit */
	limit = s->sv->cfg->max_registered ? s->sv->cfg->max_registered : UINT64_MAX;
	if (s->sv->registered_bytes > limit || total > limit - s->sv->registered_bytes) {
		snprintf(msg, STORE_MSG_MAX, "registered buffers of all clients would exceed "
			 "--max-registered-bytes (%llu bytes; %llu in use)",
			 (unsigned long long) limit,
			 (unsigned long long) s->sv->registered_bytes);
		s->sv->stats.refused_buffers++;
		return -ENOSPC;
	}
	*ret_total = total;
	return 0;
}

/* A sealed memfd, mapped: 2 MiB pages when the buffer is big and the
 * kernel has them. */
static int buffer_map(const struct config *cfg, uint64_t total, int *ret_fd, void **ret_base)
{
	int r = -EINVAL;

	if (cfg->hugepages != SHM_HUGEPAGES_OFF && total % SHM_HUGEPAGE_SIZE == 0)
		r = shm_memfd_new("kvcache-buffer", total, true, ret_fd, ret_base);
	if (r < 0)
		r = shm_memfd_new("kvcache-buffer", total, false, ret_fd, ret_base);
	return r;
}

static void buffer_warm(struct server *sv, struct buffer *b);

/* The mapping becomes one of the client's buffers (counted already by
 * the caller); on failure it is given back. */
static int buffer_adopt(struct session *s, uint64_t size, uint64_t total, int fd, void *base,
			uint64_t *ret_handle)
{
	struct buffer *b = calloc(1, sizeof(*b));
	int r = -ENOMEM;

	if (b) {
		b->seg = (struct shm_segment) { .fd = fd, .base = base, .size = total };
		b->size = size;
		r = holder_alloc(&s->h, SLOT_BUFFER, b, ret_handle);
	}
	if (r < 0) {
		unmap_later(s->sv->mapper, base, total, fd);
		free(b);
	} else {
		buffer_warm(s->sv, b);
	}
	return r;
}

int buffer_create(struct session *s, uint64_t size, uint64_t *ret_handle, int *ret_fd, char *msg)
{
	uint64_t total;
	void *base;
	int fd, r;

	r = buffer_admit(s, size, &total, msg);
	if (r == 0)
		r = buffer_map(s->sv->cfg, total, &fd, &base);
	if (r == 0)
		r = buffer_adopt(s, size, total, fd, base, ret_handle);
	if (r < 0)
		return r;
	s->buffer_bytes += size;
	s->sv->registered_bytes += total;
	*ret_fd = fd; /* stays open until the buffer is freed */
	return 0;
}

/*
 * A buffer mapped on the mapper thread (mapper.h: an mmap() on the loop
 * waits for page faults anywhere in the daemon).  The request is counted
 * against the limits when made; the session reads nothing more until it
 * is answered (the job's made()).  A client that goes away meanwhile
 * leaves the job to end unanswered; its mapping is then given back.
 */
struct buffer_job {
	struct work work;    /* on the mapper, then back on the loop */
	struct buffer *warm; /* a buffer's warming, ended (not a mapping) */
	struct server *sv;
	struct session *s; /* NULL once its client went away */
	buffer_made_fn made;
	uint32_t seq;
	uint64_t size, total;
	int fd, r;
	void *base;
};

struct buffer_maker {
	unsigned warming;        /* atomic: warm threads running */
	uint64_t warmed;         /* atomic: bytes of buffers faulted in */
};

/*
 * Warming a buffer.  Whatever the daemon copies into a new buffer first
 * pays for each page of its mapping (the kernel clearing it, and mapping
 * it in the daemon): a fresh engine's first batch_get_into of 768 MiB ran
 * at 0.3-0.9 GB/s against 8-12.7 GB/s the second time.  A thread at low
 * priority writes each page once (an atomic add of 0: no byte changes,
 * even under a concurrent copy) as soon as the buffer is made, with
 * --prefault (on by default).  It counts as a copy using the buffer, so a
 * buffer given back meanwhile stays mapped until it has stopped.
 */
static void warm_ended(void *data);

static void *warm_main(void *arg)
{
	struct buffer_job *j = arg;
	struct buffer_maker *m = j->sv->maker;
	struct buffer *b = j->warm;
	uint8_t *base = b->seg.base;
	uint64_t off, counted = 0;

	loop_helper_thread("warm", LOOP_HELPER_LOW);
	for (off = 0; off < b->seg.size; off += 4096) {
		if ((off & ((8u << 20) - 1)) == 0) {
			if (__atomic_load_n(&b->warm_stop, __ATOMIC_RELAXED))
				break;
			if (off) {
				__atomic_fetch_add(&m->warmed, off - counted, __ATOMIC_RELAXED);
				counted = off;
				loop_mm_pause();
			}
		}
		__atomic_fetch_add(base + off, 0, __ATOMIC_RELAXED);
	}
	__atomic_fetch_add(&m->warmed, off - counted, __ATOMIC_RELAXED); /* touched since */
	if (loop_post(j->sv->loop, warm_ended, j) < 0)
		free(j); /* the buffer stays counted as in use: only never unmapped */
	__atomic_fetch_sub(&m->warming, 1, __ATOMIC_RELEASE); /* last: teardown waits */
	return NULL;
}

uint64_t buffer_warmed_bytes(struct server *sv)
{
	return sv->maker ? __atomic_load_n(&sv->maker->warmed, __ATOMIC_RELAXED) : 0;
}

static void buffer_warm(struct server *sv, struct buffer *b)
{
	struct buffer_maker *m = sv->maker;
	struct buffer_job *j;
	pthread_attr_t a;
	pthread_t th;

	if (!m || sv->cfg->prefault == SHM_HUGEPAGES_OFF)
		return;
	j = calloc(1, sizeof(*j));
	if (!j)
		return; /* only slower */
	j->sv = sv;
	j->warm = b;
	b->copies++;
	__atomic_fetch_add(&m->warming, 1, __ATOMIC_RELAXED);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &a, warm_main, j) != 0) {
		__atomic_fetch_sub(&m->warming, 1, __ATOMIC_RELAXED);
		b->copies--;
		free(j);
	}
	pthread_attr_destroy(&a);
}

static void buffer_job_done(struct work *w);

/* Mapper thread. */
static void buffer_job_run(struct work *w)
{
	struct buffer_job *j = (struct buffer_job *) w;

	j->r = buffer_map(j->sv->cfg, j->total, &j->fd, &j->base);
}

int buffer_create_start(struct session *s, uint32_t seq, uint64_t size, buffer_made_fn made,
			uint64_t *ret_handle, int *ret_fd, char *msg)
{
	struct server *sv = s->sv;
	struct buffer_job *j;
	uint64_t total;
	int r = buffer_admit(s, size, &total, msg);

	if (r < 0)
		return r;
	j = sv->maker ? calloc(1, sizeof(*j)) : NULL;
	if (j) {
		*j = (struct buffer_job) { .sv = sv, .s = s, .made = made, .seq = seq,
					   .size = size, .total = total, .fd = -1 };
		j->work = (struct work) { .run = buffer_job_run, .done = buffer_job_done };
		s->buffer_bytes += size;
		sv->registered_bytes += total;
		if (mapper_submit(sv->mapper, &j->work) == 0) {
			s->buffer_job = j;
			return -EINPROGRESS;
		}
		s->buffer_bytes -= size;
		sv->registered_bytes -= total;
		free(j);
	}
	return buffer_create(s, size, ret_handle, ret_fd, msg); /* no mapper: here */
}

/* Loop: a session going away leaves its job to end unanswered. */
void buffer_forget(struct session *s)
{
	if (s->buffer_job)
		s->buffer_job->s = NULL;
	s->buffer_job = NULL;
}

/* Loop: a mapping made (or not), or a buffer's warming ended. */
static void buffer_job_done(struct work *w)
{
	struct buffer_job *j = (struct buffer_job *) w;
	struct server *sv = j->sv;
	struct session *s = j->s;
	uint64_t handle = 0;
	int r = j->r;

	if (j->warm) { /* its warming ended: a copy of it no longer */
		struct buffer *b = j->warm;

		if (--b->copies == 0 && b->released)
			buffer_unmap(sv, b);
		free(j);
		return;
	}
	if (s) {
		s->buffer_job = NULL;
		if (r == 0)
			r = buffer_adopt(s, j->size, j->total, j->fd, j->base, &handle);
		if (r < 0) {
			s->buffer_bytes -= j->size;
			sv->registered_bytes -= j->total;
		}
		j->made(s, j->seq, r, handle, j->fd, j->size);
	} else {
		if (r == 0)
			unmap_later(sv->mapper, j->base, j->total, j->fd);
		sv->registered_bytes -= j->total;
	}
	free(j);
}

static void warm_ended(void *data)
{
	buffer_job_done(data);
}

int buffer_init(struct server *sv)
{
	struct buffer_maker *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	sv->maker = m;
	return 0;
}

/* After the mapper stopped: jobs it ended are let go. */
void buffer_done(struct server *sv)
{
	struct buffer_maker *m = sv->maker;

	if (!m)
		return;
	/* warm threads stop soon (their buffers were given back); what they
	 * posted runs now (the loop turns no more) */
	while (__atomic_load_n(&m->warming, __ATOMIC_ACQUIRE))
		usleep(1000);
	loop_run_posted(sv->loop);
	free(m);
	sv->maker = NULL;
}

void buffer_unmap(struct server *sv, struct buffer *b)
{
	unmap_later(sv->mapper, b->seg.base, b->seg.size, b->seg.fd);
	free(b);
}

/* Given back (by the client, or as it goes): a copy still using it keeps
 * it mapped until the copy ends. */
void buffer_free(struct session *s, struct buffer *b)
{
	s->buffer_bytes -= b->size;
	s->sv->registered_bytes -= b->seg.size;
	__atomic_store_n(&b->warm_stop, true, __ATOMIC_RELAXED);
	if (b->copies)
		b->released = true;
	else
		buffer_unmap(s->sv, b);
}

void *buffer_span(struct session *s, uint64_t id, uint64_t off, uint64_t len,
		  struct buffer **ret_b)
{
	struct buffer *b;
	struct slot *sl;
	uint32_t i;

	sl = holder_get(&s->h, id, SLOT_BUFFER, &i);
	if (!sl)
		return NULL;
	b = sl->buf;
	if (off > b->size || len > b->size - off)
		return NULL;
	if (ret_b)
		*ret_b = b;
	return (uint8_t *) b->seg.base + off;
}
