/* SPDX-License-Identifier: MIT */
#pragma once

#include <pthread.h>

#include "clock.h"
#include "kvcache/kvcache.h"
#include "ring.h"
#include "shmem.h"
#include "wire.h"

#define MAX_SEGMENTS WIRE_MAX_FDS
#define CHAN_TAGS SHM_CHAN_ENTRIES
/* user_data of descriptors that want no completion (a failure still posts
 * one, which the reaper counts and drops) */
#define CHAN_NO_TAG UINT64_MAX

enum tag_state {
	TAG_FREE,
	TAG_SYNC,  /* a thread waits for it */
	TAG_ASYNC, /* goes to the completion queue for kvc_poll/kvc_wait */
	TAG_DONE,
};

struct tag {
	uint32_t state;      /* enum tag_state, atomic */
	uint64_t user_data;  /* async: the caller's */
	struct shm_cqe cqe;  /* valid once DONE (or queued) */
	/* SHM_CQE_MORE completions taken for it (atomic), and the last
	 * (cq_lock) */
	uint32_t more_seq;
	struct shm_cqe more;
};

/* The client's half of a channel. */
struct chan {
	uint8_t *base;
	uint8_t *arena;
	int efd;                 /* rings the daemon when it sleeps */
	struct ring_side sq, cq;
	pthread_mutex_t sq_lock; /* producers, and the free tag stack */
	pthread_mutex_t cq_lock; /* the reaper */
	uint32_t waiters;        /* threads asleep on cq.futex, atomic */
	uint32_t features;       /* the daemon's SHM_CHAN_FEAT_* */
	bool lazy;               /* published without a ring since (sq_lock) */
	uint32_t free_tags[CHAN_TAGS];
	uint32_t n_free;
	struct tag tags[CHAN_TAGS];
	/* async completions not yet handed out, by tag (cq_lock) */
	uint32_t done_q[CHAN_TAGS];
	uint32_t done_head, done_tail;
	uint64_t dropped_errors;
	/* kvc_completion_fd(): an eventfd kept readable, by a helper thread,
	 * while async completions wait to be reaped (cfd_lock) */
	pthread_mutex_t cfd_lock;
	pthread_cond_t cfd_cond;
	int cfd;
	bool cfd_signalled, cfd_stop, cfd_running;
	pthread_t cfd_thread;
};

struct kvc_client {
	int fd;
	bool broken;
	uint32_t get_flags; /* enum kvc_get_flags, atomic */
	pthread_mutex_t lock; /* one socket request/response in flight at a time */
	/* views let go without waiting for the daemon (kvc_get, batch loads),
	 * and how many of those it had taken in at the last settle (atomic):
	 * see client_settle() */
	uint64_t let_go, let_go_settled;
	uint32_t seq;
	uint64_t client_id;
	uint64_t max_value;
	size_t n_segs;
	struct shm_segment segs[MAX_SEGMENTS];
	struct chan chan;
	/* the thread that touches the segments' pages once, ahead of use */
	pthread_t warm_th;
	pid_t warm_pid;     /* the process it runs in (0: none) */
	bool warm_stop;     /* atomic */
	uint64_t warmed;    /* bytes of the segments touched so far (atomic) */
	bool no_populate;   /* the kernel has no MADV_POPULATE_READ (atomic) */
};

/* Send one request and wait for its response.  A response carrying an error
 * comes back as that -errno (the message is kept for kvc_last_error_msg()).
 * fds that ride with the response go to ret_fds (up to max_fds). */
int client_rpc(struct kvc_client *c, Kvc__Request *q, Kvc__Response **ret);
int client_rpc_fds(struct kvc_client *c, Kvc__Request *q, Kvc__Response **ret, int *ret_fds,
		   size_t max_fds, size_t *ret_n_fds);
void client_set_msg(const char *m);
int client_check_key(const char *key);
/* The put flags the daemon takes (KVC_PUT_CHAIN is the library's). */
static inline uint32_t client_wire_put_flags(uint32_t flags)
{
	return flags & ~(uint32_t) KVC_PUT_CHAIN;
}
/* Before copying len bytes into p (in a segment): maps the range in with
 * one call if the warm thread has not reached it (client.c). */
/* A view was released without waiting for the daemon (submitted on the
 * channel): the next socket request settles first (client_settle()). */
