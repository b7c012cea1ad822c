/* SPDX-License-Identifier: MIT */
/*
 * shmem: the libc-only base of kvcache.  Sealed memfd segments, the offset
 * allocator, and the small parsers shared by the daemon and the library.
 * Nothing here logs: every function returns 0 / a count, or -errno.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm-layout.h"

/* ---- segments ---- */

enum shm_hugepages {
	SHM_HUGEPAGES_AUTO,
	SHM_HUGEPAGES_ON,
	SHM_HUGEPAGES_OFF,
};

struct shm_segment {
	int fd;
	void *base;
	uint64_t size;
	bool hugepages;
	int hugepage_error; /* why 2 MiB pages were not used (auto), 0 if they were */
};

#define SHM_SEGMENT_INIT { .fd = -1 }

/* Create, size, seal and map a segment of at least `size` data bytes behind
 * its header.  In auto mode a failure to get 2 MiB pages falls back to 4 KiB
 * pages and records the reason in seg->hugepage_error. */
int shm_segment_create(struct shm_segment *seg, const char *name, uint64_t size,
		       enum shm_hugepages hp, uint32_t tier, uint32_t index,
		       uint64_t generation);

/* Client side: check that fd is a sealed memfd of exactly `size` bytes with a
 * valid header, then map it.  Takes ownership of fd (closed on return, the
 * mapping keeps the memory). */
int shm_segment_map(struct shm_segment *seg, int fd, uint64_t size);

void shm_segment_done(struct shm_segment *seg);
/* Daemon side of a warm start: a sealed memfd a previous run left (fd;
 * closed on failure), of at least min_size bytes, mapped read-write.  0, or
 * -errno with *why saying what is wrong. */
int shm_memfd_adopt(int fd, uint64_t min_size, void **ret_base, uint64_t *ret_size,
		    const char **why);
/* Daemon side of a warm start: the segment a previous run made for the
 * same tier, index and size (fd: taken), mapped and now this run's
 * (generation).  -EBADMSG with *why saying what did not match. */
int shm_segment_adopt(struct shm_segment *seg, int fd, uint64_t size, uint32_t tier,
		      uint32_t index, uint64_t generation, const char **why);

static inline const struct shm_seg_header *shm_segment_header(const struct shm_segment *seg)
{
	return seg->base;
}

/* A sealed, mapped memfd of exactly `size` bytes with no header: the
 * building block of segments, channels and registered buffers. */
int shm_memfd_new(const char *name, uint64_t size, bool huge, int *ret_fd, void **ret_base);
/* Client side of shm_memfd_new(): check seals and size, map.  Takes fd. */
int shm_memfd_map(int fd, uint64_t size, void **ret_base);

/* The seals every segment carries. */
int shm_segment_check_seals(int fd);

/* ---- offset allocator ---- */

/* TLSF (two-level segregated fit) over an offset range.  Block descriptors
 * live in the caller's private memory; the managed range holds no metadata,
 * so nothing a client writes into it can corrupt the allocator. */

#define SHM_ALLOC_ALIGN 64u
#define SHM_ALLOC_SL_LOG2 4
#define SHM_ALLOC_SL_COUNT (1u << SHM_ALLOC_SL_LOG2)
#define SHM_ALLOC_FL_SHIFT (SHM_ALLOC_SL_LOG2 + 6) /* log2(ALIGN) == 6 */
#define SHM_ALLOC_FL_COUNT (64 - SHM_ALLOC_FL_SHIFT + 1)

struct shm_block {
	uint64_t offset;
	uint64_t size;
	struct shm_block *prev_phys, *next_phys; /* address-order neighbours */
	struct shm_block *prev_free, *next_free; /* free-list links */
	bool free;
};

struct shm_alloc {
	uint64_t base, size;
	uint64_t used;        /* bytes in allocated blocks */
	uint64_t n_used;      /* allocated blocks */
	uint64_t fl_bitmap;
	uint32_t sl_bitmap[SHM_ALLOC_FL_COUNT];
	struct shm_block *heads[SHM_ALLOC_FL_COUNT][SHM_ALLOC_SL_COUNT];
	struct shm_block *first;  /* lowest offset */
	struct shm_block *spare;  /* recycled descriptors, linked by next_free */
};

int shm_alloc_init(struct shm_alloc *a, uint64_t base, uint64_t size);
void shm_alloc_done(struct shm_alloc *a);
/* -EINVAL for 0, -E2BIG when larger than the whole range, -ENOSPC when no
 * free block is big enough. */
int shm_alloc_block(struct shm_alloc *a, uint64_t size, struct shm_block **ret);
void shm_alloc_free(struct shm_alloc *a, struct shm_block *b);
/* Take the block at [offset, offset + size) (size rounded as above): a
 * warm start adopting what a previous run left there.  *cursor (NULL to
 * start) makes takes in ascending order cost O(1) each.  -EINVAL
 * (misaligned), -ERANGE (outside the range), -EBUSY (not wholly free). */
int shm_alloc_take(struct shm_alloc *a, uint64_t offset, uint64_t size,
		   struct shm_block **cursor, struct shm_block **ret);
/* The largest block shm_alloc_block() could hand out right now. */
uint64_t shm_alloc_largest_free(const struct shm_alloc *a);
/* Walk every invariant; 0 or -EUCLEAN.  For tests. */
int shm_alloc_check(const struct shm_alloc *a);

/* ---- parsers ---- */

/* "4096", "512MB", "1GB", "1GiB", "1.5 GB", "30000000000": K/M/G/T with an
 * optional B or iB are powers of 1024, as Mooncake's configs mean them.
 * -EINVAL for syntax, -ERANGE for overflow. */
int shm_parse_size(const char *s, uint64_t *ret);

/* The control socket path: override, else $KVCACHE_SOCKET, else
 * $XDG_RUNTIME_DIR/kvcached.sock, else /tmp/kvcached-<uid>.sock.
 * -ENAMETOOLONG when it does not fit a sockaddr_un. */
int shm_socket_path(const char *override, char *buf, size_t len);
