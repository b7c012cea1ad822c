/* SPDX-License-Identifier: MIT */
/* Fuzzers that play a peer: the input as everything one connection sends,
 * then the hang-up. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* Write data into one end of a socket pair, shut it for writing, and hand
 * the other end to feed(ctx, fd), which takes it. */
static inline void fuzz_feed_socket(const uint8_t *data, size_t size, void (*feed)(void *, int),
				    void *ctx)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return;
	if (size && write(sv[1], data, size) != (ssize_t) size) {
		close(sv[0]);
		close(sv[1]);
		return;
	}
	shutdown(sv[1], SHUT_WR);
	feed(ctx, sv[0]);
	close(sv[1]);
}
