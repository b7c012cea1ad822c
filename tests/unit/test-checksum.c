/* SPDX-License-Identifier: MIT */
/* The transfer checksum: every vector unit's XXH3 equals libxxhash's, fed
 * in any chunking. */
#include <stdlib.h>
#include <xxhash.h>

#include "checksum.h"
#include "helpers.h"

#if defined(__x86_64__)
extern const struct csum_ops csum_ops_avx512, csum_ops_avx2;
#endif

static uint64_t with(const struct csum_ops *ops, const uint8_t *p, size_t n, size_t chunk)
{
	void *s = ops->create();
	uint64_t h;

	CHECK(s);
	for (size_t off = 0; off < n; off += chunk)
		ops->update(s, p + off, n - off < chunk ? n - off : chunk);
	h = ops->digest(s);
	ops->destroy(s);
	return h;
}

int main(void)
{
	static const size_t sizes[] = { 0, 1, 63, 64, 240, 241, 4096, (256u << 10) + 7, 3u << 20 };
	static const size_t chunks[] = { 1, 7, 4096, 256u << 10, 1u << 30 };
	size_t max = 3u << 20;
	uint8_t *buf = malloc(max);
	const struct csum_ops *units[3];
	size_t n_units = 0;
	uint64_t seed = 42;

	CHECK(buf);
	for (size_t i = 0; i < max; i++)
		buf[i] = (uint8_t) test_rand(&seed);
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		units[n_units++] = &csum_ops_avx512;
	if (__builtin_cpu_supports("avx2"))
		units[n_units++] = &csum_ops_avx2;
#endif
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint64_t want = XXH3_64bits(buf, sizes[s]);

		for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
			struct csum *h;

			if (chunks[c] == 1 && sizes[s] > 4096)
				continue; /* byte by byte: small sizes are enough */
			h = csum_new();
			CHECK(h);
			for (size_t off = 0; off < sizes[s]; off += chunks[c])
				csum_update(h, buf + off,
					    sizes[s] - off < chunks[c] ? sizes[s] - off : chunks[c]);
			CHECK(csum_digest(h) == want);
			csum_free(h);
			for (size_t u = 0; u < n_units; u++)
				CHECK(with(units[u], buf, sizes[s], chunks[c]) == want);
		}
	}
	/* one flipped byte changes it */
	{
		struct csum *h = csum_new();
		uint64_t a, b;

		csum_update(h, buf, 1 << 20);
		a = csum_digest(h);
		csum_free(h);
		buf[12345] ^= 1;
		h = csum_new();
		csum_update(h, buf, 1 << 20);
		b = csum_digest(h);
		csum_free(h);
		CHECK(a != b);
	}
	printf("checksum: %s and %zu vector units agree with libxxhash\n", csum_impl(), n_units);
	free(buf);
	return 0;
}
