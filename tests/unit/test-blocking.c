/* SPDX-License-Identifier: MIT */
/* Answers read one after another on one connection (net/blocking.h): a
 * frame, its payload, a value and its checksum, with what a receive reads
 * past one answer kept for the next; bytes, checksums and the stream's
 * step checked, however the sender's writes fall. */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blocking.h"
#include "helpers.h"

#define HEAD 16u
#define N_ANSWERS 40

struct answer {
	uint8_t head[HEAD];
	size_t small_len;
	uint8_t small[200];
	uint64_t len;
	uint8_t *value;
	uint64_t sum;
	bool bad_sum; /* the checksum sent is not the value's */
};

static struct answer answers[N_ANSWERS];

struct writer {
	int fd;
	size_t piece; /* bytes a write (0: the whole stream at once) */
	size_t stop_after; /* close after this many bytes (0: never) */
	uint8_t *stream;
	size_t len;
};

static void *write_all(void *arg)
{
	struct writer *w = arg;
	size_t off = 0, end = w->stop_after ? w->stop_after : w->len, writes = 0;

	while (off < end) {
		size_t k = w->piece && w->piece < end - off ? w->piece : end - off;
		ssize_t n = write(w->fd, w->stream + off, k);

		if (n <= 0)
			break;
		off += (size_t) n;
		if (w->piece && ++writes % 16 == 0)
			usleep(20); /* now and then the reader catches up */
	}
	shutdown(w->fd, SHUT_WR);
	return NULL;
}

static void make_answers(void)
{
	static const uint64_t lens[] = { 0, 1, 7, 8, 100, 4096, 65536, 65536 + 3,
					 BLK_CHUNK, BLK_CHUNK + 1, 600u << 10 };
	uint64_t seed = 7;

	for (unsigned i = 0; i < N_ANSWERS; i++) {
		struct answer *a = &answers[i];

		for (unsigned k = 0; k < HEAD; k++)
			a->head[k] = (uint8_t) (i * 31 + k);
		a->small_len = (size_t) (i * 37 % sizeof(a->small));
		for (size_t k = 0; k < a->small_len; k++)
			a->small[k] = (uint8_t) test_rand(&seed);
		a->len = lens[i % (sizeof(lens) / sizeof(lens[0]))];
		a->value = malloc(a->len + 1);
		CHECK(a->value);
		for (uint64_t k = 0; k < a->len; k++)
			a->value[k] = (uint8_t) test_rand(&seed);
		CHECK(blk_sum(a->value, a->len, &a->sum) == 0);
		a->bad_sum = i % 9 == 4;
	}
}

static uint8_t *stream_of(size_t *ret_len)
{
	size_t len = 0, off = 0;
	uint8_t *s;

	for (unsigned i = 0; i < N_ANSWERS; i++)
		len += HEAD + answers[i].small_len + answers[i].len + 8;
	s = malloc(len);
	CHECK(s);
	for (unsigned i = 0; i < N_ANSWERS; i++) {
		const struct answer *a = &answers[i];
		uint64_t sum = htole64(a->sum ^ (a->bad_sum ? 1 : 0));

		memcpy(s + off, a->head, HEAD);
		off += HEAD;
		memcpy(s + off, a->small, a->small_len);
		off += a->small_len;
		memcpy(s + off, a->value, a->len);
		off += a->len;
		memcpy(s + off, &sum, 8);
		off += 8;
	}
	*ret_len = len;
	return s;
}

/* Read every answer as the fetching side does; the first error, or 0. */
static int read_answers(int fd, bool expect_all)
{
	struct blk_rx rx;
	uint8_t *dst = malloc((600u << 10) + 1); /* the largest value */
	uint64_t word = 0;
	int r = 0;

	CHECK(dst);
	blk_rx_init(&rx);
	for (unsigned i = 0; i < N_ANSWERS; i++) {
		const struct answer *a = &answers[i];
		usec_t deadline = mono_us() + 5 * USEC_PER_SEC;
		struct blk_pace pace = blk_pace(5 * USEC_PER_SEC, deadline, a->len);
		const uint8_t *p;
		uint64_t sum = 0;

		r = blk_rx_need(fd, &rx, HEAD, deadline, &p);
		if (r < 0)
			break;
		CHECK(!memcmp(p, a->head, HEAD));
		blk_rx_take(&rx, HEAD);
		r = blk_rx_need(fd, &rx, a->small_len, deadline, &p);
		if (r < 0)
			break;
		CHECK(!memcmp(p, a->small, a->small_len));
		blk_rx_take(&rx, a->small_len);
		r = blk_recv_checked_rx(fd, &rx, dst, a->len, &pace, &sum, &word, 1000);
		if (a->bad_sum) {
			/* a damaged value: said so, and the stream stays in step */
			CHECK(r == -EBADMSG);
			r = 0;
		} else if (r < 0) {
			break;
		} else {
			CHECK(sum == a->sum);
		}
		CHECK(!memcmp(dst, a->value, a->len));
		CHECK(word == 1000 + a->len || a->len == 0);
	}
	if (r == 0 && expect_all)
		CHECK(blk_rx_held(&rx) == 0);
	free(dst);
	return r;
}

static void run(size_t piece, usec_t poll, size_t stop_after, int want)
{
	int sv[2];
	pthread_t th;
	struct writer w = { .piece = piece, .stop_after = stop_after };

	w.stream = stream_of(&w.len);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	w.fd = sv[1];
	blk_set_poll_window(poll);
	CHECK(pthread_create(&th, NULL, write_all, &w) == 0);
	CHECK(read_answers(sv[0], want == 0) == want);
	pthread_join(th, NULL);
	close(sv[0]);
	close(sv[1]);
	free(w.stream);
}

int main(void)
{
	const uint8_t *p;
	struct blk_rx rx;

	make_answers();
	/* the whole stream at once: receives read past each answer */
	run(0, 1000, 0, 0);
	/* in small pieces: answers and their parts split anywhere */
	run(4093, 1000, 0, 0);
	run(61, 200, 0, 0);
	/* a thread that sleeps at once reads nothing ahead */
	run(0, 0, 0, 0);
	/* the sender goes away within an answer: a reset, not a hang */
	run(0, 1000, HEAD + answers[0].small_len + 8 + HEAD + 3, -ECONNRESET);
	run(0, 0, 5000, -ECONNRESET);

	/* more than rx can hold is a protocol error */
	blk_rx_init(&rx);
	CHECK(blk_rx_need(-1, &rx, BLK_RX_CAP + 1, mono_us() + USEC_PER_SEC, &p) == -EPROTO);

	for (unsigned i = 0; i < N_ANSWERS; i++)
		free(answers[i].value);
	return 0;
}
