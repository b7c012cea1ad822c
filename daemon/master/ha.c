/* SPDX-License-Identifier: MIT */
/*
 * The election (ha.h).  One thread per master talks to etcd with bounded
 * blocking calls (net/etcd.h); the loop hears of a change of role through
 * loop_post() and never waits on etcd.
 *
 * A master campaigns with a compare-and-create of the view key bound to a
 * lease of its own: the one that creates it leads, and the key's create
 * revision is its term.  The leader renews its lease every third of the
 * TTL.  When it has not renewed it for two thirds of the TTL (etcd gone,
 * the network cut, the process stopped for a while) it steps down by
 * itself, before etcd can end the lease and let another lead: two leaders
 * never serve at once while their clocks run at the same rate.  The
 * standbys watch the key and campaign as soon as it is deleted (a leader
 * that stops revokes its lease) or its lease ends.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"
#include "ha.h"
#include "handoff.h"
#include "log.h"
#include "loop.h"
#include "master.h"

#define LOG_TOPIC "ha"

#define ETCD_TIMEOUT (1 * USEC_PER_SEC) /* each call to etcd */
#define RETRY (500 * USEC_PER_MSEC)       /* after etcd failed us */
#define RENEW_RETRY (200 * USEC_PER_MSEC) /* a renewal that failed, again */

struct ha {
	struct loop *loop;
	struct master *m;
	char endpoints[1024];
	char view_key[320];
	char address[300];
	unsigned ttl_s;
	struct etcd *etcd;    /* the thread's */
	struct handoff_thread t;
	/* the thread's word to the loop (atomic) */
	bool leading;
	uint64_t term;
	struct log_ratelimit etcd_down;
};

/* Loop: the thread's word. */
static void role_changed(void *data)
{
	struct ha *h = data;
	bool leading = __atomic_load_n(&h->leading, __ATOMIC_ACQUIRE);

	master_set_role(h->m, leading, __atomic_load_n(&h->term, __ATOMIC_ACQUIRE));
}

static void tell(struct ha *h, bool leading, uint64_t term)
{
	__atomic_store_n(&h->term, term, __ATOMIC_RELEASE);
	__atomic_store_n(&h->leading, leading, __ATOMIC_RELEASE);
	loop_post(h->loop, role_changed, h);
}



static void etcd_failed(struct ha *h, const char *what, int r)
{
	log_msg_ratelimited(&h->etcd_down, LOG_LVL_WARN, LOG_TOPIC, "etcd (%s) %s: %s",
			    h->endpoints, what, strerror(-r));
}

/* Campaign once: 1 when leading now (*lease, *term), 0 when another
 * leads or etcd failed. */
static int campaign(struct ha *h, struct etcd *e, int64_t *lease, int64_t *term)
{
	int64_t rev = 0;
	int r = etcd_lease_grant(e, h->ttl_s, lease);

	if (r < 0) {
		etcd_failed(h, "did not grant a lease", r);
		handoff_thread_pause(&h->t, RETRY);
		return 0;
	}
	r = etcd_create(e, h->view_key, h->address, *lease, &rev);
	if (r == 0) {
		*term = rev;
		return 1;
	}
	etcd_lease_revoke(e, *lease); /* unused: let it go now */
	*lease = 0;
	if (r == -EEXIST) {
		/* another leads: wait until its view goes */
		r = etcd_wait_gone(e, h->view_key, 0, 2 * ETCD_TIMEOUT);
		if (r < 0 && r != -ETIMEDOUT) {
			etcd_failed(h, "stopped watching the leader", r);
			handoff_thread_pause(&h->t, RETRY);
		}
		return 0;
	}
	etcd_failed(h, "refused the view", r);
	handoff_thread_pause(&h->t, RETRY);
	return 0;
}

static void *ha_main(void *arg)
{
	struct ha *h = arg;
	struct etcd *e = h->etcd;
	int64_t lease = 0, term = 0, left;
	usec_t renewed = 0, wait = 0;
	bool leading = false;
	int r;

	loop_helper_thread("ha", LOOP_HELPER_NORMAL);
	while (!handoff_thread_stopping(&h->t)) {
		if (!leading) {
			if (campaign(h, e, &lease, &term) == 1) {
				leading = true;
				renewed = mono_us();
				wait = h->ttl_s * USEC_PER_SEC / 3;
				log_notice("leading cluster %s as term %lld, at %s", h->view_key,
					   (long long) term, h->address);
				tell(h, true, (uint64_t) term);
			}
			continue;
		}
		handoff_thread_pause(&h->t, wait);
		if (handoff_thread_stopping(&h->t))
			break;
		{
			usec_t sent = mono_us();

			r = etcd_lease_keepalive(e, lease, &left);
			if (r == 0) {
				renewed = sent;
				wait = h->ttl_s * USEC_PER_SEC / 3;
				continue;
			}
		}
		if (r != -ENOENT && mono_us() - renewed < h->ttl_s * USEC_PER_SEC * 2 / 3) {
			etcd_failed(h, "did not renew the lease", r);
			wait = RENEW_RETRY; /* again soon, before it is too late */
			continue;
		}
		/* no renewal for two thirds of the lease: another may lead
		 * soon; stop serving first */
		log_warn("stepping down: the lease of term %lld %s", (long long) term,
			 r == -ENOENT ? "ended" : "could not be renewed");
		leading = false;
		lease = 0;
		tell(h, false, (uint64_t) term);
	}
	if (leading) /* hand over now, not when the lease ends */
		etcd_lease_revoke(e, lease);
	return NULL;
}

int ha_start(struct loop *l, struct master *m, const struct ha_config *cfg, struct ha **ret)
{
	struct ha *h;
	int r;

	*ret = NULL;
	if (!cfg->lease_ttl_s || strlen(cfg->endpoints) >= sizeof(h->endpoints) ||
	    strlen(cfg->address) >= sizeof(h->address) || strlen(cfg->cluster_id) > 256 ||
	    !cfg->cluster_id[0] || strchr(cfg->cluster_id, '/'))
		return -EINVAL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->loop = l;
	h->m = m;
	h->ttl_s = cfg->lease_ttl_s;
	snprintf(h->endpoints, sizeof(h->endpoints), "%s", cfg->endpoints);
	snprintf(h->address, sizeof(h->address), "%s", cfg->address);
	snprintf(h->view_key, sizeof(h->view_key), "/kvcache/%s/master_view", cfg->cluster_id);
	r = etcd_new(h->endpoints, ETCD_TIMEOUT, &h->etcd); /* checks them; no network yet */
	if (r == 0)
		r = handoff_thread_start(&h->t, ha_main, h);
	if (r < 0) {
		etcd_free(h->etcd);
		free(h);
		return r;
	}
	*ret = h;
	return 0;
}

void ha_stop(struct ha *h)
{
	if (!h)
		return;
	handoff_thread_stop(&h->t);
	etcd_free(h->etcd);
	free(h);
}
