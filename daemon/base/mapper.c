/* SPDX-License-Identifier: MIT */
/* Maps and unmaps done off the loop (mapper.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "handoff.h"
#include "loop.h"
#include "mapper.h"

/* Unmapped per munmap() call: 0.1-0.3 ms of page-table work for 4 KiB
 * pages, a multiple of the 2 MiB hugepage; between steps the thread
 * pauses (loop_mm_pause()). */
#define UNMAP_STEP (UINT64_C(2) << 20)

struct map_req {
	struct map_req *next;
	void (*fn)(void *arg); /* or an unmap: */
	void *arg;
	void *base;
	size_t len;
	int fd;
};

struct mapper {
	pthread_t th;
	bool stop;               /* atomic */
	size_t pending;          /* atomic */
	struct map_req *queue;   /* handoff.h stack */
	struct handoff_bell wake;
};

static void unmap_now(void *base, size_t len, int fd)
{
	uint8_t *p = base;
	size_t off = 0;

	while (p && off < len) {
		size_t n = len - off < UNMAP_STEP ? len - off : UNMAP_STEP;

		if (munmap(p + off, n) < 0) {
			/* not a multiple of this mapping's page: all of it */
			munmap(p + off, len - off);
			break;
		}
		off += n;
		if (off < len)
			loop_mm_pause();
	}
	if (fd >= 0)
		close(fd);
}

static void *mapper_main(void *arg)
{
	struct mapper *m = arg;
	struct map_req *l;

	loop_helper_thread("map", true);
	while ((l = handoff_wait_fifo(&m->queue, next, &m->wake, &m->stop))) {
		while (l) {
			struct map_req *q = l;

			l = q->next;
			if (q->fn)
				q->fn(q->arg);
			else
				unmap_now(q->base, q->len, q->fd);
			free(q);
			__atomic_sub_fetch(&m->pending, 1, __ATOMIC_RELEASE);
		}
	}
	return NULL;
}

int mapper_start(struct mapper **ret)
{
	struct mapper *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	r = pthread_create(&m->th, NULL, mapper_main, m);
	if (r) {
		free(m);
		return -r;
	}
	*ret = m;
	return 0;
}

void mapper_stop(struct mapper *m)
{
	if (!m)
		return;
	__atomic_store_n(&m->stop, true, __ATOMIC_RELEASE);
	handoff_bell_ring(&m->wake);
	pthread_join(m->th, NULL);
	free(m);
}

static int queue(struct mapper *m, const struct map_req *req)
{
	struct map_req *q = m ? malloc(sizeof(*q)) : NULL;

	if (!q)
		return m ? -ENOMEM : -ENODEV;
	*q = *req;
	__atomic_add_fetch(&m->pending, 1, __ATOMIC_RELAXED);
	if (handoff_push(&m->queue, q, next))
		handoff_bell_ring(&m->wake);
	return 0;
}

void unmap_later(struct mapper *m, void *base, size_t len, int fd)
{
	if (queue(m, &(struct map_req) { .base = base, .len = len, .fd = fd }) < 0)
		unmap_now(base, len, fd);
}

int mapper_call(struct mapper *m, void (*fn)(void *arg), void *arg)
{
	return queue(m, &(struct map_req) { .fn = fn, .arg = arg, .fd = -1 });
}

size_t mapper_pending(struct mapper *m)
{
	return m ? __atomic_load_n(&m->pending, __ATOMIC_ACQUIRE) : 0;
}
