/* SPDX-License-Identifier: MIT */
/*
 * Every structure that lives in shared memory.  Only fixed-width types, no
 * pointers: a segment is mapped at different addresses in every process, and
 * whatever a client writes here is untrusted input for the daemon.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define SHM_SEG_MAGIC UINT64_C(0x3147455343564b00) /* "\0KVCSEG1" */
#define SHM_LAYOUT_VERSION 1u
#define SHM_HEADER_SIZE 4096u /* data starts on the next 4 KiB page */
#define SHM_HUGEPAGE_SIZE (2u << 20)

enum shm_tier {
	SHM_TIER_DEVICE = 1,
	SHM_TIER_DRAM = 2,
	SHM_TIER_DISK = 3,
};

enum shm_seg_flags {
	SHM_SEG_HUGEPAGES = 1u << 0,
};

/* At offset 0 of every segment, written once by the daemon before the fd is
 * handed out.  Clients check magic, layout_version and size before use. */
struct shm_seg_header {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t header_size;  /* == SHM_HEADER_SIZE */
	uint64_t generation;   /* changes whenever the daemon restarts */
	uint64_t size;         /* bytes in the memfd */
	uint64_t data_offset;  /* first byte handed to the allocator */
	uint32_t tier;         /* enum shm_tier */
	uint32_t flags;        /* enum shm_seg_flags */
	uint32_t index;        /* the daemon's segment number */
	uint32_t daemon_pid;
	uint8_t reserved[72];
};
_Static_assert(sizeof(struct shm_seg_header) == 128, "segment header size");
_Static_assert(offsetof(struct shm_seg_header, generation) == 16, "header layout");
_Static_assert(offsetof(struct shm_seg_header, tier) == 40, "header layout");
