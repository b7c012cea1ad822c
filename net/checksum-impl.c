/* SPDX-License-Identifier: MIT */
/*
 * XXH3-64 streaming, inlined from Debian's xxhash.h and compiled with the
 * vector unit named by CSUM_NAME (meson builds this file once per unit, with
 * its -m flags); checksum.c calls it only on CPUs that have that unit.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "checksum.h"

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

static void *create(void)
{
	XXH3_state_t *s = XXH3_createState();

	if (s)
		XXH3_64bits_reset(s);
	return s;
}

static void update(void *s, const void *p, size_t n)
{
	XXH3_64bits_update(s, p, n);
}

static uint64_t digest(void *s)
{
	return XXH3_64bits_digest(s);
}

static void destroy(void *s)
{
	XXH3_freeState(s);
}

extern const struct csum_ops CAT(csum_ops_, CSUM_NAME);
const struct csum_ops CAT(csum_ops_, CSUM_NAME) = { create, update, digest, destroy };
