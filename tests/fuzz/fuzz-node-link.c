/* SPDX-License-Identifier: MIT */
/*
 * A node fed whatever its master may send on their link: an in-process
 * node (a 4 MiB dram tier holding a few objects) whose link to its master
 * is a socket carrying the input, after the node's Hello: HelloAck,
 * Members, lookup answers and Drops in any order, with any content.  The
 * node must survive every input; what a Drop removes it removes, and the
 * objects it keeps are intact.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz-node.h"
#include "holder.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct config cfg;
static struct store *st;
static struct node *node;
static struct holder h;

static const char *const keys[] = { "k", "pre/a", "pre/b", "other" };

static void setup(void)
{
	static const struct holder_ops ops = { 0 };

	fuzz_node_config(&cfg);
	node = fuzz_node_start(&st, &cfg);
	holder_init(&h, st, &ops);
}

/* The objects a Drop may take: present again before each input. */
static void stock(void)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		struct put_args a = { .key = keys[i], .key_len = strlen(keys[i]), .len = 64 };
		char msg[STORE_MSG_MAX];
		struct extent e;

		if (store_find(st, keys[i], strlen(keys[i])))
			continue;
		if (store_reserve(&h, &a, &e, msg) < 0)
			abort();
		memset(store_extent_ptr(st, &e), (int) i, 64);
		if (store_commit(&h, e.handle, msg) < 0)
			abort();
	}
}

/* Whatever is still held has the bytes it was put with. */
static void check(void)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		struct object *o = store_find(st, keys[i], strlen(keys[i]));
		const uint8_t *p;

		if (!o)
			continue;
		p = store_object_ptr(o);
		for (int b = 0; b < 64; b++)
			if (o->len != 64 || p[b] != (uint8_t) i)
				abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];

	if (!node)
		setup();
	if (size > (256u << 10))
		return 0;
	stock();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	if (size && write(sv[1], data, size) != (ssize_t) size) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	shutdown(sv[1], SHUT_WR);
	node_feed_link(node, sv[0]); /* takes sv[0] */
	close(sv[1]);
	check();
	return 0;
}
