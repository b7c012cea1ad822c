/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shmem.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

int shm_memfd_new(const char *name, uint64_t size, bool huge, int *ret_fd, void **ret_base)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0);
	uint64_t total = size;
	void *p;
	int fd, r;

	if (size == 0 || size % (huge ? SHM_HUGEPAGE_SIZE : 4096))
		return -EINVAL;
	fd = memfd_create(name, flags);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t) total) < 0) {
		r = -errno;
		goto fail;
	}
	if (fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS) < 0) {
		r = -errno;
		goto fail;
	}
	/* A shared hugetlb mapping reserves its pages here, so a kernel that
	 * lacks them says so now rather than with SIGBUS on first touch. */
	p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto fail;
	}
	*ret_fd = fd;
	*ret_base = p;
	return 0;
fail:
	close(fd);
	return r;
}

int shm_memfd_map(int fd, uint64_t size, void **ret_base)
{
	struct stat st;
	void *p;
	int r;

	r = shm_segment_check_seals(fd);
	if (r < 0)
		goto out;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	if (size == 0 || (uint64_t) st.st_size != size) {
		r = -EBADMSG;
		goto out;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto out;
	}
	*ret_base = p;
	r = 0;
out:
	close(fd);
	return r;
}

/* One attempt with a given page size; on failure nothing is left behind. */
static int try_create(struct shm_segment *seg, const char *name, uint64_t size, bool huge)
{
	uint64_t total = round_up(SHM_HEADER_SIZE + size, huge ? SHM_HUGEPAGE_SIZE : 4096);
	int r;

	r = shm_memfd_new(name, total, huge, &seg->fd, &seg->base);
	if (r < 0)
		return r;
	seg->size = total;
	seg->hugepages = huge;
	return 0;
}

int shm_segment_create(struct shm_segment *seg, const char *name, uint64_t size,
		       enum shm_hugepages hp, uint32_t tier, uint32_t index,
		       uint64_t generation)
{
	struct shm_seg_header *h;
	int r = -EINVAL;

	*seg = (struct shm_segment) SHM_SEGMENT_INIT;
	if (size == 0 || size > (UINT64_C(1) << 46))
		return -EINVAL;

	if (hp != SHM_HUGEPAGES_OFF) {
		r = try_create(seg, name, size, true);
		if (r < 0 && hp == SHM_HUGEPAGES_ON)
			return r;
		seg->hugepage_error = r < 0 ? r : 0;
	}
	if (hp == SHM_HUGEPAGES_OFF || r < 0) {
		int herr = seg->hugepage_error;

		r = try_create(seg, name, size, false);
		if (r < 0)
			return r;
		seg->hugepage_error = herr;
	}

	h = seg->base;
	memset(h, 0, sizeof(*h));
	h->layout_version = SHM_LAYOUT_VERSION;
	h->header_size = SHM_HEADER_SIZE;
	h->generation = generation;
	h->size = seg->size;
	h->data_offset = SHM_HEADER_SIZE;
	h->tier = tier;
	h->flags = seg->hugepages ? SHM_SEG_HUGEPAGES : 0;
	h->index = index;
	h->daemon_pid = (uint32_t) getpid();
	/* magic last: a header with the magic is a complete header */
	__atomic_store_n(&h->magic, SHM_SEG_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

int shm_memfd_adopt(int fd, uint64_t min_size, void **ret_base, uint64_t *ret_size,
		    const char **why)
{
	struct stat sb;
	void *p;

	*why = NULL;
	if (shm_segment_check_seals(fd) < 0 || fstat(fd, &sb) < 0)
		*why = "not a sealed memfd";
	else if ((uint64_t) sb.st_size < min_size || sb.st_size % 4096)
		*why = "of a size it cannot have";
	if (*why) {
		close(fd);
		return -EBADMSG;
	}
	p = mmap(NULL, (size_t) sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int r = -errno;

		*why = "it cannot be mapped";
		close(fd);
		return r;
	}
	*ret_base = p;
	*ret_size = (uint64_t) sb.st_size;
	return 0;
}

int shm_segment_adopt(struct shm_segment *seg, int fd, uint64_t size, uint32_t tier,
		      uint32_t index, uint64_t generation, const char **why)
{
	struct shm_seg_header *h;
	uint64_t mapped;
	bool huge;
	void *p;
	int r;

	*seg = (struct shm_segment) SHM_SEGMENT_INIT;
	r = shm_memfd_adopt(fd, SHM_HEADER_SIZE, &p, &mapped, why);
	if (r < 0)
		return r;
	h = p;
	huge = h->flags & SHM_SEG_HUGEPAGES;
	if (h->magic != SHM_SEG_MAGIC || h->header_size != SHM_HEADER_SIZE ||
	    h->data_offset != SHM_HEADER_SIZE || h->size != mapped)
		*why = "no segment header";
	else if (h->layout_version != SHM_LAYOUT_VERSION)
		*why = "a segment layout this kvcached does not read";
	else if (h->tier != tier || h->index != index)
		*why = "a segment of another tier";
	else if (h->size != round_up(SHM_HEADER_SIZE + size, huge ? SHM_HUGEPAGE_SIZE : 4096))
		*why = "a segment of another size (the tier was resized)";
	if (*why) {
		munmap(p, (size_t) mapped);
		close(fd);
		return -EBADMSG;
	}
	seg->fd = fd;
	seg->base = p;
	seg->size = h->size;
	seg->hugepages = huge;
	h->generation = generation;
	h->daemon_pid = (uint32_t) getpid();
	return 0;
}

int shm_segment_check_seals(int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return errno == EINVAL ? -EPERM : -errno; /* not a memfd */
	if ((seals & REQUIRED_SEALS) != REQUIRED_SEALS)
		return -EPERM;
	return 0;
}

int shm_segment_map(struct shm_segment *seg, int fd, uint64_t size)
{
	void *p;
	int r;

	*seg = (struct shm_segment) SHM_SEGMENT_INIT;
	if (size < SHM_HEADER_SIZE) {
		close(fd);
		return -EBADMSG;
	}
	/* Sealed against shrinking, so the size checked is the size mapped
	 * for as long as the mapping lives.  The header in the segment is
	 * not read: any client can write it, so what a client relies on
	 * (layout version, where data starts) comes from the handshake. */
	r = shm_memfd_map(fd, size, &p);
	if (r < 0)
		return r;
	seg->base = p;
	seg->size = size;
	return 0;
}

void shm_segment_done(struct shm_segment *seg)
{
	if (!seg)
		return;
	if (seg->base)
		munmap(seg->base, seg->size);
	if (seg->fd >= 0)
		close(seg->fd);
	*seg = (struct shm_segment) SHM_SEGMENT_INIT;
}
