/* SPDX-License-Identifier: MIT */
/*
 * Administrative calls.  Results point into the unpacked response, which is
 * kept alive behind the public struct and freed with it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client-private.h"

struct status_priv {
	struct kvc_status pub;
	Kvc__Response *resp;
	struct kvc_tier_status tiers[];
};

int kvc_status_get(struct kvc_client *c, struct kvc_status **ret)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Response *resp;
	Kvc__StatusResp *s;
	struct status_priv *p;
	int r;

	if (!c || !ret)
		return -EINVAL;
	q.op = KVC__OP__OP_STATUS;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_STATUS) {
		kvc__response__free_unpacked(resp, NULL);
		return -EPROTO;
	}
	s = resp->status;
	p = calloc(1, sizeof(*p) + s->n_tiers * sizeof(p->tiers[0]));
	if (!p) {
		kvc__response__free_unpacked(resp, NULL);
		return -ENOMEM;
	}
	p->resp = resp;
	p->pub = (struct kvc_status) {
		.version = s->version,
		.socket = s->socket,
		.uptime_s = s->uptime_s,
		.objects = s->objects,
		.pid = s->pid,
		.clients = s->clients,
		.hugepages = s->hugepages,
		.protocol_major = s->protocol_major,
		.protocol_minor = s->protocol_minor,
		.layout_version = s->layout_version,
		.n_tiers = s->n_tiers,
		.tiers = p->tiers,
		.recovering = s->recovering,
		.recovered = s->recovered,
		.recovery_total = s->recovery_total,
		.numa_node = s->numa_bound ? (int) s->numa_node : -1,
	};
	for (size_t i = 0; i < s->n_tiers; i++)
		p->tiers[i] = (struct kvc_tier_status) {
			.name = s->tiers[i]->name,
			.capacity = s->tiers[i]->capacity,
			.used = s->tiers[i]->used,
			.objects = s->tiers[i]->objects,
			.high_watermark = s->tiers[i]->high_watermark,
		};
	*ret = &p->pub;
	return 0;
}

struct cluster_priv {
	struct kvc_cluster pub;
	Kvc__Response *resp;
	struct kvc_node nodes[];
};

int kvc_cluster_get(struct kvc_client *c, struct kvc_cluster **ret)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Response *resp;
	Kvc__ClusterResp *x;
	struct cluster_priv *p;
	int r;

	if (!c || !ret)
		return -EINVAL;
	q.op = KVC__OP__OP_CLUSTER;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_CLUSTER) {
		kvc__response__free_unpacked(resp, NULL);
		return -EPROTO;
	}
	x = resp->cluster;
	p = calloc(1, sizeof(*p) + x->n_nodes * (sizeof(p->nodes[0]) + sizeof(char *)));
	if (!p) {
		kvc__response__free_unpacked(resp, NULL);
		return -ENOMEM;
	}
	p->resp = resp;
	p->pub = (struct kvc_cluster) {
		.self = x->self,
		.n_masters = x->n_masters,
		.masters = (const char *const *) x->masters,
		.masters_up = x->masters_up,
		.n_nodes = x->n_nodes,
		.nodes = p->nodes,
		.versions = (const char *const *) (p->nodes + x->n_nodes),
	};
	for (size_t i = 0; i < x->n_nodes; i++)
		p->nodes[i] = (struct kvc_node) {
			.id = x->nodes[i]->id,
			.address = x->nodes[i]->address,
			.state = x->nodes[i]->state,
			.transport = x->nodes[i]->transport,
			.capacity = x->nodes[i]->capacity,
			.used = x->nodes[i]->used,
			.objects = x->nodes[i]->objects,
		};
	for (size_t i = 0; i < x->n_nodes; i++)
		((const char **) (p->nodes + x->n_nodes))[i] = x->nodes[i]->version;
	*ret = &p->pub;
	return 0;
}

void kvc_cluster_free(struct kvc_cluster *v)
{
	struct cluster_priv *p = (struct cluster_priv *) v;

	if (!v)
		return;
	kvc__response__free_unpacked(p->resp, NULL);
	free(p);
}

void kvc_status_free(struct kvc_status *s)
{
	struct status_priv *p = (struct status_priv *) s;

	if (!s)
		return;
	kvc__response__free_unpacked(p->resp, NULL);
	free(p);
}

/* Arrays handed out by stats and list carry their response in a hidden
 * header just before element 0. */
struct array_priv {
	Kvc__Response *resp;
	max_align_t items[];
};

