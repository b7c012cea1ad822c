/* SPDX-License-Identifier: MIT */
/*
 * Single-producer single-consumer rings over struct shm_ring.  Each side
 * keeps its own position privately and only publishes it; the other side's
 * position is read with acquire semantics and never trusted beyond "how many
 * entries may I touch", which is clamped to the ring size.
 *
 * Memory order: the producer writes entries, then stores tail with release;
 * the consumer loads tail with acquire, reads entries, then stores head with
 * release; the producer loads head with acquire before reusing an entry.
 * need_wakeup pairs a seq_cst store on the sleeper's side with a seq_cst
 * fence on the waker's side (Dekker): either the waker sees the flag, or the
 * sleeper's re-check sees the new entries.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "shm-layout.h"

struct ring_side {
	struct shm_ring *r;
	uint8_t *entries;
	uint32_t esize;
	uint32_t mask;
	uint32_t pos; /* private: tail for a producer, head for a consumer */
};

static inline void ring_side_init(struct ring_side *s, struct shm_ring *r, void *entries,
				  uint32_t esize, uint32_t n_entries, uint32_t pos)
{
	s->r = r;
	s->entries = entries;
	s->esize = esize;
	s->mask = n_entries - 1;
	s->pos = pos;
}

static inline void *ring_entry(const struct ring_side *s, uint32_t pos)
{
	return s->entries + (uint64_t) (pos & s->mask) * s->esize;
}

/* Producer: free entries.  A head beyond what is possible reads as full. */
static inline uint32_t ring_space(const struct ring_side *p)
{
	uint32_t head = __atomic_load_n(&p->r->head, __ATOMIC_ACQUIRE);
	uint32_t used = p->pos - head;

	return used > p->mask + 1 ? 0 : p->mask + 1 - used;
}

/* Producer: make the next n entries (written at ring_entry(p, p->pos + i))
 * visible. */
static inline void ring_publish(struct ring_side *p, uint32_t n)
{
	p->pos += n;
	__atomic_store_n(&p->r->tail, p->pos, __ATOMIC_RELEASE);
}

/* Consumer: entries ready, or -1 when the producer's tail is impossible
 * (more than a ring's worth ahead): the peer is broken or hostile. */
static inline int64_t ring_ready(const struct ring_side *c)
{
	uint32_t tail = __atomic_load_n(&c->r->tail, __ATOMIC_ACQUIRE);
	uint32_t n = tail - c->pos;

	return n > c->mask + 1 ? -1 : (int64_t) n;
}

/* Consumer: hand n entries back to the producer. */
static inline void ring_consume(struct ring_side *c, uint32_t n)
{
	c->pos += n;
	__atomic_store_n(&c->r->head, c->pos, __ATOMIC_RELEASE);
}

/* Sleeper: announce the intent to sleep; then re-check before sleeping. */
static inline void ring_set_need_wakeup(struct shm_ring *r, bool on)
{
	__atomic_store_n(&r->need_wakeup, on ? 1u : 0u, __ATOMIC_SEQ_CST);
}

/* Waker: after publishing, does the peer need a system call to notice? */
static inline bool ring_peer_sleeping(const struct shm_ring *r)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&r->need_wakeup, __ATOMIC_RELAXED) != 0;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}
