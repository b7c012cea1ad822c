/* SPDX-License-Identifier: MIT */
/*
 * A node's fetching side fed whatever a holder may answer: an in-process
 * node (a 4 MiB dram tier, no master reachable) asks a "holder" on a
 * loopback port for four keys at once (one connection, the fetches asked
 * for ahead), and the holder answers with the input, then hangs up.  The
 * answers may lie about sequence numbers, lengths, errors, RDMA places and
 * checksums, stop half-way or run on; any connection the node opens after
 * that is hung up at once.  Every fetch must end (within the node's
 * timeout), and a key may be held afterwards only if its bytes are exactly
 * those the holder sent with their checksum.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "fuzz-node.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KEYS 4
#define MAX_CONNS 32

static const char *const keys[KEYS] = { "f0", "f1", "f2", "f3" };
/* a small one, one the holder's loop would send whole, one of more than a
 * 256 KiB chunk, a single byte */
static const uint64_t lens[KEYS] = { 100, 70000, 300000, 1 };

static struct config cfg;
static struct store *st;
static struct node *node;
static int lfd = -1;
static char address[64];

struct peer {
	const uint8_t *data;
	size_t size, sent;
	bool shut;                 /* the first connection has all of it */
	int conns[MAX_CONNS];
	unsigned n_conns;
};

static void setup(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);

	fuzz_node_config(&cfg);
	cfg.remote_timeout_ms = 200; /* an answer that never comes ends soon */
	cfg.data_streams = 1;        /* one thread asks for all four at once */
	node = fuzz_node_start(&st, &cfg);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(lfd, 64) < 0 ||
	    getsockname(lfd, (struct sockaddr *) &sa, &sl) < 0)
		abort();
	snprintf(address, sizeof(address), "127.0.0.1:%u", ntohs(sa.sin_port));
}

/* The holder: the first connection gets the input (as the socket takes
 * it), then the end of the stream; later ones are hung up at once.  What
 * the node sends is read and dropped. */
static void tick(void *u)
{
	struct peer *p = u;
	uint8_t sink[4096];
	int fd;

	while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		if (p->n_conns == MAX_CONNS) {
			close(fd);
			continue;
		}
		if (p->n_conns)
			shutdown(fd, SHUT_WR);
		p->conns[p->n_conns++] = fd;
	}
	for (unsigned i = 0; i < p->n_conns; i++)
		while (read(p->conns[i], sink, sizeof(sink)) > 0)
			;
	if (p->n_conns && !p->shut) {
		ssize_t n = p->sent < p->size ?
				    write(p->conns[0], p->data + p->sent, p->size - p->sent) : 0;

		if (n > 0)
			p->sent += (size_t) n;
		else if (n < 0 && errno != EAGAIN)
			p->sent = p->size;
		if (p->sent == p->size) {
			shutdown(p->conns[0], SHUT_WR);
			p->shut = true;
		}
	}
}

/* A key the node holds after the input: the length asked for, and bytes
 * that match the checksum they were checked against; then it goes, for
 * the next input. */
static void check(const char *key, uint64_t len)
{
	struct object *o = store_find(st, key, strlen(key));
	char msg[STORE_MSG_MAX];

	if (!o)
		return;
	if (o->len != len || !(o->flags & OBJ_SUMMED) || !o->block ||
	    XXH3_64bits(store_object_ptr(o), len) != o->sum) {
		fprintf(stderr, "%s held with %llu bytes that do not match their checksum\n", key,
			(unsigned long long) o->len);
		abort();
	}
	if (store_remove(st, key, strlen(key), true, false, msg) < 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct peer p = { .data = data, .size = size };
	bool got[KEYS];

	if (!node)
		setup();
	if (size > (1u << 20))
		return 0;
	node_fetch_all(node, keys, lens, KEYS, address, tick, &p, got);
	for (unsigned i = 0; i < KEYS; i++)
		if (got[i])
			check(keys[i], lens[i]);
	for (unsigned i = 0; i < p.n_conns; i++)
		close(p.conns[i]);
	return 0;
}