static void *array_new(Kvc__Response *resp, size_t n, size_t size)
{
	struct array_priv *p = calloc(1, sizeof(*p) + (n ? n : 1) * size);

	if (!p)
		return NULL;
	p->resp = resp;
	return p->items;
}

static void array_free(void *items)
{
	struct array_priv *p;

	if (!items)
		return;
	p = (struct array_priv *) ((char *) items - offsetof(struct array_priv, items));
	if (p->resp)
		kvc__response__free_unpacked(p->resp, NULL);
	free(p);
}

int kvc_stats_get(struct kvc_client *c, struct kvc_counter **ret, size_t *ret_n)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Response *resp;
	struct kvc_counter *v;
	int r;

	if (!c || !ret || !ret_n)
		return -EINVAL;
	q.op = KVC__OP__OP_STATS;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_STATS) {
		kvc__response__free_unpacked(resp, NULL);
		return -EPROTO;
	}
	v = array_new(resp, resp->stats->n_counters, sizeof(*v));
	if (!v) {
		kvc__response__free_unpacked(resp, NULL);
		return -ENOMEM;
	}
	for (size_t i = 0; i < resp->stats->n_counters; i++)
		v[i] = (struct kvc_counter) {
			.name = resp->stats->counters[i]->name,
			.value = resp->stats->counters[i]->value,
		};
	*ret_n = resp->stats->n_counters;
	*ret = v;
	return 0;
}

void kvc_stats_free(struct kvc_counter *v)
{
	array_free(v);
}

/* Keys as they arrive, copied: key texts back to back (offsets, as the
 * buffer moves), then the final array. */
struct list_acc {
	struct kvc_key_info *items;
	size_t *key_at;
	size_t n, cap;
	char *text;
	size_t text_len, text_cap;
};

static int acc_add(struct list_acc *a, const Kvc__KeyInfo *k)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		struct kvc_key_info *it = realloc(a->items, cap * sizeof(*it));
		size_t *at;

		if (!it)
			return -ENOMEM;
		a->items = it;
		at = realloc(a->key_at, cap * sizeof(*at));
		if (!at)
			return -ENOMEM;
		a->key_at = at;
		a->cap = cap;
	}
	if (a->text_len + k->key.len + 1 > a->text_cap) {
		size_t cap = a->text_cap ? a->text_cap : 4096;
		char *t;

		while (cap < a->text_len + k->key.len + 1)
			cap *= 2;
		t = realloc(a->text, cap);
		if (!t)
			return -ENOMEM;
		a->text = t;
		a->text_cap = cap;
	}
	memcpy(a->text + a->text_len, k->key.data, k->key.len);
	a->text[a->text_len + k->key.len] = '\0';
	a->key_at[a->n] = a->text_len;
	a->text_len += k->key.len + 1;
	a->items[a->n++] = (struct kvc_key_info) {
		.size = k->size,
		.state = (int) k->state,
		.tier = (int) k->tier,
		.on_disk = k->on_disk,
	};
	return 0;
}

static void acc_free(struct list_acc *a)
{
	free(a->items);
	free(a->key_at);
	free(a->text);
}

/*
 * A listing a slice of the daemon's index at a time (ListReq.slices): each
 * answer is a bounded walk, so a large index never holds the daemon's loop;
 * the keys wanted are kept from the answers as they come, and the rest of
 * the walk only counts (count_only).  A daemon that does not slice answers
 * everything at once (more is never set).
 */
