/* SPDX-License-Identifier: MIT */
/*
 * One-sided RDMA between the nodes' pools, through UCX (docs/rdma.rst).
 *
 * Each node registers its shared segments once (regions, by segment
 * index) and tells peers, in the data connection's handshake, its UCX
 * worker address and the packed remote key of every region.  A node that
 * knows a peer's regions reads an object straight from the peer's pool
 * into its own (rdma_get) or writes one into it (rdma_put, then a flush):
 * no bounce buffer, no CPU on the other side with real verbs.
 *
 * One thread owns the UCX worker (single-thread mode): it sleeps on the
 * worker's event fd and a command eventfd and never busy-polls.  The calls
 * below block the calling (data) thread until the transfer ends or its
 * deadline passes; a transfer given up is cancelled by closing the peer's
 * endpoint, and the call returns only once UCX has let go of the local
 * memory, so a block is never freed under a transfer still writing it.
 *
 * Built without UCX (-Drdma=disabled, or no libucx-dev), rdma_new() says
 * so and everything else is unreachable.  Like the rest of net/, nothing
 * here logs; errors come back as -errno with a message.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"

#define RDMA_MAX_REGIONS 8
#define RDMA_ERR_MAX 256

struct rdma;

struct rdma_opts {
	/* comma-separated verbs device names to use, "" = any active one */
	const char *devices;
	/* tests: UCX over its TCP transport, as if a verbs device existed,
	 * on the network interface named here ("" = UCX's choice, which
	 * takes "lo" for the same host even across network namespaces) */
	bool over_tcp;
	const char *tcp_ifname;
};

struct rdma_region {
	uint32_t id;
	uint64_t addr, size;
	const void *rkey;
	size_t rkey_len;
};

struct rdma_stats {
	uint64_t gets, get_bytes, puts, put_bytes, errors, timeouts, peers;
};

/* Whether this build has the RDMA transport at all. */
bool rdma_built(void);

/* Active verbs ports (PORT_ACTIVE), restricted to `devices` when not "":
 * how many, and the first as "name:port" in first (may be NULL). */
int rdma_active_devices(const char *devices, char *first, size_t cap);

int rdma_new(const struct rdma_opts *o, struct rdma **ret, char err[RDMA_ERR_MAX]);
void rdma_free(struct rdma *r); /* NULL-safe */

/* "mlx5_0:1", or "ucx-tcp" (tests) */
const char *rdma_device(const struct rdma *r);

/* Register [base, base + size) as region id (a segment index). */
int rdma_register(struct rdma *r, uint32_t id, void *base, uint64_t size);

/* This node's side of the handshake: its worker address, and its
 * regions (at most RDMA_MAX_REGIONS, each rkey valid while r lives). */
const void *rdma_worker_address(const struct rdma *r, size_t *len);
unsigned rdma_regions(struct rdma *r, struct rdma_region *out);

/*
 * A peer's worker and regions as its handshake told them, under its name
 * (the address it serves at): an endpoint to it is made now, replacing
 * one from before (whose transfers fail).  -EINVAL for a worker address
 * or an rkey that UCX does not accept.
 */
int rdma_peer_set(struct rdma *r, const char *peer, const void *worker, size_t worker_len,
		  const struct rdma_region *regions, unsigned n);
/* Forget a peer (its endpoint is closed). */
void rdma_peer_drop(struct rdma *r, const char *peer);

/*
 * Blocking, for data threads: len bytes at offset roff of the peer's
 * region rid into this node's region lid at loff (get), or the reverse
 * (put, flushed: on return the bytes are in the peer's memory).
 * 0; -ENOENT (no such peer: handshake first); -EINVAL (no such region, or
 * out of its bounds); -ETIMEDOUT at deadline (mono_us());
 * -ECONNRESET (the peer's endpoint failed); -EIO.
 */
int rdma_get(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline);
int rdma_put(struct rdma *r, const char *peer, uint32_t rid, uint64_t roff, uint32_t lid,
	     uint64_t loff, uint64_t len, usec_t deadline);

void rdma_get_stats(struct rdma *r, struct rdma_stats *s);
