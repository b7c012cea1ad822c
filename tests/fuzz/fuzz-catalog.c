/* SPDX-License-Identifier: MIT */
/* A warm start from a catalog anyone could have written: the input is the
 * catalog's entries, raw (byte 0 even) or as records whose checks this
 * harness makes right (byte 0 odd), so that entries claiming overlapping,
 * outside, duplicate and changed places reach the take-over itself.  After
 * it: the store is whole, and every object kept hashes to its checksum. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "catalog-layout.h"
#include "config.h"
#include "log.h"
#include "shm-layout.h"
#include "shmem.h"
#include "store.h"

#define SEG (1u << 20)
#define CAT (256u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t hash(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

static void hash_all(struct store_hash_job *jobs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		jobs[i].sum = hash(jobs[i].p, jobs[i].len);
}

struct verify {
	bool bad;
};

static void check_object(void *u, struct object *o)
{
	struct verify *v = u;

	if (!(o->flags & OBJ_SUMMED) || hash(store_object_ptr(o), o->len) != o->sum)
		v->bad = true;
}

/* Structured records: flags, offset, len, version, key. */
static size_t records(uint8_t *cat, const uint8_t *seg_base, const uint8_t *d, size_t n)
{
	uint64_t at = CATALOG_HEADER;
	size_t count = 0;

	while (n >= 8 && at + 64 + 64 <= CAT) {
		struct catalog_entry *e = (void *) (cat + at);
		uint8_t flags = d[0], key_len = (uint8_t) (1 + d[7] % 24);
		uint64_t off = (uint64_t) (d[1] | d[2] << 8 | (d[3] & 0x1f) << 16) << 6;
		uint64_t len = 1 + (uint64_t) (d[4] | d[5] << 8) * (flags & 8 ? 16 : 1);

		d += 8;
		n -= 8;
		if (n < key_len)
			break;
		memset(e, 0, 64 + key_len);
		e->offset = off;
		e->len = len;
		e->ver = d[0] & 3;
		e->tier = flags & 16 ? SHM_TIER_DEVICE : SHM_TIER_DRAM;
		e->flags = flags & 1 ? CATALOG_SUMMED : 0;
		e->key_len = key_len;
		for (unsigned i = 0; i < key_len; i++)
			e->key[i] = (char) ('a' + d[i] % 26);
		if (flags & 2 && off + len <= SEG + SHM_HEADER_SIZE)
			e->sum = hash(seg_base + off, len);
		e->check = XXH3_64bits((uint8_t *) e + 16, 48 + key_len) ^ (flags & 4 ? 1 : 0);
		e->magic = CATALOG_ENTRY_MAGIC;
		d += key_len;
		n -= key_len;
		at += (64 + key_len + 63) & ~63u;
		count++;
	}
	return count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config cfg;
	static struct loop *lp;
	struct store_warm w = { .device_fd = -1, .hash = hash_all };
	struct catalog_header *h;
	struct shm_segment seg;
	struct verify v = { 0 };
	struct store *st;
	uint8_t *cat;
	int cat_fd;

	if (!lp) {
		config_init(&cfg);
		cfg.dram_size = SEG;
		cfg.hugepages = SHM_HUGEPAGES_OFF;
		log_configure("error");
		if (loop_new(0, &lp) < 0)
			abort();
	}
	if (size < 1)
		return 0;
	if (shm_segment_create(&seg, "fuzz-dram", SEG, SHM_HUGEPAGES_OFF, SHM_TIER_DRAM, 0, 1) < 0)
		abort();
	for (uint64_t i = SHM_HEADER_SIZE; i < seg.size; i += 64)
		((uint8_t *) seg.base)[i] = (uint8_t) (i >> 6);
	if (shm_memfd_new("fuzz-catalog", CAT, false, &cat_fd, (void **) &cat) < 0)
		abort();
	h = (void *) cat;
	h->magic = CATALOG_MAGIC;
	h->layout = CATALOG_LAYOUT;
	h->header_size = CATALOG_HEADER;
	h->size = CAT;
	if (data[0] & 1)
		records(cat, seg.base, data + 1, size - 1);
	else
		memcpy(cat + CATALOG_HEADER, data + 1,
		       size - 1 < CAT - CATALOG_HEADER ? size - 1 : CAT - CATALOG_HEADER);
	w.dram_fd = fcntl(seg.fd, F_DUPFD_CLOEXEC, 3);
	w.catalog_fd = fcntl(cat_fd, F_DUPFD_CLOEXEC, 3);
	munmap(cat, CAT);
	close(cat_fd);
	shm_segment_done(&seg);
	if (store_new_warm(&cfg, lp, -1, &w, &st) < 0)
		abort();
	store_walk(st, 0, SIZE_MAX, SIZE_MAX, check_object, &v);
	if (v.bad)
		__builtin_trap();
	store_free(st);
	return 0;
}
