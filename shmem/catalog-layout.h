/* SPDX-License-Identifier: MIT */
/*
 * The catalog's layout: what kvcached writes into its catalog memfd for
 * the next run (daemon/core/catalog.c; docs/warm-restart.rst).  Only
 * daemons map it; a next run trusts nothing in it that does not check.
 */
#pragma once

#include <stdint.h>

#define CATALOG_MAGIC UINT64_C(0x31544143434b5600)  /* "\0VKCCAT1" */
#define CATALOG_LAYOUT 1u
#define CATALOG_HEADER 4096u
#define CATALOG_ENTRY_MAGIC UINT64_C(0x59524e4543564b21) /* "!KVCENRY" */
#define CATALOG_SUMMED 1u

struct catalog_header {
	uint64_t magic;
	uint32_t layout;
	uint32_t header_size;
	uint64_t size;        /* bytes in the memfd */
	uint64_t generation;  /* the run that made it */
};

/* One object: 64 bytes, then its key, at a 64-byte boundary.  `check` is
 * the XXH3-64 of everything after it; magic is written last and cleared
 * first (with the rest) when the object goes. */
struct catalog_entry {
	uint64_t magic;
	uint64_t check;
	uint64_t offset;   /* in its tier's segment */
	uint64_t len;
	uint64_t ver;
	uint64_t sum;      /* with CATALOG_SUMMED: XXH3-64 of the bytes */
	uint32_t tier;     /* enum shm_tier */
	uint32_t flags;
	uint32_t key_len;
	uint32_t reserved;
	char key[];
};
_Static_assert(sizeof(struct catalog_entry) == 64, "catalog entry size");
