/* SPDX-License-Identifier: MIT */
/*
 * The RDMA transport (net/rdma.c) between two UCX workers in one process,
 * UCX on its TCP transport (no verbs device here): gets and flushed puts
 * move every byte; a peer's malformed worker address or remote key, an
 * unknown peer, a region or range that is not there are clean errors; a
 * peer that went away fails its transfers within their deadline.  Also:
 * with no device and no test switch, there is no RDMA ("no device ->
 * tcp").  Skipped in a build without UCX.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "rdma.h"
#include "helpers.h"

#define SIZE (8u << 20)

static uint8_t *region(void)
{
	uint8_t *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	CHECK(p != MAP_FAILED);
	return p;
}

/* b learns a's worker and regions under a's name */
static int introduce(struct rdma *b, struct rdma *a, const char *name)
{
	struct rdma_region regs[RDMA_MAX_REGIONS];
	size_t wl;
	const void *w = rdma_worker_address(a, &wl);
	unsigned n = rdma_regions(a, regs);

	return rdma_peer_set(b, name, w, wl, regs, n);
}

int main(void)
{
	struct rdma_opts tcp = { .devices = "", .over_tcp = true };
	struct rdma_opts real = { .devices = "", .over_tcp = false };
	char err[RDMA_ERR_MAX];
	struct rdma *a, *b, *c;
	struct rdma_stats st;
	uint8_t *ma, *mb;
	int r;

	if (!rdma_built()) {
		CHECK(rdma_new(&tcp, &a, err) == -ENOTSUP);
		return EXIT_SKIP;
	}
	/* no verbs device on this machine: no RDMA without the test switch */
	if (rdma_active_devices("", NULL, 0) == 0) {
		CHECK_EQ(rdma_new(&real, &a, err), -ENODEV);
		CHECK(strstr(err, "no active RDMA device"));
	}

	ma = region();
	mb = region();
	for (size_t i = 0; i < SIZE; i++)
		ma[i] = (uint8_t) (i * 7 + 3);
	CHECK_EQ(rdma_new(&tcp, &a, err), 0);
	CHECK_EQ(rdma_new(&tcp, &b, err), 0);
	CHECK(strstr(rdma_device(a), "tcp"));
	CHECK_EQ(rdma_register(a, 0, ma, SIZE), 0);
	CHECK_EQ(rdma_register(b, 0, mb, SIZE), 0);
	CHECK_EQ(rdma_register(b, 0, mb, SIZE), -EINVAL); /* once per id */

	/* unknown peer */
	CHECK_EQ(rdma_get(b, "A", 0, 0, 0, 0, 4096, mono_us() + 2000 * USEC_PER_MSEC), -ENOENT);
	CHECK_EQ(introduce(b, a, "A"), 0);
	CHECK_EQ(introduce(a, b, "B"), 0);

	/* a get: B reads 5 MB + 3 of A's region at an offset */
	r = rdma_get(b, "A", 0, 4096 + 1, 0, 100, 5000003, mono_us() + 5000 * USEC_PER_MSEC);
	CHECK_EQ(r, 0);
	CHECK(memcmp(mb + 100, ma + 4096 + 1, 5000003) == 0);
	/* a put, flushed: in A's memory when it returns */
	memset(mb, 0x5c, 65536);
	CHECK_EQ(rdma_put(b, "A", 0, SIZE - 65536, 0, 0, 65536, mono_us() + 5000 * USEC_PER_MSEC), 0);
	for (size_t i = SIZE - 65536; i < SIZE; i++)
		CHECK_EQ(ma[i], 0x5c);
	/* many small ones */
	for (int i = 0; i < 200; i++) {
		CHECK_EQ(rdma_get(b, "A", 0, (uint64_t) i * 4096, 0, (uint64_t) i * 4096, 4096,
				  mono_us() + 5000 * USEC_PER_MSEC), 0);
		CHECK(memcmp(mb + i * 4096, ma + i * 4096, 4096) == 0);
	}

	/* out of bounds, either side; a region that is not there */
	CHECK_EQ(rdma_get(b, "A", 0, SIZE - 10, 0, 0, 11, mono_us() + 2000 * USEC_PER_MSEC), -EINVAL);
	CHECK_EQ(rdma_get(b, "A", 0, 0, 0, SIZE - 10, 11, mono_us() + 2000 * USEC_PER_MSEC), -EINVAL);
	CHECK_EQ(rdma_get(b, "A", 3, 0, 0, 0, 11, mono_us() + 2000 * USEC_PER_MSEC), -EINVAL);
	CHECK_EQ(rdma_get(b, "A", 0, UINT64_MAX - 5, 0, 0, 11, mono_us() + 2000 * USEC_PER_MSEC), -EINVAL);

	/* a peer announcing a malformed rkey or worker address: refused, and
	 * the peer known before stays usable */
	{
		struct rdma_region regs[RDMA_MAX_REGIONS];
		size_t wl;
		const void *w = rdma_worker_address(a, &wl);
		unsigned n = rdma_regions(a, regs);
		uint8_t junk[64], *wbad = malloc(wl);

		for (size_t i = 0; i < sizeof(junk); i++)
			junk[i] = (uint8_t) (0xa5 ^ i * 13);
		regs[0].rkey = junk;
		regs[0].rkey_len = sizeof(junk);
		CHECK_EQ(rdma_peer_set(b, "bogus", w, wl, regs, n), -EINVAL);
		regs[0].rkey_len = 3; /* shorter than its own header */
		CHECK_EQ(rdma_peer_set(b, "bogus", w, wl, regs, n), -EINVAL);
		memset(wbad, 0xff, wl);
		n = rdma_regions(a, regs);
		r = rdma_peer_set(b, "bogus", wbad, wl, regs, n);
		CHECK(r == -EINVAL || r == 0);
		if (r == 0) /* accepted as an address: it reaches no one */
			CHECK(rdma_get(b, "bogus", 0, 0, 0, 0, 4096, mono_us() + 1500 * USEC_PER_MSEC) < 0);
		free(wbad);
		CHECK_EQ(rdma_get(b, "A", 0, 0, 0, 0, 4096, mono_us() + 5000 * USEC_PER_MSEC), 0);
	}

	/* re-introducing a peer replaces its endpoint; transfers go on */
	CHECK_EQ(introduce(b, a, "A"), 0);
	CHECK_EQ(rdma_get(b, "A", 0, 8192, 0, 0, 65536, mono_us() + 5000 * USEC_PER_MSEC), 0);
	CHECK(memcmp(mb, ma + 8192, 65536) == 0);

	/* a third worker that goes away: B's transfers to it end in time */
	{
		uint8_t *mc = region();
		uint64_t t0;

		CHECK_EQ(rdma_new(&tcp, &c, err), 0);
		CHECK_EQ(rdma_register(c, 0, mc, SIZE), 0);
		CHECK_EQ(introduce(b, c, "C"), 0);
		CHECK_EQ(rdma_get(b, "C", 0, 0, 0, 0, 4096, mono_us() + 5000 * USEC_PER_MSEC), 0);
		rdma_free(c);
		t0 = mono_us();
		r = rdma_get(b, "C", 0, 0, 0, 0, 1u << 20, t0 + 2000 * USEC_PER_MSEC);
		CHECK(r == -ECONNRESET || r == -ETIMEDOUT || r == -EIO);
		CHECK(mono_us() - t0 < 4000 * USEC_PER_MSEC);
		munmap(mc, SIZE);
	}
	/* and A is still fine */
	CHECK_EQ(rdma_get(b, "A", 0, 0, 0, 0, 4096, mono_us() + 5000 * USEC_PER_MSEC), 0);

	rdma_get_stats(b, &st);
	CHECK(st.gets >= 203);
	CHECK(st.get_bytes >= 5000003 + 200 * 4096);
	CHECK_EQ(st.puts, 1);
	CHECK(st.errors + st.timeouts >= 1);
	rdma_free(b);
	rdma_free(a);
	munmap(ma, SIZE);
	munmap(mb, SIZE);
	return 0;
}
