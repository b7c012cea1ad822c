/* SPDX-License-Identifier: MIT */
/*
 * Bounded blocking socket I/O, for threads that may wait (never a loop):
 * every call ends by an absolute deadline on the one clock (mono_us()),
 * and a value's bytes travel in checksummed chunks.
 */
#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>

#include "blocking.h"
#include "clock.h"
#include "checksum.h"


/* Wait for fd to be ready until deadline: 0, -ETIMEDOUT or -errno. */
int blk_wait(int fd, short ev, usec_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = ev };
		usec_t now = mono_us(), left;
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		/* poll() counts ms: rounded up, not to spin through the last one */
		left = (deadline - now + USEC_PER_MSEC - 1) / USEC_PER_MSEC;
		r = poll(&p, 1, left < INT_MAX ? (int) left : INT_MAX);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/* The socket blocks in the calls below (the kernel fills a whole
 * destination per call: fewer wake-ups than polling), each call bounded by
 * what is left until the deadline. */
int blk_set_blocking(int fd, bool on)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -errno;
	fl = on ? fl & ~O_NONBLOCK : fl | O_NONBLOCK;
	return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

static int bound(int fd, int opt, usec_t deadline)
{
	usec_t now = mono_us(), left;
	struct timeval tv;

	if (now >= deadline)
		return -ETIMEDOUT;
	left = deadline - now; /* not 0: a timeval of 0 is no bound at all */
	tv.tv_sec = (time_t) (left / USEC_PER_SEC);
	tv.tv_usec = (suseconds_t) (left % USEC_PER_SEC);
	return setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv)) < 0 ? -errno : 0;
}

/* All of iov[0..n) (advanced as it goes), each system call bounded by
 * what is left of deadline; flags as for sendmsg() (MSG_MORE). */
static int send_iov(int fd, struct iovec *iov, int n, int flags, usec_t deadline)
{
	while (n && !iov->iov_len) {
		iov++;
		n--;
	}
	while (n) {
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t) n };
		ssize_t k;
		int r = bound(fd, SO_SNDTIMEO, deadline);

		if (r < 0)
			return r;
		k = sendmsg(fd, &mh, flags | MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return -ETIMEDOUT;
		if (k <= 0)
			return k < 0 ? (errno == EPIPE ? -ECONNRESET : -errno) : -ECONNRESET;
		while (n && (size_t) k >= iov->iov_len) {
			k -= (ssize_t) iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *) iov->iov_base + k;
			iov->iov_len -= (size_t) k;
		}
	}
	return 0;
}

int blk_send(int fd, const void *buf, size_t len, usec_t deadline)
{
	struct iovec iov = { (void *) buf, len };

	return send_iov(fd, &iov, 1, 0, deadline);
}

/*
 * A data thread waiting for bytes it asked for (an answer, the rest of a
 * value) polls its socket first, yielding its CPU between polls, until
 * poll_window_us pass without a byte; only then does it sleep in the
 * kernel.  A receiver asleep in recv() is woken for every few dozen KiB
 * that arrive, and the kernel tends to run the woken thread on the CPU
 * that took the bytes in: where both ends share a host, the sender's own.
 * The two then take turns on one CPU while the other idles.  On the
 * two-CPU bench host a sleeping receiver fetched 1 MiB values one at a
 * time at 1.05-1.12 GB/s (a median of 790-840 us each), a polling one at
 * 1.98-2.36 GB/s (310-360 us): see docs/cluster.rst.  Yielding keeps the
 * CPU for anything else that wants it (the loop, a local client, the
 * sender), so polling costs only time the CPU would have idled.  Per
 * thread (blk_set_poll_window(): the cluster's data threads set it from
 * --poll-us); a thread that sets nothing sleeps at once.
 */
static __thread usec_t poll_window_us;

void blk_set_poll_window(usec_t us)
{
	poll_window_us = us;
}

/* A peer that sends a byte now and then keeps a poller busy: one call
 * polls at most this long in all (a 256 KiB chunk that takes longer came
 * at under 13 MB/s), then sleeps between arrivals. */
#define POLL_MAX_US 20000

