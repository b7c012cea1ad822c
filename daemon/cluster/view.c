/* SPDX-License-Identifier: MIT */
/*
 * Following etcd's master view (view.h).  The thread reads the view and
 * the revision it was read at, publishes it, and then watches the key
 * from that revision: a leader's election, or its view going when its
 * lease ends, wakes it at once.  With etcd away it tries again every
 * half second; the last view published stands meanwhile.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"
#include "handoff.h"
#include "loop.h"
#include "view.h"

#define VIEW_CALL (1 * USEC_PER_SEC)         /* each call to etcd */
#define VIEW_WATCH (1 * USEC_PER_SEC)        /* one watch, at most (and a stop's wait) */
#define VIEW_RETRY (500 * USEC_PER_MSEC)     /* after etcd failed */

struct view_follower {
	struct etcd *etcd;
	char key[NET_HOST_MAX];
	struct handoff_thread t;
	struct master_view *fresh;  /* atomic: the newest, not yet taken */
};

/* One read of the view: its answer, and the revision to watch from. */
static struct master_view *read_view(struct view_follower *f, int64_t *at)
{
	struct master_view *v = calloc(1, sizeof(*v));
	struct net_addr a;
	int64_t rev = 0;

	if (!v)
		return NULL;
	*at = 0;
	v->res = etcd_get_at(f->etcd, f->key, v->leader, sizeof(v->leader), &rev, at);
	if (v->res == -ENOENT)
		v->res = -EHOSTUNREACH; /* no leader now: an election is under way */
	if (v->res == 0 && (net_addr_parse(v->leader, 50051, &a) < 0 || !a.host[0]))
		v->res = -EINVAL;
	if (v->res == 0)
		v->res = net_resolve(&a, false, &v->sa);
	v->term = (uint64_t) rev;
	return v;
}

static void *follow_main(void *arg)
{
	struct view_follower *f = arg;

	loop_helper_thread("view", LOOP_HELPER_BATCH);
	while (!handoff_thread_stopping(&f->t)) {
		int64_t at;
		struct master_view *v = read_view(f, &at);
		int res = v ? v->res : -ENOMEM;

		if (v)
			free(__atomic_exchange_n(&f->fresh, v, __ATOMIC_ACQ_REL));
		if (at && (res == 0 || res == -EHOSTUNREACH)) {
			/* until it changes (a watch ends by itself now and then) */
			int r = etcd_wait_change(f->etcd, f->key, at, VIEW_WATCH);

			if (r == 0 || r == -ETIMEDOUT)
				continue;
		}
		handoff_thread_pause(&f->t, VIEW_RETRY);
	}
	return NULL;
}

int view_follow(const char *endpoints, const char *key, struct view_follower **ret)
{
	struct view_follower *f = calloc(1, sizeof(*f));
	int r;

	*ret = NULL;
	if (!f)
		return -ENOMEM;
	snprintf(f->key, sizeof(f->key), "%s", key);
	r = etcd_new(endpoints, VIEW_CALL, &f->etcd);
	if (r == 0)
		r = handoff_thread_start(&f->t, follow_main, f);
	if (r < 0) {
		etcd_free(f->etcd);
		free(f);
		return r;
	}
	*ret = f;
	return 0;
}

void view_unfollow(struct view_follower *f)
{
	if (!f)
		return;
	handoff_thread_stop(&f->t);
	etcd_free(f->etcd);
	free(f->fresh);
	free(f);
}

struct master_view *view_take(struct view_follower *f)
{
	return f ? __atomic_exchange_n(&f->fresh, NULL, __ATOMIC_ACQ_REL) : NULL;
}
