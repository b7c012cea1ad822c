/* SPDX-License-Identifier: MIT */
/* Registered buffers (buffer.c): memory both a client and the daemon map. */
#pragma once

#include "session.h"

struct buffer {
	struct shm_segment seg;
	uint64_t size;
	uint32_t copies;  /* copier jobs using it (and its warming): unmapped after the last */
	bool released;    /* given back while copies were in flight */
	bool warm_stop;   /* atomic: given back, its warming may stop */
};
int buffer_create(struct session *s, uint64_t size, uint64_t *ret_handle, int *ret_fd, char *msg);
/* What answers a buffer made on the mapper (r 0) or not, on the loop. */
typedef void (*buffer_made_fn)(struct session *s, uint32_t seq, int r, uint64_t handle, int fd,
			       uint64_t size);
/* The same with the mapping made on the mapper: -EINPROGRESS, and made()
 * answers (0 with *ret_*: made here at once). */
int buffer_create_start(struct session *s, uint32_t seq, uint64_t size, buffer_made_fn made,
			uint64_t *ret_handle, int *ret_fd, char *msg);
void buffer_forget(struct session *s);
int buffer_init(struct server *sv);
void buffer_done(struct server *sv);
/* Bytes of registered buffers faulted in so far (--prefault). */
uint64_t buffer_warmed_bytes(struct server *sv);
void buffer_free(struct session *s, struct buffer *b);
void buffer_unmap(struct server *sv, struct buffer *b);
/* The bytes [off, off + len) of the registered buffer `id`, or NULL; the
 * buffer in *ret_b when ret_b is not NULL. */
void *buffer_span(struct session *s, uint64_t id, uint64_t off, uint64_t len,
		  struct buffer **ret_b);
