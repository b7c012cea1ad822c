/* SPDX-License-Identifier: MIT */
/*
 * The checksum that travels with every object between nodes: XXH3-64 over
 * its bytes, fed chunk by chunk.  The result is the same whichever vector
 * unit computes it; this picks the fastest the CPU has (AVX-512, AVX2, or
 * libxxhash's own build) once, because on the transfer path the hash costs
 * as much as the copy.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct csum;

struct csum *csum_new(void); /* NULL: no memory */
void csum_update(struct csum *c, const void *p, size_t n);
uint64_t csum_digest(struct csum *c);
void csum_free(struct csum *c);
/* "avx512", "avx2" or "generic" */
const char *csum_impl(void);

/* One implementation (checksum-impl.c, compiled once per vector unit). */
struct csum_ops {
	void *(*create)(void);
	void (*update)(void *s, const void *p, size_t n);
	uint64_t (*digest)(void *s);
	void (*destroy)(void *s);
};
