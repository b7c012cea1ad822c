/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <xxhash.h>

#include "checksum.h"

#ifdef CSUM_X86
extern const struct csum_ops csum_ops_avx512, csum_ops_avx2;
#endif

static void *gen_create(void)
{
	XXH3_state_t *s = XXH3_createState();

	if (s)
		XXH3_64bits_reset(s);
	return s;
}

static void gen_update(void *s, const void *p, size_t n)
{
	XXH3_64bits_update(s, p, n);
}

static uint64_t gen_digest(void *s)
{
	return XXH3_64bits_digest(s);
}

static void gen_destroy(void *s)
{
	XXH3_freeState(s);
}

static const struct csum_ops generic = { gen_create, gen_update, gen_digest, gen_destroy };
static const struct csum_ops *ops = &generic;
static const char *impl = "generic";
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void pick(void)
{
	const char *force = getenv("KVCACHE_CHECKSUM"); /* tests: "generic" */

	if (force && force[0])
		return;
#ifdef CSUM_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) {
		ops = &csum_ops_avx512;
		impl = "avx512";
	} else if (__builtin_cpu_supports("avx2")) {
		ops = &csum_ops_avx2;
		impl = "avx2";
	}
#endif
}

struct csum {
	const struct csum_ops *ops;
	void *state;
};

struct csum *csum_new(void)
{
	struct csum *c;

	pthread_once(&once, pick);
	c = malloc(sizeof(*c));
	if (!c)
		return NULL;
	c->ops = ops;
	c->state = ops->create();
	if (!c->state) {
		free(c);
		return NULL;
	}
	return c;
}

void csum_update(struct csum *c, const void *p, size_t n)
{
	c->ops->update(c->state, p, n);
}

uint64_t csum_digest(struct csum *c)
{
	return c->ops->digest(c->state);
}

void csum_free(struct csum *c)
{
	if (!c)
		return;
	c->ops->destroy(c->state);
	free(c);
}

const char *csum_impl(void)
{
	pthread_once(&once, pick);
	return impl;
}
