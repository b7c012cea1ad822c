/* SPDX-License-Identifier: MIT */
/*
 * Membership through etcd (--metadata-server etcd://HOST:PORT[,...][/ID]).
 *
 * The node keeps /kvcache/<ID>/nodes/<node-id> alive with a lease of its
 * own (TTL --client-ttl) and reads the prefix again whenever it changes (a
 * watch from the revision it read), so joins and departures, a node
 * killed included once its lease ends, reach kvcachectl cluster.  All of
 * it runs on a thread of its own with bounded calls (net/etcd.h): etcd
 * down means the member list frozen as last read, and local service and
 * the masters' directory unchanged.  The loop takes the newest list with
 * one atomic exchange.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "etcd.h"
#include "handoff.h"
#include "kvc-config.h"
#include "log.h"
#include "members.h"
#include "node-private.h"

#define LOG_TOPIC "cluster"

#define MEMBERS_CALL (1 * USEC_PER_SEC) /* each call to etcd */
#define MEMBERS_RETRY (500 * USEC_PER_MSEC)

struct members {
	char endpoints[NET_HOST_MAX + 8];
	char prefix[NET_HOST_MAX];
	char key[NET_HOST_MAX + PEER_MAX_ID];
	char value[1024];
	unsigned ttl_s;
	struct handoff_thread t;
	struct etcd *etcd;           /* the thread's */
	struct member_list *fresh;   /* atomic: the thread's newest, not yet taken */
	struct member_list *current; /* the loop's */
	struct log_ratelimit down;
	uint64_t lists, failures;    /* atomic */
};



static void field(json_object *o, const char *name, char *dst, size_t cap)
{
	json_object *f;

	if (json_object_object_get_ex(o, name, &f) && json_object_is_type(f, json_type_string))
		snprintf(dst, cap, "%s", json_object_get_string(f));
}

/* One key of the prefix: a member, if its value is one. */
static void add_member(void *u, const char *key, const char *value)
{
	struct member_list *l = u;
	json_object *o = json_tokener_parse(value);
	struct member *m;

	(void) key;
	if (o && l->n < MEMBERS_MAX) {
		m = &l->m[l->n];
		memset(m, 0, sizeof(*m));
		field(o, "id", m->id, sizeof(m->id));
		field(o, "address", m->address, sizeof(m->address));
		field(o, "transport", m->transport, sizeof(m->transport));
		field(o, "version", m->version, sizeof(m->version));
		if (m->id[0] && m->address[0])
			l->n++;
	}
	json_object_put(o);
}

static void publish(struct members *ms, struct member_list *l)
{
	free(__atomic_exchange_n(&ms->fresh, l, __ATOMIC_ACQ_REL));
	__atomic_add_fetch(&ms->lists, 1, __ATOMIC_RELAXED);
}

static void failed(struct members *ms, const char *what, int r)
{
	__atomic_add_fetch(&ms->failures, 1, __ATOMIC_RELAXED);
	log_msg_ratelimited(&ms->down, LOG_LVL_WARN, LOG_TOPIC,
			    "etcd %s %s: %s; the member list stays as last read", ms->endpoints,
			    what, strerror(-r));
}

static void *members_main(void *arg)
{
	struct members *ms = arg;
	struct etcd *e = ms->etcd;
	int64_t lease = 0, rev = 0, left;
	usec_t renew_at = 0;
	int r;

	loop_helper_thread("members", LOOP_HELPER_NORMAL);
	while (!handoff_thread_stopping(&ms->t)) {
		struct member_list *l;
		usec_t now = mono_us();

		if (!lease) {
			r = etcd_lease_grant(e, ms->ttl_s, &lease);
			if (r == 0)
				r = etcd_put(e, ms->key, ms->value, lease);
			if (r < 0) {
				failed(ms, "did not take this node's key", r);
				lease = 0;
				handoff_thread_pause(&ms->t, MEMBERS_RETRY);
				continue;
			}
			renew_at = now + ms->ttl_s * USEC_PER_SEC / 3;
		} else if (now >= renew_at) {
			r = etcd_lease_keepalive(e, lease, &left);
			if (r == -ENOENT) { /* it ended (etcd was away): again */
				lease = 0;
				continue;
			}
			if (r < 0)
				failed(ms, "did not renew this node's lease", r);
			renew_at = now + (r == 0 ? ms->ttl_s * USEC_PER_SEC / 3 : MEMBERS_RETRY);
		}
		l = calloc(1, sizeof(*l));
		if (!l) {
			handoff_thread_pause(&ms->t, MEMBERS_RETRY);
			continue;
		}
		r = etcd_list(e, ms->prefix, MEMBERS_MAX, add_member, l, &rev);
		if (r < 0) {
			free(l);
			failed(ms, "did not list the members", r);
			handoff_thread_pause(&ms->t, MEMBERS_RETRY);
			continue;
		}
		publish(ms, l);
		/* until something changes, or the lease wants renewing */
		now = mono_us();
		if (renew_at > now && !handoff_thread_stopping(&ms->t)) {
			r = etcd_wait_change(e, ms->prefix, rev, renew_at - now);
			if (r < 0 && r != -ETIMEDOUT) {
				failed(ms, "stopped watching the members", r);
				handoff_thread_pause(&ms->t, MEMBERS_RETRY);
			}
		}
	}
	if (lease) /* leave now, not when the lease ends */
		etcd_lease_revoke(e, lease);
	return NULL;
}