static int list(struct kvc_client *c, const char *prefix, bool exact, size_t limit,
		struct kvc_key_info **ret, size_t *ret_n, uint64_t *ret_total)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__ListReq lq = KVC__LIST_REQ__INIT;
	struct list_acc a = { 0 };
	size_t want = limit ? limit : 1000;
	struct kvc_key_info *v;
	uint64_t total = 0;
	bool more;
	int r;

	if (!c || !ret || !ret_n || (prefix && strlen(prefix) > KVC_KEY_MAX) || limit > UINT32_MAX)
		return -EINVAL;
	if (want > 4096)
		want = 4096; /* the daemon's most a listing */
	if (prefix)
		lq.prefix = (ProtobufCBinaryData) { .len = strlen(prefix), .data = (uint8_t *) prefix };
	lq.limit = (uint32_t) limit;
	lq.exact = exact;
	lq.slices = !exact;
	q.op = KVC__OP__OP_LIST;
	q.body_case = KVC__REQUEST__BODY_LIST;
	q.list = &lq;
	do {
		Kvc__Response *resp;
		Kvc__ListResp *l;

		lq.count_only = a.n >= want;
		r = client_rpc(c, &q, &resp);
		if (r < 0)
			goto fail;
		if (resp->body_case != KVC__RESPONSE__BODY_LIST) {
			kvc__response__free_unpacked(resp, NULL);
			r = -EPROTO;
			goto fail;
		}
		l = resp->list;
		total += l->total;
		for (size_t i = 0; i < l->n_keys && a.n < want && r == 0; i++)
			r = acc_add(&a, l->keys[i]);
		more = l->more;
		lq.cursor = l->cursor;
		kvc__response__free_unpacked(resp, NULL);
		if (r < 0)
			goto fail;
	} while (more);
	v = array_new(NULL, a.n + (a.text_len + sizeof(*v) - 1) / sizeof(*v), sizeof(*v));
	if (!v) {
		r = -ENOMEM;
		goto fail;
	}
	if (a.text_len)
		memcpy(v + a.n, a.text, a.text_len);
	for (size_t i = 0; i < a.n; i++) {
		v[i] = a.items[i];
		v[i].key = (char *) (v + a.n) + a.key_at[i];
	}
	*ret_n = a.n;
	if (ret_total)
		*ret_total = total;
	*ret = v;
	acc_free(&a);
	return 0;
fail:
	acc_free(&a);
	return r;
}

int kvc_list(struct kvc_client *c, const char *prefix, size_t limit,
	     struct kvc_key_info **ret, size_t *ret_n, uint64_t *ret_total)
{
	return list(c, prefix, false, limit, ret, ret_n, ret_total);
}

int kvc_list_key(struct kvc_client *c, const char *key, struct kvc_key_info **ret,
		 size_t *ret_n)
{
	if (!key || !*key)
		return -EINVAL;
	return list(c, key, true, 1, ret, ret_n, NULL);
}

void kvc_list_free(struct kvc_key_info *v)
{
	array_free(v);
}

int kvc_evict(struct kvc_client *c, int tier, uint64_t bytes, uint32_t flags,
	      uint64_t *ret_bytes, uint64_t *ret_objects)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__EvictReq eq = KVC__EVICT_REQ__INIT;
	Kvc__Response *resp;
	int r;

	if (!c || tier < KVC_TIER_DEFAULT || tier > KVC_TIER_DISK || (flags & ~KVC_EVICT_ALL))
		return -EINVAL;
	eq.tier = tier;
	eq.bytes = bytes;
	eq.all = flags & KVC_EVICT_ALL;
	q.op = KVC__OP__OP_EVICT;
	q.body_case = KVC__REQUEST__BODY_EVICT;
	q.evict = &eq;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_EVICT)
		r = -EPROTO;
	else {
		if (ret_bytes)
			*ret_bytes = resp->evict->bytes;
		if (ret_objects)
			*ret_objects = resp->evict->objects;
	}
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_pin(struct kvc_client *c, const char *key, uint32_t flags, uint32_t ttl_ms)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__PinReq pq = KVC__PIN_REQ__INIT;
	Kvc__Response *resp;
	int r;

	if (!c || client_check_key(key) < 0 || (flags & ~KVC_PIN_HARD))
		return -EINVAL;
	pq.key = (ProtobufCBinaryData) { .len = strlen(key), .data = (uint8_t *) key };
	pq.hard = flags & KVC_PIN_HARD;
	pq.ttl_ms = ttl_ms;
	q.op = KVC__OP__OP_PIN;
	q.body_case = KVC__REQUEST__BODY_PIN;
	q.pin = &pq;
	r = client_rpc(c, &q, &resp);
	if (r == 0)
		kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_unpin(struct kvc_client *c, const char *key)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq kq = KVC__KEY_REQ__INIT;
	Kvc__Response *resp;
	int r;

	if (!c || client_check_key(key) < 0)
		return -EINVAL;
	kq.key = (ProtobufCBinaryData) { .len = strlen(key), .data = (uint8_t *) key };
	q.op = KVC__OP__OP_UNPIN;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &kq;
	r = client_rpc(c, &q, &resp);
	if (r == 0)
		kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_where(struct kvc_client *c, const char *key, char ***ret_nodes, size_t *ret_n)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeyReq kq = KVC__KEY_REQ__INIT;
	Kvc__Response *resp;
	size_t bytes = 0;
	char **v, *p;
	int r;

	if (!c || !ret_nodes || !ret_n || client_check_key(key) < 0)
		return -EINVAL;
	kq.key = (ProtobufCBinaryData) { .len = strlen(key), .data = (uint8_t *) key };
	q.op = KVC__OP__OP_WHERE;
	q.body_case = KVC__REQUEST__BODY_KEY;
	q.key = &kq;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	if (resp->body_case != KVC__RESPONSE__BODY_WHERE) {
		kvc__response__free_unpacked(resp, NULL);
		return -EPROTO;
	}
	for (size_t i = 0; i < resp->where->n_nodes; i++)
		bytes += strlen(resp->where->nodes[i]) + 1;
	/* one block: the pointers, then the strings */
	v = malloc((resp->where->n_nodes + 1) * sizeof(*v) + bytes);
	if (!v) {
		kvc__response__free_unpacked(resp, NULL);
		return -ENOMEM;
	}
	p = (char *) (v + resp->where->n_nodes + 1);
	for (size_t i = 0; i < resp->where->n_nodes; i++) {
		size_t len = strlen(resp->where->nodes[i]) + 1;

		memcpy(p, resp->where->nodes[i], len);
		v[i] = p;
		p += len;
	}
	v[resp->where->n_nodes] = NULL;
	*ret_n = resp->where->n_nodes;
	*ret_nodes = v;
	kvc__response__free_unpacked(resp, NULL);
	return 0;
}

