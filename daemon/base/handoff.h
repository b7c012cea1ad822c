/* SPDX-License-Identifier: MIT */
/*
 * Handing work between the loop and its helper threads without a lock.
 *
 * A mutex shared with a helper thread can make the loop wait for as long as
 * the helper is preempted while holding it: on a busy two-core machine the
 * loop was seen waiting 0.3-3.7 ms for the disk worker's queue lock.  So
 * lists cross threads as lock-free stacks: any thread pushes one item,
 * one consumer takes them all at once (newest first), and a thread that
 * sleeps for work waits on a futex word the pusher bumps.
 */
#ifndef KVC_HANDOFF_H
#define KVC_HANDOFF_H

#include <linux/futex.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

/* Push item onto the stack at *head through its `field` pointer: true if
 * the stack was empty. */
#define handoff_push(head, item, field)                                                     \
	({                                                                                  \
		__typeof__(*(head)) old_ = __atomic_load_n((head), __ATOMIC_RELAXED);       \
		do                                                                          \
			(item)->field = old_;                                               \
		while (!__atomic_compare_exchange_n((head), &old_, (item), true,            \
						    __ATOMIC_RELEASE, __ATOMIC_RELAXED));   \
		old_ == NULL;                                                               \
	})

/* Everything on the stack, newest first (one consumer). */
#define handoff_take(head) __atomic_exchange_n((head), NULL, __ATOMIC_ACQUIRE)

/* Everything on the stack, oldest first (one consumer). */
#define handoff_take_fifo(head, field)                                                      \
	({                                                                                  \
		__typeof__(*(head)) l_ = handoff_take(head), f_ = NULL;                     \
		while (l_) {                                                                \
			__typeof__(l_) n_ = l_->field;                                      \
			l_->field = f_;                                                     \
			f_ = l_;                                                            \
			l_ = n_;                                                            \
		}                                                                           \
		f_;                                                                         \
	})

/* A helper thread that finished item: onto the stack at *head, and a loop
 * asleep is woken through efd (an eventfd in its set) when the stack was
 * empty.  Never blocks. */
#define handoff_push_wake(head, item, field, efd)                                           \
	do {                                                                                \
		uint64_t one_ = 1;                                                          \
		if (handoff_push(head, item, field) && write(efd, &one_, sizeof(one_)) < 0) { \
			/* the counter is full: the loop is awake anyway */                 \
		}                                                                           \
	} while (0)

/* The loop: what helpers pushed with handoff_push_wake(), newest first
 * (NULL: nothing), the eventfd drained. */
#define handoff_collect(head, efd)                                                          \
	({                                                                                  \
		__typeof__(*(head)) c_ = NULL;                                              \
		if (__atomic_load_n((head), __ATOMIC_RELAXED)) {                            \
			uint64_t v_;                                                        \
			if (read(efd, &v_, sizeof(v_)) < 0) {                               \
				/* nothing rang: fine */                                    \
			}                                                                   \
			c_ = handoff_take(head);                                            \
		}                                                                           \
		c_;                                                                         \
	})

/* A word a thread sleeps on until someone rings it. */
struct handoff_bell {
	uint32_t seq;
};

/* Read before looking for work; then sleep with what it said. */
static inline uint32_t handoff_bell_seq(struct handoff_bell *b)
{
	return __atomic_load_n(&b->seq, __ATOMIC_ACQUIRE);
}

/* Sleep unless the bell rang since seq was read (at most timeout, 0: no
 * limit). */
static inline void handoff_bell_wait(struct handoff_bell *b, uint32_t seq, usec_t timeout)
{
	struct timespec ts = { (time_t) (timeout / USEC_PER_SEC),
			       (long) (timeout % USEC_PER_SEC * NSEC_PER_USEC) };

	syscall(SYS_futex, &b->seq, FUTEX_WAIT_PRIVATE, seq, timeout ? &ts : NULL, NULL, 0);
}

/* Wake one sleeper; never blocks. */
static inline void handoff_bell_ring(struct handoff_bell *b)
{
	__atomic_add_fetch(&b->seq, 1, __ATOMIC_RELEASE);
	syscall(SYS_futex, &b->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* A helper thread: the work queued at *head, oldest first, sleeping on
 * bell until some comes; NULL once *stop is set and nothing is left.  The
 * flag is read before the queue, so what was queued before the stop is
 * still returned. */
#define handoff_wait_fifo(head, field, bell, stop)                                          \
	({                                                                                  \
		__typeof__(*(head)) w_;                                                     \
		for (;;) {                                                                  \
			uint32_t seq_ = handoff_bell_seq(bell);                             \
			bool stopping_ = __atomic_load_n((stop), __ATOMIC_ACQUIRE);         \
			w_ = handoff_take_fifo(head, field);                                \
			if (w_ || stopping_)                                                \
				break;                                                      \
			handoff_bell_wait(bell, seq_, 0);                                   \
		}                                                                           \
		w_;                                                                         \
	})

/* A helper thread that works in rounds, pauses between them, and ends
 * when asked (the etcd threads: membership, the master view, the
 * election).  Its pauses end early when it is asked to stop. */
struct handoff_thread {
	pthread_t th;
	bool stop; /* atomic */
	struct handoff_bell bell;
};

static inline int handoff_thread_start(struct handoff_thread *t, void *(*fn)(void *), void *arg)
{
	return -pthread_create(&t->th, NULL, fn, arg);
}

static inline bool handoff_thread_stopping(struct handoff_thread *t)
{
	return __atomic_load_n(&t->stop, __ATOMIC_ACQUIRE);
}

/* At most timeout (0: no limit); not at all once asked to stop. */
static inline void handoff_thread_pause(struct handoff_thread *t, usec_t timeout)
{
	uint32_t seq = handoff_bell_seq(&t->bell);

	if (!handoff_thread_stopping(t))
		handoff_bell_wait(&t->bell, seq, timeout);
}

/* Ask it to stop, and wait for it (its round's calls are bounded). */
static inline void handoff_thread_stop(struct handoff_thread *t)
{
	__atomic_store_n(&t->stop, true, __ATOMIC_RELEASE);
	handoff_bell_ring(&t->bell);
	pthread_join(t->th, NULL);
}

#endif
