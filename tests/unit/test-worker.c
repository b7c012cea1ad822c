/* SPDX-License-Identifier: MIT */
/* Workers and loop_post(): every piece of work runs once on a worker
 * thread, never on the loop's, and its done() once on the loop's thread,
 * after its run(); pieces given to one thread run in order; work without a
 * done() belongs to run(); worker_free() runs what was queued and then the
 * done() of all of it; calls posted from other threads run on the loop's
 * thread in the order posted, and loop_run_posted() runs them when the
 * loop no longer turns.  No daemon process. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h"
#include "loop.h"
#include "worker.h"

#define N 200

struct job {
	struct work work;
	unsigned id;
	pthread_t ran_on;  /* run()'s thread */
	bool ran, done;
	unsigned seq;      /* order of run() among the pieces of its thread */
};

static pthread_t loop_thread;
static unsigned n_done, n_ran_free;
static struct loop *the_loop;

static void job_run(struct work *w)
{
	struct job *j = (struct job *) w;

	CHECK(!pthread_equal(pthread_self(), loop_thread));
	CHECK(!j->ran);
	j->ran_on = pthread_self();
	j->ran = true;
	if (j->id % 7 == 0)
		usleep(200); /* some pieces take a while */
}

static void job_done(struct work *w)
{
	struct job *j = (struct job *) w;

	CHECK(pthread_equal(pthread_self(), loop_thread));
	CHECK(j->ran); /* after its run() */
	CHECK(!j->done);
	j->done = true;
	if (++n_done == N)
		loop_quit(the_loop);
}

/* Work without a done(): run() owns it and frees it. */
static void free_run(struct work *w)
{
	__atomic_add_fetch(&n_ran_free, 1, __ATOMIC_RELAXED);
	free(w);
}

static void watchdog(struct loop_source *s, void *u)
{
	(void) s;
	loop_quit(u);
}

/* Pieces given to one thread run in the order given: a worker of one
 * thread numbers them as they run. */
static unsigned ran_seq;

static void ordered_run(struct work *w)
{
	struct job *j = (struct job *) w;

	j->seq = ran_seq++;
	j->ran = true;
}

static void ordered_done(struct work *w)
{
	((struct job *) w)->done = true;
}

static void test_worker(void)
{
	static struct job jobs[N];
	struct loop_source *dog;
	struct worker *wk;
	pthread_t threads[2];
	unsigned n_threads = 0;

	CHECK_EQ(loop_new(0, &the_loop), 0);
	CHECK_EQ(worker_new(the_loop, "test", 2, WORKER_NORMAL, &wk), 0);
	for (unsigned i = 0; i < N; i++) {
		jobs[i] = (struct job) { .id = i };
		jobs[i].work = (struct work) { .run = job_run, .done = job_done };
		CHECK_EQ(worker_submit(wk, &jobs[i].work), 0);
	}
	for (unsigned i = 0; i < 50; i++) {
		struct work *w = calloc(1, sizeof(*w));

		CHECK(w != NULL);
		w->run = free_run;
		CHECK_EQ(worker_submit(wk, w), 0);
	}
	CHECK_EQ(loop_add_timer(the_loop, watchdog, the_loop, &dog), 0);
	loop_timer_arm(dog, mono_ms() + 10000);
	CHECK_EQ(loop_run(the_loop), 0);
	CHECK_EQ(n_done, N);
	for (unsigned i = 0; i < N; i++) {
		bool seen = false;

		CHECK(jobs[i].ran && jobs[i].done);
		for (unsigned t = 0; t < n_threads; t++)
			seen = seen || pthread_equal(threads[t], jobs[i].ran_on);
		if (!seen && n_threads < 2)
			threads[n_threads++] = jobs[i].ran_on;
	}
	CHECK_EQ(n_threads, 2); /* the pieces went to both threads */
	worker_free(wk);
	CHECK_EQ(__atomic_load_n(&n_ran_free, __ATOMIC_RELAXED), 50);

	/* one thread: in the order given; worker_free() runs what is queued
	 * and the done() of all of it, without a loop turn */
	CHECK_EQ(worker_new(the_loop, "test", 1, WORKER_BATCH, &wk), 0);
	for (unsigned i = 0; i < N; i++) {
		jobs[i] = (struct job) { .id = i };
		jobs[i].work = (struct work) { .run = ordered_run, .done = ordered_done };
		CHECK_EQ(worker_submit(wk, &jobs[i].work), 0);
	}
	CHECK(worker_pending(wk) > 0);
	worker_free(wk);
	for (unsigned i = 0; i < N; i++) {
		CHECK(jobs[i].done);
		CHECK_EQ(jobs[i].seq, i);
	}
	CHECK_EQ(worker_submit(NULL, &jobs[0].work), -ENODEV);
	CHECK_EQ(worker_pending(NULL), 0);
	loop_free(the_loop);
}

struct posted {
	unsigned n, order[N];
	bool wrong_thread;
};

static struct posted post_rec;

static void on_post(void *data)
{
	unsigned i = (unsigned) (uintptr_t) data;

	if (!pthread_equal(pthread_self(), loop_thread))
		post_rec.wrong_thread = true;
	post_rec.order[post_rec.n++] = i;
	if (post_rec.n == N)
		loop_quit(the_loop);
}

static void *poster(void *arg)
{
	(void) arg;
	for (unsigned i = 0; i < N; i++) {
		CHECK_EQ(loop_post(the_loop, on_post, (void *) (uintptr_t) i), 0);
		if (i % 50 == 0)
			usleep(1000); /* the loop may sleep in between: the post wakes it */
	}
	return NULL;
}

static void test_post(void)
{
	struct loop_source *dog;
	pthread_t th;

	CHECK_EQ(loop_new(0, &the_loop), 0);
	CHECK_EQ(loop_add_timer(the_loop, watchdog, the_loop, &dog), 0);
	loop_timer_arm(dog, mono_ms() + 10000);
	CHECK_EQ(pthread_create(&th, NULL, poster, NULL), 0);
	CHECK_EQ(loop_run(the_loop), 0);
	pthread_join(th, NULL);
	CHECK_EQ(post_rec.n, N);
	CHECK(!post_rec.wrong_thread);
	for (unsigned i = 0; i < N; i++)
		CHECK_EQ(post_rec.order[i], i);
	/* posted while the loop does not turn: run by loop_run_posted() */
	post_rec.n = 0;
	CHECK_EQ(loop_post(the_loop, on_post, (void *) (uintptr_t) 7), 0);
	CHECK_EQ(post_rec.n, 0);
	loop_run_posted(the_loop);
	CHECK_EQ(post_rec.n, 1);
	CHECK_EQ(post_rec.order[0], 7);
	/* one never run is dropped with the loop (no leak, no call) */
	CHECK_EQ(loop_post(the_loop, on_post, (void *) (uintptr_t) 8), 0);
	loop_free(the_loop);
	CHECK_EQ(post_rec.n, 1);
}

int main(void)
{
	loop_thread = pthread_self();
	test_worker();
	test_post();
	printf("ok\n");
	return 0;
}