int kvc_push(struct kvc_client *c, const char *key, const char *node_id)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__PushReq pq = KVC__PUSH_REQ__INIT;
	Kvc__Response *resp;
	int r;

	if (!c || client_check_key(key) < 0 || !node_id || !*node_id || strlen(node_id) > 255)
		return -EINVAL;
	pq.key = (ProtobufCBinaryData) { .len = strlen(key), .data = (uint8_t *) key };
	pq.node = (char *) node_id;
	q.op = KVC__OP__OP_PUSH;
	q.body_case = KVC__REQUEST__BODY_PUSH;
	q.push = &pq;
	r = client_rpc(c, &q, &resp);
	if (r == 0)
		kvc__response__free_unpacked(resp, NULL);
	return r;
}

/* A request naming keys (KeysReq) answered with a count (ExistsResp). */
static int keys_count_rpc(struct kvc_client *c, uint32_t op, const char *const *keys, size_t n)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__KeysReq kq = KVC__KEYS_REQ__INIT;
	ProtobufCBinaryData *kv;
	Kvc__Response *resp;
	int r;

	if (!c || (n && !keys) || n > 4096)
		return -EINVAL;
	kv = calloc(n ? n : 1, sizeof(*kv));
	if (!kv)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (client_check_key(keys[i]) < 0) {
			free(kv);
			return -EINVAL;
		}
		kv[i] = (ProtobufCBinaryData) { .len = strlen(keys[i]), .data = (uint8_t *) keys[i] };
	}
	kq.n_keys = n;
	kq.keys = kv;
	q.op = op;
	q.body_case = KVC__REQUEST__BODY_KEYS;
	q.keys = &kq;
	r = client_rpc(c, &q, &resp);
	free(kv);
	if (r < 0)
		return r;
	r = resp->body_case == KVC__RESPONSE__BODY_EXISTS ? (int) resp->exists->count : -EPROTO;
	kvc__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_prefetch(struct kvc_client *c, const char *const *keys, size_t n)
{
	return keys_count_rpc(c, KVC__OP__OP_PREFETCH, keys, n);
}

int kvc_announce(struct kvc_client *c, const char *const *keys, size_t n)
{
	return keys_count_rpc(c, KVC__OP__OP_ANNOUNCE, keys, n);
}

void kvc_where_free(char **nodes)
{
	free(nodes);
}

static int stat_value(struct kvc_client *c, const char *name, uint64_t *ret)
{
	struct kvc_counter *v;
	size_t n;
	int r = kvc_stats_get(c, &v, &n);

	if (r < 0)
		return r;
	r = -ENOENT;
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].name, name) == 0) {
			*ret = v[i].value;
			r = 0;
		}
	kvc_stats_free(v);
	return r;
}

