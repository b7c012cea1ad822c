/* SPDX-License-Identifier: MIT */
/* Helper threads that run the loop's work and hand it back (worker.h). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "handoff.h"
#include "loop.h"
#include "worker.h"

struct worker_thread {
	struct worker *wk;
	pthread_t th;
	struct work *queue; /* handoff.h stack */
	struct handoff_bell wake;
};

struct worker {
	struct loop *loop;
	char name[16];
	enum worker_sched sched;
	bool stop;         /* atomic */
	size_t pending;    /* atomic */
	unsigned next;     /* the thread the next piece goes to (atomic) */
	struct work *done; /* handoff.h stack, for the loop */
	int efd;
	struct loop_source *bell, *poller;
	void (*after)(void *data);
	void *after_data;
	unsigned n;
	struct worker_thread t[];
};

static void *worker_main(void *arg)
{
	struct worker_thread *t = arg;
	struct worker *wk = t->wk;
	struct work *l;

	loop_helper_thread(wk->name, wk->sched == WORKER_BATCH);
	if (wk->sched == WORKER_IDLE) {
		/* only idle CPU time: lowering one's own policy needs no privilege */
		struct sched_param sp = { 0 };

		pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	}
	while ((l = handoff_wait_fifo(&t->queue, next, &t->wake, &wk->stop))) {
		while (l) {
			struct work *w = l;
			/* read before run(): work without a done() is run()'s */
			bool back = w->done != NULL;

			l = w->next;
			w->run(w);
			if (back)
				handoff_push_wake(&wk->done, w, next, wk->efd);
			else
				__atomic_sub_fetch(&wk->pending, 1, __ATOMIC_RELEASE);
		}
	}
	return NULL;
}

/* Loop: the done() of what finished, oldest first. */
static bool worker_poll(void *userdata)
{
	struct worker *wk = userdata;
	struct work *l;

	if (!__atomic_load_n(&wk->done, __ATOMIC_RELAXED))
		return false;
	l = handoff_collect(&wk->done, wk->efd);
	/* newest first on the stack: reverse */
	{
		struct work *fifo = NULL;

		while (l) {
			struct work *n = l->next;

			l->next = fifo;
			fifo = l;
			l = n;
		}
		l = fifo;
	}
	while (l) {
		struct work *w = l;

		l = w->next;
		__atomic_sub_fetch(&wk->pending, 1, __ATOMIC_RELEASE);
		w->done(w);
	}
	if (wk->after)
		wk->after(wk->after_data);
	return true;
}

void worker_set_after(struct worker *wk, void (*after)(void *data), void *data)
{
	wk->after = after;
	wk->after_data = data;
}

int worker_new(struct loop *loop, const char *name, unsigned n_threads, enum worker_sched sched,
	       struct worker **ret)
{
	struct worker *wk;
	int r = 0;

	*ret = NULL;
	if (n_threads == 0)
		return -EINVAL;
	wk = calloc(1, sizeof(*wk) + n_threads * sizeof(wk->t[0]));
	if (!wk)
		return -ENOMEM;
	wk->loop = loop;
	wk->sched = sched;
	wk->efd = -1;
	snprintf(wk->name, sizeof(wk->name), "%s", name);
	if (loop) {
		wk->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (wk->efd < 0)
			r = -errno;
		if (r == 0)
			r = loop_add_doorbell(loop, wk->efd, &wk->bell);
		if (r == 0)
			r = loop_add_poller(loop, worker_poll, NULL, wk, &wk->poller);
	}
	for (unsigned i = 0; r == 0 && i < n_threads; i++) {
		wk->t[i].wk = wk;
		r = -pthread_create(&wk->t[i].th, NULL, worker_main, &wk->t[i]);
		if (r == 0)
			wk->n++; /* threads 0..n-1 run */
	}
	if (r < 0) {
		worker_free(wk);
		return r;
	}
	*ret = wk;
	return 0;
}

void worker_free(struct worker *wk)
{
	if (!wk)
		return;
	__atomic_store_n(&wk->stop, true, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < wk->n; i++)
		handoff_bell_ring(&wk->t[i].wake);
	for (unsigned i = 0; i < wk->n; i++)
		pthread_join(wk->t[i].th, NULL);
	if (wk->loop)
		worker_poll(wk);
	loop_source_free(wk->bell);
	loop_source_free(wk->poller);
	if (wk->efd >= 0)
		close(wk->efd);
	free(wk);
}

int worker_submit(struct worker *wk, struct work *w)
{
	struct worker_thread *t;

	if (!wk || !wk->n)
		return -ENODEV;
	t = &wk->t[__atomic_fetch_add(&wk->next, 1, __ATOMIC_RELAXED) % wk->n];
	__atomic_add_fetch(&wk->pending, 1, __ATOMIC_RELAXED);
	if (handoff_push(&t->queue, w, next))
		handoff_bell_ring(&t->wake);
	return 0;
}

bool worker_run_done(struct worker *wk)
{
	return wk && wk->loop && worker_poll(wk);
}

size_t worker_pending(const struct worker *wk)
{
	return wk ? __atomic_load_n(&wk->pending, __ATOMIC_ACQUIRE) : 0;
}