static inline void client_let_go(struct kvc_client *c)
{
	__atomic_fetch_add(&c->let_go, 1, __ATOMIC_RELEASE);
}

void client_map_ahead(struct kvc_client *c, const void *p, size_t len);
/* Pointer to an extent the daemon named, checked against the mappings. */
int client_extent_ptr(struct kvc_client *c, uint32_t segment, uint64_t offset, uint64_t len,
		      void **ret);

/* Channel (chan.c). */
int chan_open(struct kvc_client *c);
void chan_close(struct chan *ch);
/* Take a tag (blocking while none is free when `wait`), or -EAGAIN. */
int chan_tag_get(struct kvc_client *c, enum tag_state kind, bool wait, uint32_t *ret);
void chan_tag_put(struct chan *ch, uint32_t t);
static inline uint8_t *chan_slot(struct chan *ch, uint32_t t)
{
	return ch->arena + (uint64_t) t * SHM_CHAN_ARENA_SLOT;
}
static inline uint32_t chan_slot_off(uint32_t t)
{
	return t * SHM_CHAN_ARENA_SLOT;
}
/* The last SHM_MSG_MAX bytes of a tag's slot receive error messages. */
#define CHAN_SLOT_USABLE (SHM_CHAN_ARENA_SLOT - SHM_MSG_MAX)
/* Queue descriptors (user_data already set) and ring the daemon if needed. */
int chan_submit(struct kvc_client *c, const struct shm_sqe *e, uint32_t n);
/* Queue descriptors no one waits for (releases) without ringing: a
 * sleeping daemon reads them at its next turn, which the next
 * chan_submit() or chan_kick() brings if nothing else does. */
int chan_submit_lazy(struct kvc_client *c, const struct shm_sqe *e, uint32_t n);
void chan_kick(struct kvc_client *c);
/* Wait until tag t is DONE; returns its result (the tag stays taken). */
int64_t chan_wait(struct kvc_client *c, uint32_t t);
/* Move whatever completions are ready; true if any. */
bool chan_reap(struct kvc_client *c);
/* A descriptor filled with the key (and optional parent) in tag t's slot. */
int chan_prep_key(struct chan *ch, uint32_t t, struct shm_sqe *e, uint8_t op, const char *key,
		  const char *parent);
/* One synchronous descriptor: tag, submit, wait, put the tag back.  On
 * failure the daemon's message (if any) becomes kvc_last_error_msg(). */
int64_t chan_call(struct kvc_client *c, struct shm_sqe *e, uint32_t t, struct shm_cqe *ret_cqe);
/* chan_call()'s end, for a caller that submitted and waited itself: r is
 * what the wait said (0: tag t is DONE). */
int64_t chan_call_end(struct kvc_client *c, uint32_t t, int64_t r, struct shm_cqe *ret_cqe);
/* A streamed request (SHM_SQE_STREAM): is tag t DONE?  The SHM_CQE_MORE
 * completions taken for it so far (the last into *ret, when any); and a
 * wait until it is DONE or more than `seen` came, or timeout_us passed
 * (-1: no limit): 0, -ETIMEDOUT, -ECONNRESET. */
bool chan_tag_done(struct kvc_client *c, uint32_t t);
uint32_t chan_more(struct kvc_client *c, uint32_t t, struct shm_cqe *ret);
int chan_wait_more(struct kvc_client *c, uint32_t t, uint32_t seen, int64_t timeout_us);
/* e (a COMMIT or PUT_FROM on tag t) also pushes to node once stored: the
 * node id goes at offset at of the tag's slot.  -EOPNOTSUPP: the daemon
 * does not take it (push after, with kvc_push()); -EINVAL: a bad id. */
int chan_push_to(struct chan *ch, uint32_t t, struct shm_sqe *e, uint32_t at, const char *node);

/* Async completions (chan.c). */
int chan_pop_async(struct kvc_client *c, struct kvc_completion *ret, size_t max);
/* Until one is ready: 0, -ETIMEDOUT, -ECONNRESET. */
int chan_wait_async(struct kvc_client *c, int64_t timeout_us);
/* Stop kvc_completion_fd()'s thread and close its fd (before the channel
 * goes away). */
void chan_completion_fd_done(struct kvc_client *c);

int client_fd_above_stdio(int fd);
