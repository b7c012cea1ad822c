/* SPDX-License-Identifier: MIT */
/*
 * Bounded blocking socket I/O, for threads that may wait (never a loop):
 * every call ends by an absolute deadline on the one clock (mono_us(),
 * clock.h: the clock the daemon's loop reads too).  Each returns 0
 * (or a count), -ETIMEDOUT at the deadline, -ECONNRESET when the peer is
 * gone, or another -errno.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"


/* fd ready for ev (POLLIN, POLLOUT) by deadline. */
int blk_wait(int fd, short ev, usec_t deadline);
int blk_set_blocking(int fd, bool on);
/* All of len, or an error: each system call bounded by what is left. */
int blk_send(int fd, const void *buf, size_t len, usec_t deadline);
int blk_recv(int fd, void *buf, size_t len, usec_t deadline);
/* This thread's receives poll for up to us without a byte before they
 * sleep (0: sleep at once).  Why: blocking.c. */
void blk_set_poll_window(usec_t us);

/*
 * A value's bytes travel in chunks of BLK_CHUNK with the checksum after
 * them (XXH3-64, 8 bytes, little-endian): each side hashes a chunk right
 * after its copy into or out of the kernel, while it is still in cache,
 * instead of a separate pass over the whole value (a cold pass cost the
 * sender as much as the send itself: 57 us against 35 us a 256 KiB chunk).
 */
#define BLK_CHUNK (256u << 10)

/*
 * How long a value's bytes may take once they move: silence, not size,
 * ends a transfer.  Each chunk must move within idle of the one before,
 * and the whole by cap: the deadline the transfer began under plus a
 * microsecond per byte (1 MB/s on average), so a 64 MiB value crosses a
 * slow, lossy link (14 MB/s) whole, and a stalled one ends idle after
 * its last byte.  What comes before the bytes (the connection, the
 * request, the answer's frame) is bounded by the deadline itself.
 */
struct blk_pace {
	usec_t idle;
	usec_t cap;
};

struct blk_pace blk_pace(usec_t idle, usec_t deadline, uint64_t len);
/* The deadline of the next chunk. */
usec_t blk_pace_next(const struct blk_pace *p);

/* The checksum of len bytes at p, in one pass (for RDMA, whose bytes no
 * copy of this process touches). */
int blk_sum(const uint8_t *p, uint64_t len, uint64_t *ret_sum);
/* len bytes and their checksum into dst, checked (-EBADMSG when they do
 * not match); the checksum into *ret_sum.  progress (or NULL): set to
 * word0 + the bytes in after each chunk (release: a reader that sees the
 * count sees the bytes). */
int blk_recv_checked(int fd, uint8_t *dst, uint64_t len, const struct blk_pace *pace,
		     uint64_t *ret_sum, uint64_t *progress, uint64_t word0);
/*
 * What a connection that carries answers one after another has read past
 * the one it was reading: the end of a value, its checksum and the next
 * answer's frame then come in with one system call instead of three.  A
 * few hundred bytes: the next value's first bytes that come along are
 * copied once more, out of here.
 */
#define BLK_RX_CAP 256u

struct blk_rx {
	uint8_t buf[BLK_RX_CAP];
	size_t off, end;
};

static inline void blk_rx_init(struct blk_rx *rx)
{
	rx->off = rx->end = 0;
}

/* Bytes read and not yet taken (a connection is in step with none). */
static inline size_t blk_rx_held(const struct blk_rx *rx)
{
	return rx->end - rx->off;
}

/* At least n bytes (at most BLK_RX_CAP) held in rx, at *ret; the caller
 * takes them with blk_rx_take(). */
int blk_rx_need(int fd, struct blk_rx *rx, size_t n, usec_t deadline, const uint8_t **ret);

static inline void blk_rx_take(struct blk_rx *rx, size_t n)
{
	rx->off += n;
}

/* blk_recv_checked() on a connection that may have read ahead into rx:
 * what rx holds first, and whatever comes along after the checksum into
 * rx. */
int blk_recv_checked_rx(int fd, struct blk_rx *rx, uint8_t *dst, uint64_t len,
			const struct blk_pace *pace, uint64_t *ret_sum, uint64_t *progress,
			uint64_t word0);
/* len bytes of src and their checksum: known, taken before (nothing to
 * hash), or computed into *ret_sum; corrupt (tests) flips the first byte. */
int blk_send_checked(int fd, const uint8_t *src, uint64_t len, const struct blk_pace *pace,
		     bool corrupt, const uint64_t *known, uint64_t *ret_sum);
/* The same with head_len bytes of head (the frame that announces them)
 * in the same system call as the first chunk. */
int blk_send_framed(int fd, const void *head, size_t head_len, const uint8_t *src, uint64_t len,
		    const struct blk_pace *pace, bool corrupt, const uint64_t *known,
		    uint64_t *ret_sum);
