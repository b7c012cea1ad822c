/* SPDX-License-Identifier: MIT */
/* Segments: sealed at creation; a client maps only a sealed memfd of the
 * announced size, and sees the daemon's bytes. */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "shmem.h"

static void test_roundtrip(void)
{
	struct shm_segment d, c;
	const struct shm_seg_header *h;
	int fd;

	CHECK_EQ(shm_segment_create(&d, "t", 1 << 20, SHM_HUGEPAGES_OFF, SHM_TIER_DRAM, 0, 42), 0);
	CHECK(!d.hugepages);
	CHECK_EQ(d.size, SHM_HEADER_SIZE + (1 << 20));
	h = shm_segment_header(&d);
	CHECK_EQ(h->magic, SHM_SEG_MAGIC);
	CHECK_EQ(h->layout_version, SHM_LAYOUT_VERSION);
	CHECK_EQ(h->generation, 42);
	CHECK_EQ(h->data_offset, SHM_HEADER_SIZE);
	CHECK_EQ(shm_segment_check_seals(d.fd), 0);
	/* sealed: cannot grow or shrink, seals cannot be removed */
	CHECK(ftruncate(d.fd, 1 << 21) < 0 && errno == EPERM);
	CHECK(ftruncate(d.fd, 4096) < 0 && errno == EPERM);
	CHECK(fcntl(d.fd, F_ADD_SEALS, F_SEAL_WRITE) < 0);

	memcpy((char *) d.base + SHM_HEADER_SIZE, "hello", 5);
	fd = dup(d.fd);
	CHECK_EQ(shm_segment_map(&c, fd, d.size), 0);
	CHECK(memcmp((char *) c.base + SHM_HEADER_SIZE, "hello", 5) == 0);
	memcpy((char *) c.base + SHM_HEADER_SIZE + 100, "back", 4);
	CHECK(memcmp((char *) d.base + SHM_HEADER_SIZE + 100, "back", 4) == 0);
	shm_segment_done(&c);

	/* wrong announced size */
	CHECK_EQ(shm_segment_map(&c, dup(d.fd), d.size - 4096), -EBADMSG);
	CHECK_EQ(shm_segment_map(&c, dup(d.fd), d.size + 4096), -EBADMSG);
	shm_segment_done(&d);
}

static void test_unsealed_rejected(void)
{
	struct shm_segment c;
	int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CHECK(fd >= 0);
	CHECK(ftruncate(fd, 1 << 20) == 0);
	CHECK_EQ(shm_segment_map(&c, dup(fd), 1 << 20), -EPERM);
	/* sealed against shrinking only: still refused */
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
	CHECK_EQ(shm_segment_map(&c, dup(fd), 1 << 20), -EPERM);
	close(fd);

	/* not a memfd at all */
	fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_EQ(shm_segment_map(&c, fd, 1 << 20), -EPERM);
}

/* The header inside a segment is client-writable: mapping never depends
 * on it (layout version and data offset come from the handshake). */
static void test_header_not_trusted(void)
{
	struct shm_segment d, c;
	struct shm_seg_header *h;

	CHECK_EQ(shm_segment_create(&d, "t", 1 << 16, SHM_HUGEPAGES_OFF, SHM_TIER_DRAM, 0, 1), 0);
	h = d.base;
	memset(h, 0, sizeof(*h));
	CHECK_EQ(shm_segment_map(&c, dup(d.fd), d.size), 0);
	shm_segment_done(&c);
	h->layout_version = SHM_LAYOUT_VERSION + 1;
	h->size = 1;
	CHECK_EQ(shm_segment_map(&c, dup(d.fd), d.size), 0);
	shm_segment_done(&c);
	shm_segment_done(&d);
}

static void test_hugepages(void)
{
	struct shm_segment d;
	int r;

	/* auto never fails for want of hugepages */
	CHECK_EQ(shm_segment_create(&d, "t", 3 << 20, SHM_HUGEPAGES_AUTO, SHM_TIER_DRAM, 0, 1), 0);
	if (d.hugepages) {
		CHECK_EQ(d.size % SHM_HUGEPAGE_SIZE, 0);
		CHECK_EQ(d.hugepage_error, 0);
	} else
		CHECK(d.hugepage_error < 0);
	printf("hugepages: %s\n", d.hugepages ? "available" : "not available, fell back");
	shm_segment_done(&d);

	r = shm_segment_create(&d, "t", 3 << 20, SHM_HUGEPAGES_ON, SHM_TIER_DRAM, 0, 1);
	if (r == 0) {
		CHECK(d.hugepages);
		shm_segment_done(&d);
	} else
		CHECK(r == -ENOMEM || r == -EINVAL || r == -ENOSYS);
}

int main(void)
{
	test_roundtrip();
	test_unsealed_rejected();
	test_header_not_trusted();
	test_hugepages();
	return 0;
}
