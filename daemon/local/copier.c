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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "handoff.h"
#include "log.h"
#include "loop.h"
#include "session.h"

#define LOG_TOPIC "copier"

struct copier {
	pthread_t th;
	bool running, stop;
	struct copy_job *jobs, *done;   /* handoff.h stacks */
	struct handoff_bell wake;       /* the thread sleeps on it */
	int efd;                        /* wakes a sleeping loop */
	struct loop_source *bell, *poller;
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

static void *copier_main(void *arg)
{
	struct copier *cp = arg;
	struct copy_job *fifo;

	loop_helper_thread("copy", false);
	while ((fifo = handoff_wait_fifo(&cp->jobs, next, &cp->wake, &cp->stop))) {
		while (fifo) {
			struct copy_job *j = fifo;

			fifo = j->next;
			copy_pieces(j->pieces, j->n, j->obj, j->put);
			handoff_push_wake(&cp->done, j, next, cp->efd);
		}
	}
	return NULL;
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

/* Loop: copies that ended; answer their requests. */
static bool copier_poll(void *userdata)
{
	struct server *sv = userdata;
	struct copier *cp = sv->copier;
	struct copy_job *list = handoff_collect(&cp->done, cp->efd);

	if (!list)
		return false;
	while (list) {
		struct copy_job *j = list;
		char msg[STORE_MSG_MAX] = "";
		int64_t r;

		list = j->next;
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
			channel_copy_done(j->ch, &j->e, r, msg);
		}
		free(j);
	}
	return true;
}

/* Tests and fuzzing, which run no loop: until every copy has ended and
 * been answered. */
void copier_settle(struct server *sv)
{
	while (sv->copies_in_flight) {
		if (!copier_poll(sv))
			usleep(50);
	}
}

/* Loop: the copy goes to the thread; the job's view or reservation is in
 * sv->copy_h and its buffers are counted already. */
void copier_submit(struct server *sv, struct copy_job *j)
{
	struct copier *cp = sv->copier;

	j->snext = j->s->copies;
	j->sprev = NULL;
	if (j->snext)
		j->snext->sprev = j;
	j->s->copies = j;
	sv->copies_in_flight++;
	sv->stats.copies_offloaded++;
	if (handoff_push(&cp->jobs, j, next))
		handoff_bell_ring(&cp->wake);
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

int copier_setup(struct server *sv)
{
	struct copier *cp = calloc(1, sizeof(*cp));
	int r;

	if (!cp)
		return -ENOMEM;
	sv->copier = cp;
	holder_init(&sv->copy_h, sv->st, NULL);
	cp->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (cp->efd < 0)
		return -errno;
	r = loop_add_doorbell(sv->loop, cp->efd, &cp->bell);
	if (r == 0)
		r = loop_add_poller(sv->loop, copier_poll, NULL, sv, &cp->poller);
	if (r == 0)
		r = -pthread_create(&cp->th, NULL, copier_main, cp);
	if (r < 0)
		return r;
	cp->running = true;
	return 0;
}

/* After every session is gone: the thread finishes what it was given, and
 * what it held is let go. */
void copier_teardown(struct server *sv)
{
	struct copier *cp = sv->copier;
	uint64_t res = 0, views = 0;

	if (!cp)
		return;
	if (cp->running) {
		__atomic_store_n(&cp->stop, true, __ATOMIC_RELEASE);
		handoff_bell_ring(&cp->wake);
		pthread_join(cp->th, NULL);
		copier_poll(sv);
	}
	holder_done(&sv->copy_h, &res, &views);
	loop_source_free(cp->bell);
	loop_source_free(cp->poller);
	if (cp->efd >= 0)
		close(cp->efd);
	free(cp);
	sv->copier = NULL;
}
