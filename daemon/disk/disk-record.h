/* SPDX-License-Identifier: MIT */
/*
 * On-disk record format, version 1.  One record per file, <id>.kvr in the
 * disk directory, written as <id>.tmp and renamed once complete, so a crash
 * mid-write leaves only .tmp files (removed at start).
 *
 *   [header 64 B][key, key_len bytes][pad to 8][payload, stored_len bytes]
 *   [zero padding to a multiple of 4096, for O_DIRECT]
 *
 * Little-endian.  header_sum covers the header (with header_sum = 0) and the
 * key; value_sum is xxh3-64 of the original value, checked after reading
 * (and decompressing) it back.  A record that fails either is never served.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define DISK_RECORD_MAGIC UINT64_C(0x3130434552564b00) /* "\0KVREC01" */
#define DISK_RECORD_VERSION 1u
#define DISK_ALIGN 4096u

enum disk_record_flags {
	DISK_REC_ZSTD = 1u << 0, /* payload is a zstd frame */
};

struct disk_record_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t flags;
	uint64_t value_len;   /* the object's length */
	uint64_t stored_len;  /* payload bytes on disk */
	uint64_t value_sum;   /* xxh3-64 of the value */
	uint64_t header_sum;  /* xxh3-64 of header (this field 0) + key */
	uint32_t key_len;
	uint32_t reserved;
	uint64_t created_ms;  /* wall clock, for operators */
};
_Static_assert(sizeof(struct disk_record_hdr) == 64, "record header size");

static inline uint64_t disk_record_payload_off(uint32_t key_len)
{
	return (sizeof(struct disk_record_hdr) + key_len + 7) & ~UINT64_C(7);
}

static inline uint64_t disk_record_size(uint32_t key_len, uint64_t stored_len)
{
	return (disk_record_payload_off(key_len) + stored_len + DISK_ALIGN - 1) &
	       ~(uint64_t) (DISK_ALIGN - 1);
}

/* Check a header read from a file of file_size bytes (key bytes follow it
 * in buf, which holds at least len bytes).  0, or -EBADMSG. */
int disk_record_check(const void *buf, size_t len, uint64_t file_size,
		      struct disk_record_hdr *ret);
uint64_t disk_record_header_sum(const struct disk_record_hdr *h, const void *key);
