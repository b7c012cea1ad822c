/* SPDX-License-Identifier: MIT */
/*
 * The copier: a thread that does the large copies of get_into and put_from
 * (between an object and a client's registered buffer), so the loop never
 * spends milliseconds on a memcpy while other clients wait: a 16 MiB
 * get_into held the loop for the length of a 16 MiB copy.
 *
 * A copy in flight owns what it touches, so nothing a client does can pull
 * it from under the thread: the view or reservation is held in the
 * server's own holder (no client handle names it), and each registered
 * buffer it reads or writes counts it (a buffer freed meanwhile is unmapped
 * when its last copy ends).  A client that goes away leaves its copies to
 * finish; then views are released and puts aborted, as the reservations it
 * held itself are, without an answer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker.h"
#include "log.h"
#include "loop.h"
#include "copier.h"

#define LOG_TOPIC "copier"

struct copier {
	struct worker *wk; /* one thread: copies end in the order given */
};

void copy_pieces(const struct copy_piece *pieces, uint32_t n, uint8_t *obj, bool to_obj)
{
	uint64_t done = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (to_obj)
			memcpy(obj + done, pieces[i].p, pieces[i].len);
		else
			memcpy(pieces[i].p, obj + done, pieces[i].len);
		done += pieces[i].len;
	}
}

/* The copier's thread. */
static void copy_run(struct work *w)
{
	struct copy_job *j = (struct copy_job *) w;

	copy_pieces(j->pieces, j->n, j->obj, j->put);
}

/* Loop: drop the job's hold on its buffers. */
static void unref_buffers(struct server *sv, struct copy_job *j)
{
	for (uint32_t i = 0; i < j->n; i++) {
		struct buffer *b = j->pieces[i].b;

		if (--b->copies == 0 && b->released)
			buffer_unmap(sv, b);
	}
}

/* Loop: a copy ended; answer its request. */
static void copy_done(struct work *w)
{
	struct copy_job *j = (struct copy_job *) w;
	struct server *sv = j->sv;
	char msg[STORE_MSG_MAX] = "";
	int64_t r;

	unref_buffers(sv, j);
	if (j->put && j->s)
		r = store_commit(&sv->copy_h, j->handle, msg);
	else if (j->put) /* its client went away: as any reservation */
		r = store_abort(&sv->copy_h, j->handle, msg);
	else {
		store_release(&sv->copy_h, j->handle, msg);
		r = (int64_t) j->len;
	}
	sv->copies_in_flight--;
	if (j->s) {
		if (j->sprev)
			j->sprev->snext = j->snext;
		else
			j->s->copies = j->snext;
		if (j->snext)
			j->snext->sprev = j->sprev;
		j->answer(j, r, msg);
	}
	free(j);
}

/* Tests and fuzzing, which run no loop: until every copy has ended and
 * been answered. */
void copier_settle(struct server *sv)
{
	while (sv->copies_in_flight) {
		if (!worker_run_done(sv->copier->wk))
			usleep(50);
	}
}

/* Loop: the copy goes to the thread; the job's view or reservation is in
 * sv->copy_h and its buffers are counted already. */
void copier_submit(struct server *sv, struct copy_job *j)
{
	struct copier *cp = sv->copier;

	j->sv = sv;
	j->work = (struct work) { .run = copy_run, .done = copy_done };
	j->snext = j->s->copies;
	j->sprev = NULL;
	if (j->snext)
		j->snext->sprev = j;
	j->s->copies = j;
	sv->copies_in_flight++;
	sv->stats.copies_offloaded++;
	worker_submit(cp->wk, &j->work);
}

/* Loop: a session going away leaves its copies to finish unanswered. */
void copier_forget(struct session *s)
{
	for (struct copy_job *j = s->copies; j; j = j->snext) {
		j->s = NULL;
		j->ch = NULL;
	}
	s->copies = NULL;
}

int copier_init(struct server *sv)
{
	struct copier *cp = calloc(1, sizeof(*cp));

	if (!cp)
		return -ENOMEM;
	sv->copier = cp;
	holder_init(&sv->copy_h, sv->st, NULL);
	return worker_new(sv->loop, "copy", 1, LOOP_HELPER_NORMAL, &cp->wk);
}

/* After every session is gone: the thread finishes what it was given, and
 * what it held is let go. */
void copier_done(struct server *sv)
{
	struct copier *cp = sv->copier;
	uint64_t res = 0, views = 0;

	if (!cp)
		return;
	worker_free(cp->wk); /* the copies end, and are answered to nobody */
	holder_done(&sv->copy_h, &res, &views);
	free(cp);
	sv->copier = NULL;
}
