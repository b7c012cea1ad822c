/* SPDX-License-Identifier: MIT */
/*
 * A node's serving side of a data connection fed whatever a peer may send:
 * Hello, Auth, Fetch and Push frames (over TCP, or asking for RDMA) and
 * FetchDone in any order, lengths that lie, keys
 * that exist and keys that do not, raw bytes where a frame is expected.  An
 * in-process node (a 4 MiB dram tier holding a few small objects, no
 * master reachable) serves the input as one connection, its data threads
 * included, and the connection is then hung up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "holder.h"
#include "fuzz-socket.h"
#include "log.h"
#include "node.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct config cfg;
static struct store *st;
static struct node *node;

static void put(const char *key, size_t len)
{
	static const struct holder_ops ops = { 0 };
	struct put_args a = { .key = key, .key_len = strlen(key), .len = len };
	char msg[STORE_MSG_MAX];
	uint64_t res, views;
	struct holder h;
	struct extent x;

	holder_init(&h, st, &ops);
	if (store_reserve(&h, &a, &x, msg) < 0)
		abort();
	memset(store_extent_ptr(st, &x), 0x5a, x.len);
	if (store_commit(&h, x.handle, msg) < 0)
		abort();
	holder_done(&h, &res, &views);
}

static void setup(void)
{
	struct loop *loop;
	char err[256];

	config_init(&cfg);
	cfg.dram_size = 4 << 20;
	cfg.hugepages = SHM_HUGEPAGES_OFF;
	cfg.prefault = SHM_HUGEPAGES_OFF;
	cfg.remote_timeout_ms = 200; /* a send the fuzzer never reads ends soon */
	snprintf(cfg.master_server_address, sizeof(cfg.master_server_address), "127.0.0.1:1");
	snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
	snprintf(cfg.node_id, sizeof(cfg.node_id), "fuzz");
	log_configure("error");
	/* with RDMA in this build, the node answers RDMA fetches and pushes
	 * too (on UCX's tcp transport: no device here) */
	cfg.test.rdma_over_tcp = true;
	/* a loop that never runs: the node's sources register with it */
	if (loop_new(0, &loop) < 0 || store_new(&cfg, loop, -1, &st) < 0)
		abort();
	if (node_new(st, &cfg, &node, err, sizeof(err)) < 0) {
		fprintf(stderr, "node_new: %s\n", err);
		abort();
	}
	put("k", 100);
	put("key-2", 4000);
	put("empty-ish", 1);
	/* big enough that a second answer nobody reads fills the socket: the
	 * loop's own send stops part-way and a data thread takes the rest */
	put("big", 200000);
}

static void feed(void *ctx, int fd)
{
	node_feed(ctx, fd); /* takes fd */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!node)
		setup();
	if (size > (64u << 10))
		return 0;
	fuzz_feed_socket(data, size, feed, node);
	return 0;
}
