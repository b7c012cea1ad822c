/* SPDX-License-Identifier: MIT */
/* Helper threads that run the loop's work and hand it back (worker.h). */
#include <errno.h>
#include <pthread.h>
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
	enum loop_helper sched;
	bool stop;         /* atomic */
	size_t pending;    /* atomic */
	unsigned next;     /* the thread the next piece goes to (atomic) */
	struct work *done; /* handoff.h stack, for the loop */
	int efd;
	struct loop_source *bell, *poller;
	void (*after)(void *data);
	void *after_data;
	/* shared (worker_new_shared): one queue the threads choose from */
	const struct worker_choice *ch;
	void *ch_data;
	pthread_mutex_t lock;  /* its threads' only: the loop never takes it */
	struct work *incoming; /* handoff.h stack, from submitters */
	struct work *head, **tail;
	struct handoff_bell wake;
	unsigned n;
	struct worker_thread t[];
};

static void thread_start(struct worker *wk)
{
	loop_helper_thread(wk->name, wk->sched);
}

static void *worker_main(void *arg)
{
	struct worker_thread *t = arg;
	struct worker *wk = t->wk;
	struct work *l;

	thread_start(wk);
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

void worker_hand_back(struct worker *wk, struct work *w)
{
	if (w->done)
		handoff_push_wake(&wk->done, w, next, wk->efd);
	else
		__atomic_sub_fetch(&wk->pending, 1, __ATOMIC_RELEASE);
}

/* Shared: run[0..k) (in queue order) out of the queue.  Under the lock. */
static void unlink_taken(struct worker *wk, struct work **run, unsigned k)
{
	struct work **pp = &wk->head;
	unsigned i = 0;

	while (*pp && i < k) {
		if (*pp == run[i])
			*pp = run[i++]->next;
		else
			pp = &(*pp)->next;
	}
	if (!*pp)
		wk->tail = pp;
}

/* Shared: what was submitted, onto the end of the queue.  Under the lock. */
static void take_incoming(struct worker *wk)
{
	struct work *in = handoff_take_fifo(&wk->incoming, next);

	if (!in)
		return;
	*wk->tail = in;
	while (in->next)
		in = in->next;
	wk->tail = &in->next;
}

static void *shared_main(void *arg)
{
	struct worker_thread *t = arg;
	struct worker *wk = t->wk;
	const struct worker_choice *ch = wk->ch;

	thread_start(wk);
	if (ch->thread_start)
		ch->thread_start(wk->ch_data);
	for (;;) {
		uint32_t seq = handoff_bell_seq(&wk->wake);
		/* read before the queue: what was queued before the stop runs */
		bool stopping = __atomic_load_n(&wk->stop, __ATOMIC_ACQUIRE);
		struct work *run[WORKER_TAKE_MAX];
		void *hold = NULL;
		unsigned k = 0;
		bool more;

		pthread_mutex_lock(&wk->lock);
		take_incoming(wk);
		if (wk->head)
			k = ch->take(wk->ch_data, wk->head, run, WORKER_TAKE_MAX, &hold);
		unlink_taken(wk, run, k);
		more = wk->head != NULL;
		pthread_mutex_unlock(&wk->lock);
		if (!k) {
			/* nothing, or nothing that may run now: a thread that
			 * gives back what it held rings */
			if (stopping && !more)
				break;
			handoff_bell_wait(&wk->wake, seq, 0);
			continue;
		}
		if (more) /* the next pieces, for another thread */
			handoff_bell_ring(&wk->wake);
		ch->run(wk->ch_data, run, k); /* each handed back as it ends */
		if (hold && ch->ran) {
			/* what waited for what was held may run now */
			pthread_mutex_lock(&wk->lock);
			ch->ran(wk->ch_data, hold);
			more = wk->head != NULL;
			pthread_mutex_unlock(&wk->lock);
			if (more)
				handoff_bell_ring(&wk->wake);
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

static int worker_make(struct loop *loop, const char *name, unsigned n_threads,
		       enum loop_helper sched, const struct worker_choice *ch, void *data,
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
	wk->ch = ch;
	wk->ch_data = data;
	wk->tail = &wk->head;
	pthread_mutex_init(&wk->lock, NULL);
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
		r = -pthread_create(&wk->t[i].th, NULL, ch ? shared_main : worker_main, &wk->t[i]);
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

int worker_new(struct loop *loop, const char *name, unsigned n_threads, enum loop_helper sched,
	       struct worker **ret)
{
	return worker_make(loop, name, n_threads, sched, NULL, NULL, ret);
}

int worker_new_shared(struct loop *loop, const char *name, unsigned n_threads,
		      enum loop_helper sched, const struct worker_choice *ch, void *data,
		      struct worker **ret)
{
	if (!ch || !ch->take || !ch->run) {
		*ret = NULL;
		return -EINVAL;
	}
	return worker_make(loop, name, n_threads, sched, ch, data, ret);
}

/* Stop the threads once they have run what was submitted. */
static void stop_threads(struct worker *wk)
{
	__atomic_store_n(&wk->stop, true, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < wk->n; i++) /* one sleeper each */
		handoff_bell_ring(wk->ch ? &wk->wake : &wk->t[i].wake);
	for (unsigned i = 0; i < wk->n; i++)
		pthread_join(wk->t[i].th, NULL);
}

static void release(struct worker *wk)
{
	loop_source_free(wk->bell);
	loop_source_free(wk->poller);
	if (wk->efd >= 0)
		close(wk->efd);
	pthread_mutex_destroy(&wk->lock);
	free(wk);
}

void worker_free(struct worker *wk)
{
	if (!wk)
		return;
	stop_threads(wk);
	if (wk->loop)
		worker_poll(wk);
	release(wk);
}

void worker_free_dropping(struct worker *wk, void (*drop)(struct work *w))
{
	struct work *l;

	if (!wk)
		return;
	stop_threads(wk);
	take_incoming(wk); /* none are left: the threads ran them */
	l = wk->head;
	while (l || (l = handoff_take(&wk->done))) {
		struct work *w = l;

		l = w->next;
		if (drop)
			drop(w);
	}
	wk->head = NULL;
	release(wk);
}

int worker_submit(struct worker *wk, struct work *w)
{
	struct worker_thread *t;

	if (wk && wk->ch) {
		w->next = NULL;
		return worker_submit_chain(wk, w, w, 1);
	}
	if (!wk || !wk->n)
		return -ENODEV;
	t = &wk->t[__atomic_fetch_add(&wk->next, 1, __ATOMIC_RELAXED) % wk->n];
	__atomic_add_fetch(&wk->pending, 1, __ATOMIC_RELAXED);
	if (handoff_push(&t->queue, w, next))
		handoff_bell_ring(&t->wake);
	return 0;
}

int worker_submit_chain(struct worker *wk, struct work *first, struct work *last, size_t n)
{
	struct work *old, *rev = NULL;
	size_t count = n;

	if (!wk || !wk->n)
		return -ENODEV;
	if (!n)
		return 0;
	if (!wk->ch) {
		for (struct work *w = first, *next; n--; w = next) {
			next = w->next;
			worker_submit(wk, w);
		}
		return 0;
	}
	/* the stack is newest first: the chain goes on it reversed */
	for (struct work *w = first, *next; n--; w = next) {
		next = w->next;
		w->next = rev;
		rev = w;
	}
	__atomic_add_fetch(&wk->pending, count, __ATOMIC_RELAXED);
	old = __atomic_load_n(&wk->incoming, __ATOMIC_RELAXED);
	do
		first->next = old;
	while (!__atomic_compare_exchange_n(&wk->incoming, &old, last, true, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED));
	if (!old)
		handoff_bell_ring(&wk->wake);
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
