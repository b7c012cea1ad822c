/* SPDX-License-Identifier: MIT */
/* The copier (copier.c): large get_into/put_from copies off the loop. */
#pragma once

#include "buffer.h"

/* A copy goes to the copier when it is this large, or when the loop has
 * copied COPY_TURN_BUDGET bytes itself since it last polled the channels
 * and the copy is at least COPY_MIN: handing a copy over costs a thread
 * wake-up (tens of us here), which only pays for copies of milliseconds,
 * but a batch of many 1 MiB copies must not hold the loop either. */
#define COPY_OFFLOAD (UINT64_C(2) << 20)
#define COPY_TURN_BUDGET (UINT64_C(1) << 20)
#define COPY_MIN (UINT64_C(64) << 10)
struct copy_piece {
	uint8_t *p;
	uint64_t len;
	struct buffer *b;
};
struct copy_job {
	struct work work;               /* on the copier, then on the loop */
	struct server *sv;
	struct copy_job *snext, *sprev; /* its session's */
	struct session *s;              /* NULL once it went away */
	/* the request's answer, on the loop, when its client is still there
	 * (whoever made the job says how: the copier knows no channel) */
	void (*answer)(struct copy_job *j, int64_t r, const char *msg);
	struct channel *ch;             /* the answer's */
	struct shm_sqe e;
	bool put;                       /* buffer -> object (put_from) */
	uint64_t handle;                /* in sv->copy_h */
	uint8_t *obj;
	uint64_t len;
	uint32_t n;
	struct copy_piece pieces[];
};
/* Between obj and the pieces, in order (to_obj: pieces -> obj). */
void copy_pieces(const struct copy_piece *pieces, uint32_t n, uint8_t *obj, bool to_obj);
int copier_init(struct server *sv);
void copier_done(struct server *sv);
void copier_submit(struct server *sv, struct copy_job *j);
void copier_forget(struct session *s);
void copier_settle(struct server *sv);
