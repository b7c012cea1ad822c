/* SPDX-License-Identifier: MIT */
/* A master fed whatever a peer may send on one connection: frames in any
 * order (Publish before Join, Lookups of huge batches, Auth without Hello),
 * against the same long-lived master, as kvcache-master reads them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz-socket.h"
#include "log.h"
#include "loop.h"
#include "master.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct loop *l;
static struct master *m;

static void feed(void *ctx, int fd)
{
	master_feed(ctx, fd); /* takes fd */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!m) {
		struct master_config cfg = { .client_ttl_s = 10 };

		log_configure("error");
		snprintf(cfg.listen.host, sizeof(cfg.listen.host), "127.0.0.1");
		if (loop_new(0, &l) < 0 || master_new(l, &cfg, &m) < 0)
			abort();
	}
	if (size > (64u << 10))
		return 0;
	fuzz_feed_socket(data, size, feed, m);
	return 0;
}
