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
#include <string.h>
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
	CHECK_EQ(worker_new(the_loop, "test", 2, LOOP_HELPER_NORMAL, &wk), 0);
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
	loop_timer_arm(dog, mono_us() + 10000 * USEC_PER_MSEC);
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
	CHECK_EQ(worker_new(the_loop, "test", 1, LOOP_HELPER_BATCH, &wk), 0);
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
	loop_timer_arm(dog, mono_us() + 10000 * USEC_PER_MSEC);
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

/* Shared workers: the threads take what the owner's choice says.  Here a
 * peer may hold one thread at once and a run of its jobs at the head goes
 * together (as the cluster's data threads do). */
#define PEERS 4
#define SHARED_N 120

struct sjob {
	struct work work;
	unsigned peer, id;
	bool ran, done, dropped;
	unsigned seq;
};

static struct {
	unsigned busy[PEERS];       /* under the worker's lock */
	unsigned at_once[PEERS];    /* threads running the peer's jobs (atomic) */
	unsigned most[PEERS];       /* the most seen (atomic) */
	unsigned others_done;       /* jobs of peers 1.. done (atomic) */
	unsigned ran_seq;
	bool held_back_ok;          /* peer 0's first job saw the others end */
	struct worker *wk;
	unsigned n_done;
} sh;

static unsigned sh_take(void *data, struct work *head, struct work **run, unsigned max,
			void **hold)
{
	unsigned k = 0;

	(void) data;
	for (struct work *w = head; w; w = w->next) {
		struct sjob *j = (struct sjob *) w;

		if (sh.busy[j->peer])
			continue;
		sh.busy[j->peer]++;
		*hold = &sh.busy[j->peer];
		run[k++] = w;
		/* the same peer's jobs right behind it go with it */
		for (w = w->next; w && k < max && k < 4 && ((struct sjob *) w)->peer == j->peer;
		     w = w->next)
			run[k++] = w;
		return k;
	}
	return 0;
}

static void sh_ran(void *data, void *hold)
{
	(void) data;
	(*(unsigned *) hold)--;
}

static void sh_run(void *data, struct work **run, unsigned k)
{
	struct sjob *first = (struct sjob *) run[0];
	unsigned p = first->peer;
	unsigned now = __atomic_add_fetch(&sh.at_once[p], 1, __ATOMIC_RELAXED);
	unsigned most = __atomic_load_n(&sh.most[p], __ATOMIC_RELAXED);

	(void) data;
	CHECK(!pthread_equal(pthread_self(), loop_thread));
	while (now > most && !__atomic_compare_exchange_n(&sh.most[p], &most, now, false,
							 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	if (p == 0 && first->id == 0) {
		/* a peer that stops answering: its thread waits for every
		 * other peer's jobs to end (at most 10 s) */
		for (unsigned i = 0; i < 10000; i++) {
			if (__atomic_load_n(&sh.others_done, __ATOMIC_ACQUIRE) ==
			    SHARED_N - SHARED_N / PEERS) {
				sh.held_back_ok = true;
				break;
			}
			usleep(1000);
		}
	}
	for (unsigned i = 0; i < k; i++) {
		struct sjob *j = (struct sjob *) run[i];

		CHECK_EQ(j->peer, p); /* a run is one peer's */
		CHECK(!j->ran);
		j->ran = true;
		j->seq = __atomic_fetch_add(&sh.ran_seq, 1, __ATOMIC_RELAXED);
		if (p)
			__atomic_add_fetch(&sh.others_done, 1, __ATOMIC_RELEASE);
		if (i + 1 == k)
			__atomic_sub_fetch(&sh.at_once[p], 1, __ATOMIC_RELAXED);
		worker_hand_back(sh.wk, run[i]);
	}
}

static void sh_done(struct work *w)
{
	struct sjob *j = (struct sjob *) w;

	CHECK(pthread_equal(pthread_self(), loop_thread));
	CHECK(j->ran && !j->done);
	j->done = true;
	if (++sh.n_done == SHARED_N)
		loop_quit(the_loop);
}

static void sh_drop(struct work *w)
{
	struct sjob *j = (struct sjob *) w;

	CHECK(j->ran && !j->done && !j->dropped);
	j->dropped = true;
}

static const struct worker_choice sh_choice = {
	.take = sh_take, .run = sh_run, .ran = sh_ran,
};

static void test_shared(void)
{
	static struct sjob jobs[SHARED_N];
	struct loop_source *dog;

	memset(&sh, 0, sizeof(sh));
	CHECK_EQ(loop_new(0, &the_loop), 0);
	CHECK_EQ(worker_new_shared(the_loop, "shared", 0, LOOP_HELPER_NORMAL, &sh_choice, NULL, &sh.wk),
		 -EINVAL);
	CHECK_EQ(worker_new_shared(the_loop, "shared", 3, LOOP_HELPER_NORMAL, NULL, NULL, &sh.wk),
		 -EINVAL);
	CHECK_EQ(worker_new_shared(the_loop, "shared", 3, LOOP_HELPER_NORMAL, &sh_choice, NULL, &sh.wk),
		 0);
	for (unsigned i = 0; i < SHARED_N; i++) {
		/* peer 0's jobs first, so they would take every thread */
		unsigned peer = i < SHARED_N / PEERS ? 0 : 1 + i % (PEERS - 1);

		jobs[i] = (struct sjob) { .peer = peer, .id = i };
		jobs[i].work = (struct work) { .done = sh_done };
		CHECK_EQ(worker_submit(sh.wk, &jobs[i].work), 0);
	}
	CHECK_EQ(loop_add_timer(the_loop, watchdog, the_loop, &dog), 0);
	loop_timer_arm(dog, mono_us() + 20000 * USEC_PER_MSEC);
	CHECK_EQ(loop_run(the_loop), 0);
	CHECK_EQ(sh.n_done, SHARED_N);
	CHECK(sh.held_back_ok); /* a stuck peer held one thread, not all */
	for (unsigned p = 0; p < PEERS; p++)
		CHECK_EQ(sh.most[p], 1); /* never two threads for one peer */
	worker_free(sh.wk);
	loop_source_free(dog);

	/* a chain goes in order, together; what finished and was not done
	 * is dropped by worker_free_dropping() */
	sh.ran_seq = 0;
	sh.others_done = 0;
	CHECK_EQ(worker_new_shared(the_loop, "shared", 1, LOOP_HELPER_NORMAL, &sh_choice, NULL, &sh.wk),
		 0);
	for (unsigned i = 0; i < 20; i++) {
		jobs[i] = (struct sjob) { .peer = 1 + i % 2, .id = 100 + i };
		jobs[i].work = (struct work) { .done = sh_done };
		jobs[i].work.next = i + 1 < 20 ? &jobs[i + 1].work : NULL;
	}
	CHECK_EQ(worker_submit_chain(sh.wk, &jobs[0].work, &jobs[19].work, 20), 0);
	CHECK_EQ(worker_pending(sh.wk), 20);
	worker_free_dropping(sh.wk, sh_drop);
	for (unsigned i = 0; i < 20; i++) {
		CHECK(jobs[i].ran && jobs[i].dropped && !jobs[i].done);
		CHECK_EQ(jobs[i].seq, i); /* one thread, one peer at a time: in order */
	}
	loop_free(the_loop);
}

int main(void)
{
	loop_thread = pthread_self();
	test_worker();
	test_post();
	test_shared();
	printf("ok\n");
	return 0;
}
