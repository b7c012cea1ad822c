/* SPDX-License-Identifier: MIT */
/* The mapper thread: mappings handed to it are unmapped and their files
 * closed, in steps, in order with calls run on it; stopping runs what is
 * queued; with no mapper the work is done at once.  No daemon process. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "mapper.h"

/* A mapping of a memfd named test-mapper-<id>, every page present, as a
 * copy leaves them. */
static void *mapped_memfd(int id, size_t len, unsigned flags, int *ret_fd)
{
	char name[32];
	int fd;
	void *p;

	snprintf(name, sizeof(name), "test-mapper-%d", id);
	fd = memfd_create(name, MFD_CLOEXEC | flags);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t) len) < 0) {
		close(fd);
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	memset(p, 0x5a, len);
	*ret_fd = fd;
	return p;
}

/* No part of memfd test-mapper-<id> is mapped any more.  (By name: the
 * addresses themselves are soon used again, by malloc's arenas among
 * others.) */
static bool unmapped(int id)
{
	char line[512], name[48];
	bool found = false;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return false;
	snprintf(name, sizeof(name), "/memfd:test-mapper-%d ", id);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, name) != NULL;
	fclose(f);
	return !found;
}

static bool closed(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF;
}

static bool settle(struct mapper *m)
{
	for (int i = 0; i < 20000 && mapper_pending(m); i++)
		usleep(100);
	return mapper_pending(m) == 0;
}

struct order {
	int id;
	bool saw_unmapped;
	int calls;
};

static void after_unmap(void *arg)
{
	struct order *o = arg;

	o->saw_unmapped = unmapped(o->id);
	o->calls++;
}

int main(void)
{
	struct mapper *m;
	struct order o = { 0 };
	int fd[4];
	void *p[4];
	/* a length that is no multiple of the step */
	const size_t odd = (3u << 20) + 4096;

	CHECK_EQ(mapper_start(NULL, &m), 0);

	/* a large mapping: unmapped, file closed; a call queued after it
	 * runs after it */
	p[0] = mapped_memfd(0, 64u << 20, 0, &fd[0]);
	CHECK(p[0] != NULL);
	CHECK(!unmapped(0));
	o.id = 0;
	unmap_later(m, p[0], 64u << 20, fd[0]);
	CHECK_EQ(mapper_call(m, after_unmap, &o), 0);
	CHECK(settle(m));
	CHECK_EQ(o.calls, 1);
	CHECK(o.saw_unmapped);
	CHECK(unmapped(0));
	CHECK(closed(fd[0]));

	/* an odd length; nothing mapped, with a file to close; a mapping
	 * with no file */
	p[1] = mapped_memfd(1, odd, 0, &fd[1]);
	CHECK(p[1] != NULL);
	unmap_later(m, p[1], odd, fd[1]);
	CHECK_EQ(pipe(&fd[2]), 0);
	close(fd[3]);
	unmap_later(m, NULL, 0, fd[2]);
	p[3] = mapped_memfd(3, 1u << 20, 0, &fd[3]);
	CHECK(p[3] != NULL);
	close(fd[3]);
	unmap_later(m, p[3], 1u << 20, -1);
	CHECK(settle(m));
	CHECK(unmapped(1));
	CHECK(closed(fd[1]));
	CHECK(closed(fd[2]));
	CHECK(unmapped(3));

	/* hugepages, where the kernel has them: unmapped in 2 MiB steps */
	p[2] = mapped_memfd(2, 8u << 20, MFD_HUGETLB, &fd[2]);
	if (p[2]) {
		CHECK(!unmapped(2));
		unmap_later(m, p[2], 8u << 20, fd[2]);
		CHECK(settle(m));
		CHECK(unmapped(2));
		CHECK(closed(fd[2]));
	} else
		printf("# no 2 MiB hugepages: the hugepage case was not run\n");

	/* stopping runs what is queued */
	p[0] = mapped_memfd(10, 32u << 20, 0, &fd[0]);
	p[1] = mapped_memfd(11, odd, 0, &fd[1]);
	CHECK(p[0] != NULL && p[1] != NULL);
	unmap_later(m, p[0], 32u << 20, fd[0]);
	unmap_later(m, p[1], odd, fd[1]);
	o = (struct order) { .id = 11 };
	CHECK_EQ(mapper_call(m, after_unmap, &o), 0);
	mapper_stop(m);
	CHECK(unmapped(10));
	CHECK(unmapped(11));
	CHECK(closed(fd[0]));
	CHECK(closed(fd[1]));
	CHECK_EQ(o.calls, 1);
	CHECK(o.saw_unmapped);

	/* no mapper: done here and now; calls are refused */
	p[0] = mapped_memfd(20, 4u << 20, 0, &fd[0]);
	CHECK(p[0] != NULL);
	unmap_later(NULL, p[0], 4u << 20, fd[0]);
	CHECK(unmapped(20));
	CHECK(closed(fd[0]));
	CHECK_EQ(mapper_call(NULL, after_unmap, &o), -ENODEV);
	CHECK_EQ(o.calls, 1);
	CHECK_EQ(mapper_pending(NULL), 0);
	printf("ok\n");
	return 0;
}