int kvc_flush(struct kvc_client *c, int timeout_ms)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__Response *resp;
	usec_t start;
	char msg[160];
	int r;

	if (!c)
		return -EINVAL;
	q.op = KVC__OP__OP_FLUSH;
	r = client_rpc(c, &q, &resp);
	if (r < 0)
		return r;
	kvc__response__free_unpacked(resp, NULL);
	start = mono_us();
	for (;;) {
		uint64_t flushing = 0, pending = 0;

		r = stat_value(c, "disk.flush_pending", &flushing);
		if (r == 0)
			r = stat_value(c, "disk.pending", &pending);
		if (r < 0)
			return r;
		if (!flushing && !pending) {
			uint64_t unwritten = 0, err = 0;

			r = stat_value(c, "disk.flush_unwritten", &unwritten);
			if (r == 0)
				r = stat_value(c, "disk.flush_error", &err);
			if (r < 0 || unwritten == 0)
				return r == -ENOENT ? 0 : r;
			snprintf(msg, sizeof(msg), "%llu objects could not be written to the disk tier: %s",
				 (unsigned long long) unwritten, strerror(err ? (int) err : EIO));
			client_set_msg(msg);
			return err && err < 4096 ? -(int) err : -EIO;
		}
		if (timeout_ms >= 0 && mono_us() - start >= (uint64_t) timeout_ms * USEC_PER_MSEC)
			return -ETIMEDOUT;
		nanosleep(&(struct timespec) { 0, 5 * 1000 * 1000 }, NULL);
	}
}

int64_t kvc_remove_prefix(struct kvc_client *c, const char *prefix, uint32_t flags,
			  uint64_t *ret_skipped)
{
	Kvc__Request q = KVC__REQUEST__INIT;
	Kvc__RemoveReq rq = KVC__REMOVE_REQ__INIT;
	uint64_t removed = 0, skipped = 0;
	size_t len = prefix ? strnlen(prefix, KVC_KEY_MAX + 1) : 0;

	if (!c || len > KVC_KEY_MAX || (flags & ~KVC_REMOVE_FORCE))
		return -EINVAL;
	if (__atomic_load_n(&c->get_flags, __ATOMIC_RELAXED) & KVC_LOCAL_ONLY)
		flags |= WIRE_REMOVE_LOCAL;
	q.op = KVC__OP__OP_REMOVE_PREFIX;
	q.body_case = KVC__REQUEST__BODY_REMOVE;
	q.remove = &rq;
	rq.prefix = (ProtobufCBinaryData) { .len = len, .data = (uint8_t *) prefix };
	rq.flags = flags;
	for (;;) {
		Kvc__Response *resp;
		bool done;
		int r = client_rpc(c, &q, &resp);

		if (r < 0)
			return r;
		if (resp->body_case != KVC__RESPONSE__BODY_REMOVE) {
			kvc__response__free_unpacked(resp, NULL);
			return -EPROTO;
		}
		removed += resp->remove->removed;
		skipped += resp->remove->skipped;
		rq.cursor = resp->remove->cursor;
		done = resp->remove->done;
		kvc__response__free_unpacked(resp, NULL);
		if (done)
			break;
	}
	if (ret_skipped)
		*ret_skipped = skipped;
	return (int64_t) removed;
}

int64_t kvc_remove_all(struct kvc_client *c, uint32_t flags, uint64_t *ret_skipped)
{
	return kvc_remove_prefix(c, "", flags, ret_skipped);
}

const char *kvc_strerror(int err)
{
	switch (err < 0 ? -err : err) {
	case 0: return "Success";
	case ENOENT: return "No such object";
	case EEXIST: return "Object already exists";
	case ENOSPC: return "Pool is full: everything left is in use";
	case EBUSY: return "Object is in use (viewed or leased)";
	case ENOBUFS: return "Buffer too small for the object";
	case E2BIG: return "Value larger than the pool can hold";
	case EAGAIN: return "Try again";
	case ESTALE: return "Stale handle";
	case EPROTO: return "Protocol error";
	case EPROTONOSUPPORT: return "Daemon speaks an incompatible protocol version";
	case ECONNRESET: return "Connection to the daemon lost";
	case ECONNREFUSED: return "No daemon listening on the socket";
	case ETIMEDOUT: return "Timed out";
	case EINVAL: return "Invalid argument";
	case EACCES: return "Permission denied by the daemon";
	case EBADMSG: return "Checksum mismatch: stored bytes are damaged";
	case ENOMEM: return "Out of memory";
	case EMSGSIZE: return "Message too long";
	case EOPNOTSUPP: return "Operation not supported";
	case ENAMETOOLONG: return "Socket path too long";
	default: return strerror(err < 0 ? -err : err);
	}
}