/* Poll for up to len bytes into p until poll_window_us pass without any,
 * POLL_MAX_US pass in all or deadline comes: the bytes taken, or -errno
 * (-EAGAIN: none came).  The same system calls take what comes after p's
 * bytes into the room bytes at extra; *came says how many. */
static ssize_t recv_polled(int fd, uint8_t *p, size_t len, uint8_t *extra, size_t room,
			   size_t *came, usec_t deadline)
{
	uint64_t start = mono_us(), last = start;
	size_t got = 0;

	while (got < len) {
		struct iovec iov[2] = { { p + got, len - got }, { extra, room } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = room ? 2 : 1 };
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
		uint64_t now;

		if (n > 0) {
			if ((size_t) n > len - got) {
				*came = (size_t) n - (len - got);
				got = len;
			} else {
				got += (size_t) n;
			}
			last = mono_us();
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		now = mono_us();
		if (now - last >= poll_window_us || now - start >= POLL_MAX_US ||
		    now >= deadline)
			break;
		sched_yield();
	}
	return got ? (ssize_t) got : -EAGAIN;
}

/* blk_recv(), and as recv_polled() what comes along into extra while it
 * polls (a thread that sleeps reads p's bytes alone); *came: how many. */
static int recv_ahead(int fd, uint8_t *p, size_t len, uint8_t *extra, size_t room,
		      size_t *came, usec_t deadline)
{
	*came = 0;
	if (poll_window_us && len) {
		ssize_t n = recv_polled(fd, p, len, extra, room, came, deadline);

		if (n < 0 && n != -EAGAIN)
			return (int) n;
		if (n > 0) {
			p += n;
			len -= (size_t) n;
		}
	}
	while (len) {
		ssize_t n;
		int r = bound(fd, SO_RCVTIMEO, deadline);

		if (r < 0)
			return r;
		n = recv(fd, p, len, MSG_WAITALL);
		if (n > 0) {
			p += n;
			len -= (size_t) n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -ETIMEDOUT;
		return -errno;
	}
	return 0;
}

int blk_recv(int fd, void *buf, size_t len, usec_t deadline)
{
	size_t came;

	return recv_ahead(fd, buf, len, NULL, 0, &came, deadline);
}

int blk_rx_need(int fd, struct blk_rx *rx, size_t n, usec_t deadline, const uint8_t **ret)
{
	size_t held = blk_rx_held(rx), came;
	int r;

	if (n > BLK_RX_CAP)
		return -EPROTO;
	if (held < n) {
		memmove(rx->buf, rx->buf + rx->off, held);
		rx->off = 0;
		r = recv_ahead(fd, rx->buf + held, n - held, rx->buf + n, BLK_RX_CAP - n, &came,
			       deadline);
		if (r < 0)
			return r;
		rx->end = n + came;
	}
	*ret = rx->buf + rx->off;
	return 0;
}

/* len bytes into p: what rx holds first, then from fd, reading ahead
 * into rx (NULL: blk_recv()). */
static int recv_rx(int fd, struct blk_rx *rx, uint8_t *p, size_t len, usec_t deadline)
{
	size_t k, came;
	int r;

	if (!rx)
		return blk_recv(fd, p, len, deadline);
	k = blk_rx_held(rx) < len ? blk_rx_held(rx) : len;
	memcpy(p, rx->buf + rx->off, k);
	rx->off += k;
	if (k == len)
		return 0;
	rx->off = rx->end = 0;
	r = recv_ahead(fd, p + k, len - k, rx->buf, BLK_RX_CAP, &came, deadline);
	if (r == 0)
		rx->end = came;
	return r;
}

struct blk_pace blk_pace(usec_t idle, usec_t deadline, uint64_t len)
{
	usec_t now = mono_us();

	return (struct blk_pace) { .idle = idle, .cap = (deadline > now ? deadline : now) + len };
}

/* The deadline of the next chunk. */
usec_t blk_pace_next(const struct blk_pace *p)
{
	usec_t d = mono_us() + p->idle;

	return d < p->cap ? d : p->cap;
}

/* The checksum of len bytes at p, in one pass (the RDMA paths, which
 * cannot hash as the kernel copies). */
int blk_sum(const uint8_t *p, uint64_t len, uint64_t *ret_sum)
{
	struct csum *h = csum_new();

	if (!h)
		return -ENOMEM;
	csum_update(h, p, len);
	*ret_sum = csum_digest(h);
	csum_free(h);
	return 0;
}

int blk_recv_checked(int fd, uint8_t *dst, uint64_t len, const struct blk_pace *pace,
			uint64_t *ret_sum, uint64_t *progress, uint64_t word0)
{
	return blk_recv_checked_rx(fd, NULL, dst, len, pace, ret_sum, progress, word0);
}

int blk_recv_checked_rx(int fd, struct blk_rx *rx, uint8_t *dst, uint64_t len,
			const struct blk_pace *pace, uint64_t *ret_sum, uint64_t *progress,
			uint64_t word0)
{
	struct csum *h = csum_new();
	uint64_t want;
	uint8_t tail[8];
	const uint8_t *t = tail;
	int r = h ? 0 : -ENOMEM;

	for (uint64_t off = 0; r == 0 && off < len; off += BLK_CHUNK) {
		size_t n = len - off < BLK_CHUNK ? (size_t) (len - off) : BLK_CHUNK;

		r = recv_rx(fd, rx, dst + off, n, blk_pace_next(pace));
		if (r == 0 && progress)
			__atomic_store_n(progress, word0 + off + n, __ATOMIC_RELEASE);
		if (r == 0)
			csum_update(h, dst + off, n);
	}
	if (r == 0 && rx) {
		r = blk_rx_need(fd, rx, sizeof(tail), blk_pace_next(pace), &t);
		if (r == 0)
			blk_rx_take(rx, sizeof(tail));
	} else if (r == 0) {
		r = blk_recv(fd, tail, sizeof(tail), blk_pace_next(pace));
	}
	if (r == 0) {
		memcpy(&want, t, sizeof(want));
		if (csum_digest(h) != le64toh(want))
			r = -EBADMSG;
		else
			*ret_sum = le64toh(want);
	}
	csum_free(h);
	return r;
}

/* known: the checksum of src, taken before (nothing to hash); else the
 * one computed goes to *ret_sum. */
int blk_send_checked(int fd, const uint8_t *src, uint64_t len, const struct blk_pace *pace,
		     bool corrupt, const uint64_t *known, uint64_t *ret_sum)
{
	return blk_send_framed(fd, NULL, 0, src, len, pace, corrupt, known, ret_sum);
}

int blk_send_framed(int fd, const void *head, size_t head_len, const uint8_t *src, uint64_t len,
		    const struct blk_pace *pace, bool corrupt, const uint64_t *known,
		    uint64_t *ret_sum)
{
	struct csum *h = known ? NULL : csum_new();
	uint64_t sum;
	int r = h || known ? 0 : -ENOMEM;

	for (uint64_t off = 0; r == 0 && off < len; off += BLK_CHUNK) {
		size_t n = len - off < BLK_CHUNK ? (size_t) (len - off) : BLK_CHUNK;
		/* tests: the first byte arrives flipped */
		uint8_t first = src[0] ^ 0xff;
		bool flip = corrupt && off == 0;
		struct iovec iov[3] = {
			{ (void *) head, off == 0 ? head_len : 0 },
			{ flip ? &first : (void *) (src + off), flip ? 1 : n },
			{ (void *) (src + off + 1), flip ? n - 1 : 0 },
		};

		/* more follows (the checksum at least): only full segments
		 * leave, and the frame, the bytes and the checksum arrive
		 * together instead of a small segment ahead of the rest */
		r = send_iov(fd, iov, 3, MSG_MORE, blk_pace_next(pace));
		/* after the send: the kernel's copy brought the chunk into
		 * cache, where hashing it costs a fifth of reading it cold
		 * (values that were put long ago are in no cache) */
		if (h)
			csum_update(h, src + off, n);
	}
	if (r == 0 && !len && head_len)
		r = blk_send(fd, head, head_len, blk_pace_next(pace));
	if (r == 0) {
		sum = known ? *known : csum_digest(h);
		if (!known)
			*ret_sum = sum;
		sum = htole64(sum);
		r = blk_send(fd, &sum, sizeof(sum), blk_pace_next(pace));
	}
	csum_free(h);
	return r;
}