int members_start(struct node *n, const char *spec, unsigned ttl_s, char *err, size_t err_len)
{
	struct members *ms;
	const char *eps = spec + strlen("etcd://"), *slash = strchr(eps, '/');
	const char *id = slash && slash[1] ? slash + 1 : "kvcache";
	size_t len = slash ? (size_t) (slash - eps) : strlen(eps);
	json_object *v;
	int r;

	if (!len || len >= sizeof(ms->endpoints) || strlen(id) > 128 || strchr(id, '/')) {
		snprintf(err, err_len,
			 "--metadata-server %s: expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER_ID]",
			 spec);
		return -EINVAL;
	}
	ms = calloc(1, sizeof(*ms));
	if (!ms)
		return -ENOMEM;
	memcpy(ms->endpoints, eps, len);
	if (etcd_new(ms->endpoints, MEMBERS_CALL, &ms->etcd) < 0) { /* checks them; no network */
		free(ms);
		snprintf(err, err_len,
			 "--metadata-server %s: expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER_ID]",
			 spec);
		return -EINVAL;
	}
	ms->ttl_s = ttl_s ? ttl_s : 10;
	snprintf(ms->prefix, sizeof(ms->prefix), "/kvcache/%s/nodes/", id);
	snprintf(ms->key, sizeof(ms->key), "%s%s", ms->prefix, n->id);
	v = json_object_new_object();
	json_object_object_add(v, "id", json_object_new_string(n->id));
	json_object_object_add(v, "address", json_object_new_string(n->address));
	json_object_object_add(v, "transport", json_object_new_string(n->transport));
	json_object_object_add(v, "version", json_object_new_string(KVC_VERSION));
	snprintf(ms->value, sizeof(ms->value), "%s",
		 json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
	json_object_put(v);
	r = handoff_thread_start(&ms->t, members_main, ms);
	if (r < 0) {
		etcd_free(ms->etcd);
		free(ms);
		snprintf(err, err_len, "cannot start the membership thread: %s", strerror(-r));
		return r;
	}
	n->members = ms;
	log_notice("members through etcd %s, as %s", ms->endpoints, ms->key);
	return 0;
}

void members_stop(struct node *n)
{
	struct members *ms = n->members;

	if (!ms)
		return;
	handoff_thread_stop(&ms->t);
	etcd_free(ms->etcd);
	free(ms->fresh);
	free(ms->current);
	free(ms);
	n->members = NULL;
}

const struct member_list *members_view(struct node *n)
{
	struct members *ms = n->members;
	struct member_list *l;

	if (!ms)
		return NULL;
	l = __atomic_exchange_n(&ms->fresh, NULL, __ATOMIC_ACQ_REL);
	if (l) {
		free(ms->current);
		ms->current = l;
	}
	return ms->current;
}

void members_stats(struct node *n, void (*emit)(void *u, const char *name, uint64_t v), void *u)
{
	struct members *ms = n->members;

	if (!ms)
		return;
	emit(u, "etcd_member_lists", __atomic_load_n(&ms->lists, __ATOMIC_RELAXED));
	emit(u, "etcd_failures", __atomic_load_n(&ms->failures, __ATOMIC_RELAXED));
}
