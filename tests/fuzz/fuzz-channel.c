/* SPDX-License-Identifier: MIT */
/*
 * The daemon's handling of descriptors a client writes into its ring.  An
 * in-process daemon core (a 4 MiB dram tier, the index, one session with a
 * channel and a registered buffer) runs whatever descriptors and arena bytes
 * the input holds, exactly as channel_poll_all() does for a real client.
 *
 * Input: [u8 n][n x 64-byte descriptors][arena bytes...]
 */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "ring.h"
#include "buffer.h"
#include "channel.h"
#include "copier.h"
#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct config cfg;
static struct store *st;
static struct server srv = { .cfg = &cfg };
static uint8_t *chan;
static struct ring_side sq, cq;

static void setup(void)
{
	int sv[2], fds[2], bfd;
	uint64_t h;
	char msg[STORE_MSG_MAX];
	void *p;

	config_init(&cfg);
	cfg.dram_size = 4 << 20;
	cfg.hugepages = SHM_HUGEPAGES_OFF;
	cfg.prefault = SHM_HUGEPAGES_OFF;
	/* a lookup waiting for a put in flight would be answered in a later
	 * input (the loop's clock never moves here): test-channel covers it */
	cfg.lookup_wait_ms = 0;
	log_configure("error");
	/* a loop that never runs: channels and sessions register with it */
	if (loop_new(0, &srv.loop) < 0 || store_new(&cfg, srv.loop, -1, &st) < 0)
		abort();
	srv.st = st;
	if (channel_init(&srv) < 0)
		abort();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	if (session_new(&srv, sv[0]) < 0)
		abort();
	if (channel_open(srv.sessions, fds, msg) < 0)
		abort();
	/* the handle a well-behaved client would name: generation 1, slot 1 */
	if (buffer_create(srv.sessions, 1 << 20, &h, &bfd, msg) < 0)
		abort();
	p = mmap(NULL, SHM_CHAN_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p == MAP_FAILED)
		abort();
	chan = p;
	ring_side_init(&sq, (struct shm_ring *) (chan + SHM_CHAN_SQ_OFF), chan + SHM_CHAN_SQES_OFF,
		       sizeof(struct shm_sqe), SHM_CHAN_ENTRIES, 0);
	ring_side_init(&cq, (struct shm_ring *) (chan + SHM_CHAN_CQ_OFF), chan + SHM_CHAN_CQES_OFF,
		       sizeof(struct shm_cqe), SHM_CHAN_ENTRIES, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t n, arena_len;
	int64_t ready;

	if (!chan)
		setup();
	if (size < 1)
		return 0;
	n = data[0] % 17;
	if (size < 1 + n * sizeof(struct shm_sqe))
		return 0;
	for (size_t i = 0; i < n; i++)
		memcpy(ring_entry(&sq, sq.pos + (uint32_t) i), data + 1 + i * sizeof(struct shm_sqe),
		       sizeof(struct shm_sqe));
	arena_len = size - 1 - n * sizeof(struct shm_sqe);
	if (arena_len > 65536)
		arena_len = 65536;
	memcpy(chan + SHM_CHAN_ARENA_OFF, data + 1 + n * sizeof(struct shm_sqe), arena_len);
	ring_publish(&sq, (uint32_t) n);
	/* as the loop would, round after round: a round takes a bounded
	 * number of requests and keys */
	for (int round = 0; round < 64 && __atomic_load_n(&sq.r->head, __ATOMIC_ACQUIRE) != sq.pos;
	     round++)
		channel_poll_all(&srv);
	copier_settle(&srv); /* large copies end on the copier, answered here */
	/* every descriptor was consumed, and completions stay in bounds */
	if (__atomic_load_n(&sq.r->head, __ATOMIC_ACQUIRE) != sq.pos)
		__builtin_trap();
	ready = ring_ready(&cq);
	if (ready < 0 || ready > (int64_t) n)
		__builtin_trap();
	ring_consume(&cq, (uint32_t) ready);
	return 0;
}
