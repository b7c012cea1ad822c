/* SPDX-License-Identifier: MIT */
/*
 * Registered buffers: memory a client asked for and both sides map, so the
 * daemon can copy objects into it (get_into) and out of it (put_from) while
 * the client's thread does something else.  The daemon creates them, so it
 * never maps a file whose seals or size a client chose.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "session.h"

/* Per client; the pages are only touched when used. */
#define BUFFER_MAX_TOTAL (UINT64_C(64) << 30)

int buffer_create(struct session *s, uint64_t size, uint64_t *ret_handle, int *ret_fd, char *msg)
{
	struct buffer *b;
	uint64_t total, h, limit;
	int fd, r;
	void *base;

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
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	/* 2 MiB pages when the buffer is big and the kernel has them */
	r = -EINVAL;
	if (s->sv->cfg->hugepages != SHM_HUGEPAGES_OFF && total % SHM_HUGEPAGE_SIZE == 0)
		r = shm_memfd_new("kvcache-buffer", total, true, &fd, &base);
	if (r < 0)
		r = shm_memfd_new("kvcache-buffer", total, false, &fd, &base);
	if (r < 0) {
		free(b);
		return r;
	}
	b->seg = (struct shm_segment) { .fd = fd, .base = base, .size = total };
	b->size = size;
	r = holder_alloc(&s->h, SLOT_BUFFER, b, &h);
	if (r < 0) {
		shm_segment_done(&b->seg);
		free(b);
		return r;
	}
	s->buffer_bytes += size;
	s->sv->registered_bytes += total;
	*ret_handle = h;
	*ret_fd = fd; /* stays open until the buffer is freed */
	return 0;
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
