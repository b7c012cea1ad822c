/* SPDX-License-Identifier: MIT */
/* Maps and unmaps done off the loop (mapper.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loop.h"
#include "mapper.h"
#include "worker.h"

/* Unmapped per munmap() call: 0.1-0.3 ms of page-table work for 4 KiB
 * pages, a multiple of the 2 MiB hugepage; between steps the thread
 * pauses (loop_mm_pause()). */
#define UNMAP_STEP (UINT64_C(2) << 20)

struct map_req {
	struct work work;
	void (*fn)(void *arg); /* or an unmap: */
	void *arg;
	void *base;
	size_t len;
	int fd;
};

struct mapper {
	struct worker *wk; /* one thread: requests run in the order given */
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

static void req_run(struct work *w)
{
	struct map_req *q = (struct map_req *) w;

	if (q->fn)
		q->fn(q->arg);
	else
		unmap_now(q->base, q->len, q->fd);
	free(q);
}

int mapper_start(struct loop *loop, struct mapper **ret)
{
	struct mapper *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	r = worker_new(loop, "map", 1, LOOP_HELPER_BATCH, &m->wk);
	if (r < 0) {
		free(m);
		return r;
	}
	*ret = m;
	return 0;
}

void mapper_stop(struct mapper *m)
{
	if (!m)
		return;
	worker_free(m->wk);
	free(m);
}

static int queue(struct mapper *m, const struct map_req *req)
{
	struct map_req *q = m ? malloc(sizeof(*q)) : NULL;

	if (!q)
		return m ? -ENOMEM : -ENODEV;
	*q = *req;
	q->work = (struct work) { .run = req_run };
	return worker_submit(m->wk, &q->work);
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

int mapper_submit(struct mapper *m, struct work *w)
{
	return m ? worker_submit(m->wk, w) : -ENODEV;
}

size_t mapper_pending(struct mapper *m)
{
	return m ? worker_pending(m->wk) : 0;
}
