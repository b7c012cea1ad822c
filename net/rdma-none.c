/* SPDX-License-Identifier: MIT */
/* The RDMA transport of a build without UCX (-Drdma=disabled, or no
 * libucx-dev): nothing to use, and it says so. */
#include <errno.h>
#include <stdio.h>

#include "rdma.h"

bool rdma_built(void)
{
	return false;
}

int rdma_active_devices(const char *devices, char *first, size_t cap)
{
	(void) devices;
	if (first && cap)
		first[0] = '\0';
	return 0;
}

int rdma_new(const struct rdma_opts *o, struct rdma **ret, char err[RDMA_ERR_MAX])
{
	(void) o;
	(void) ret;
	snprintf(err, RDMA_ERR_MAX, "this kvcached was built without RDMA (UCX)");
	return -ENOTSUP;
}

void rdma_free(struct rdma *r)
{
	(void) r;
}

const char *rdma_device(const struct rdma *r)
{
	(void) r;
	return "";
}

int rdma_register(struct rdma *r, uint32_t id, void *base, uint64_t size)
{
	(void) r, (void) id, (void) base, (void) size;
	return -ENOTSUP;
}

const void *rdma_worker_address(const struct rdma *r, size_t *len)
{
	(void) r;
	*len = 0;
	return NULL;
}

unsigned rdma_regions(struct rdma *r, struct rdma_region *out)
{
	(void) r, (void) out;
	return 0;
}

int rdma_peer_set(struct rdma *r, const char *peer, const void *worker, size_t worker_len,
		  const struct rdma_region *regions, unsigned n)
{
	(void) r, (void) peer, (void) worker, (void) worker_len, (void) regions, (void) n;
	return -ENOTSUP;
}

void rdma_peer_drop(struct rdma *r, const char *peer)
{
	(void) r, (void) peer;
}

int rdma_get(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline)
{
	(void) r, (void) peer, (void) rid, (void) roff, (void) lid, (void) loff, (void) len;
	(void) deadline;
	return -ENOTSUP;
}

int rdma_put(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline)
{
	(void) r, (void) peer, (void) rid, (void) roff, (void) lid, (void) loff, (void) len;
	(void) deadline;
	return -ENOTSUP;
}

void rdma_get_stats(struct rdma *r, struct rdma_stats *s)
{
	(void) r;
	*s = (struct rdma_stats) { 0 };
}
