/* SPDX-License-Identifier: MIT */
/* A client of etcd's v3 JSON gateway (etcd.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <json-c/json.h>
#include <sodium.h>

#include "etcd.h"

#define EP_MAX 280
#define BODY_MAX (4u << 20) /* an answer larger than this is not etcd's */

struct etcd {
	char ep[ETCD_MAX_ENDPOINTS][EP_MAX];
	unsigned n, cur;
	usec_t timeout;
	CURL *curl;
	struct curl_slist *hdrs;
	char *body;
	size_t len, cap;
	/* a watch: what it waits for, and whether it came */
	const char *watch_key;
	bool any;  /* any change, not only a deletion */
	bool gone;
	bool heard; /* this attempt's endpoint sent something */
};

static void __attribute__((constructor)) etcd_init_curl(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

int etcd_new(const char *endpoints, usec_t timeout, struct etcd **ret)
{
	struct etcd *e;
	const char *p = endpoints;

	*ret = NULL;
	if (!endpoints || !timeout)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	while (*p) {
		size_t len = strcspn(p, ";,");

		if (!strncmp(p, "http://", 7) && len > 7) {
			p += 7;
			len -= 7;
		}
		while (len && p[len - 1] == '/')
			len--;
		if (len) {
			if (e->n == ETCD_MAX_ENDPOINTS || len >= EP_MAX || memchr(p, ' ', len)) {
				free(e);
				return -EINVAL;
			}
			memcpy(e->ep[e->n], p, len);
			e->ep[e->n++][len] = '\0';
		}
		p += len;
		if (*p)
			p++;
	}
	if (!e->n || sodium_init() < 0) {
		free(e);
		return -EINVAL;
	}
	e->timeout = timeout;
	e->curl = curl_easy_init();
	e->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	if (!e->curl || !e->hdrs) {
		etcd_free(e);
		return -ENOMEM;
	}
	*ret = e;
	return 0;
}

void etcd_free(struct etcd *e)
{
	if (!e)
		return;
	if (e->curl)
		curl_easy_cleanup(e->curl);
	curl_slist_free_all(e->hdrs);
	free(e->body);
	free(e);
}

const char *etcd_endpoint(const struct etcd *e)
{
	return e->ep[e->cur];
}

/* ---- base64, as the gateway wants bytes ---- */

static json_object *b64(const char *s)
{
	size_t len = strlen(s), cap = sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_ORIGINAL);
	char *out = malloc(cap);
	json_object *o;

	if (!out)
		return NULL;
	sodium_bin2base64(out, cap, (const unsigned char *) s, len, sodium_base64_VARIANT_ORIGINAL);
	o = json_object_new_string(out);
	free(out);
	return o;
}

/* A base64 field of o, decoded, NUL-terminated, malloc'd (NULL: absent or
 * not base64). */
static char *unb64(json_object *o, const char *field)
{
	json_object *f;
	const char *s;
	size_t len, got;
	char *out;

	if (!json_object_object_get_ex(o, field, &f))
		return strdup(""); /* the gateway leaves out empty values */
	s = json_object_get_string(f);
	len = strlen(s);
	out = malloc(len + 1);
	if (!out)
		return NULL;
	if (sodium_base642bin((unsigned char *) out, len, s, len, NULL, &got, NULL,
			      sodium_base64_VARIANT_ORIGINAL) < 0) {
		free(out);
		return NULL;
	}
	out[got] = '\0';
	return out;
}

/* An int64 the gateway writes as a string (or leaves out when 0). */
static int64_t num(json_object *o, const char *field)
{
	json_object *f;

	if (!o || !json_object_object_get_ex(o, field, &f))
		return 0;
	return json_object_get_int64(f);
}

static json_object *child(json_object *o, const char *field)
{
	json_object *f = NULL;

	return o && json_object_object_get_ex(o, field, &f) ? f : NULL;
}

static void add(json_object *o, const char *field, json_object *v)
{
	json_object_object_add(o, field, v);
}

static json_object *id_string(int64_t id)
{
	char s[24];

	snprintf(s, sizeof(s), "%lld", (long long) id);
	return json_object_new_string(s);
}

/* ---- HTTP ---- */

static size_t on_body(char *p, size_t size, size_t n, void *u);

/* The answer of one watch line: has key gone? */
static void watch_line(struct etcd *e, const char *line, size_t len)
{
	json_object *o = json_tokener_parse(line), *ev;

	(void) len;
	ev = child(child(o, "result"), "events");
	if (ev && !json_object_is_type(ev, json_type_array))
		ev = NULL;
	for (size_t i = 0; ev && i < json_object_array_length(ev); i++) {
		json_object *x = json_object_array_get_idx(ev, i);
		json_object *t = child(x, "type");

		if (e->any || (t && !strcmp(json_object_get_string(t), "DELETE")))
			e->gone = true;
	}
	json_object_put(o);
}

static size_t on_body(char *p, size_t size, size_t n, void *u)
{
	struct etcd *e = u;
	size_t len = size * n;

	e->heard = true;
	if (e->len + len + 1 > BODY_MAX)
		return 0; /* not etcd's: the call fails */
	if (e->len + len + 1 > e->cap) {
		size_t cap = e->cap ? e->cap : 4096;
		char *b;

		while (cap < e->len + len + 1)
			cap *= 2;
		b = realloc(e->body, cap);
		if (!b)
			return 0;
		e->body = b;
		e->cap = cap;
	}
	memcpy(e->body + e->len, p, len);
	e->len += len;
	e->body[e->len] = '\0';
	if (e->watch_key) {
		/* a watch's answers come a line each, as they happen */
		char *nl;

		while ((nl = memchr(e->body, '\n', e->len))) {
			*nl = '\0';
			watch_line(e, e->body, (size_t) (nl - e->body));
			e->len -= (size_t) (nl + 1 - e->body);
			memmove(e->body, nl + 1, e->len + 1);
		}
		if (e->gone)
			return 0; /* enough: the transfer stops */
	}
	return len;
}

/* POST body to /v3/<path> of each endpoint in turn until one answers,
 * within `within` in all: 0 with *ret the answer's JSON, or -errno. */
static int post_within(struct etcd *e, const char *path, json_object *body, usec_t within,
		       json_object **ret)
{
	const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
	usec_t deadline = mono_us() + within;
	unsigned first = e->cur; /* the last one that answered */
	int r = -ETIMEDOUT;

	*ret = NULL;
	for (unsigned k = 0; k < e->n; k++) {
		unsigned i = (first + k) % e->n;
		usec_t now = mono_us();
		char url[EP_MAX + 64];
		long code = 0;
		CURLcode c;

		usec_t left, slice;

		if (now >= deadline)
			break;
		/* a member that hangs (stopped, cut off) must leave time for
		 * the others: each gets its share of what is left, but a watch,
		 * which waits on purpose, all of it */
		left = deadline - now;
		slice = e->watch_key ? left : left / (e->n - k);
		snprintf(url, sizeof(url), "http://%s/v3/%s", e->ep[i], path);
		curl_easy_reset(e->curl);
		curl_easy_setopt(e->curl, CURLOPT_URL, url);
		curl_easy_setopt(e->curl, CURLOPT_NOPROXY, "*");
		curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, e->hdrs);
		curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
		curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
		curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS,
				 (long) ((slice + USEC_PER_MSEC - 1) / USEC_PER_MSEC));
		curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS,
				 (long) (left / e->n / USEC_PER_MSEC + 1));
		e->len = 0;
		e->gone = false;
		e->heard = false;
		c = curl_easy_perform(e->curl);
		if (e->watch_key && e->gone)
			return 0;
		if (c != CURLE_OK) {
			r = c == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
			    : c == CURLE_COULDNT_CONNECT   ? -ECONNREFUSED
							   : -EIO;
			if (e->watch_key && c == CURLE_OPERATION_TIMEDOUT) {
				/* a watch waits on purpose: its time is up.  A member
				 * that said nothing at all may hang: the next call
				 * starts elsewhere */
				if (!e->heard)
					e->cur = (i + 1) % e->n;
				return r;
			}
			e->cur = (i + 1) % e->n; /* the next call starts elsewhere */
			continue;
		}
		curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &code);
		e->cur = i;
		*ret = e->len ? json_tokener_parse(e->body) : NULL;
		if (!*ret)
			return -EIO;
		if (code == 200)
			return 0;
		/* gRPC's NotFound (a lease that ended) comes as 404 */
		r = code == 404 || num(*ret, "code") == 5 ? -ENOENT : -EIO;
		json_object_put(*ret);
		*ret = NULL;
		return r;
	}
	return r;
}

static int post(struct etcd *e, const char *path, json_object *body, json_object **ret)
{
	int r = post_within(e, path, body, e->timeout, ret);

	json_object_put(body);
	return r;
}

/* ---- the answers: what etcd (or whatever answers there) sent ---- */

static int parse_grant(json_object *a, int64_t *ret_id)
{
	*ret_id = num(a, "ID");
	return *ret_id ? 0 : -EIO;
}

static int parse_keepalive(json_object *a, int64_t *ret_ttl)
{
	*ret_ttl = num(child(a, "result"), "TTL");
	return *ret_ttl > 0 ? 0 : -ENOENT; /* an ended lease is renewed to 0 */
}

/* The first element of array o, or NULL. */
static json_object *first(json_object *o)
{
	return o && json_object_is_type(o, json_type_array) && json_object_array_length(o)
		       ? json_object_array_get_idx(o, 0)
		       : NULL;
}

static int parse_create(json_object *a, int64_t *ret_rev)
{
	json_object *kv;

	if (json_object_get_boolean(child(a, "succeeded"))) {
		*ret_rev = num(child(a, "header"), "revision");
		return 0;
	}
	kv = first(child(child(first(child(a, "responses")), "response_range"), "kvs"));
	*ret_rev = kv ? num(kv, "create_revision") : 0;
	return -EEXIST;
}

static int parse_get(json_object *a, char *buf, size_t cap, int64_t *ret_rev, int64_t *ret_at)
{
	json_object *kv = first(child(a, "kvs"));
	char *v;
	int r = 0;

	if (ret_at)
		*ret_at = num(child(a, "header"), "revision");
	if (!kv)
		return -ENOENT;
	v = unb64(kv, "value");
	if (!v)
		r = -EIO;
	else if (strlen(v) >= cap)
		r = -ENOSPC;
	else
		strcpy(buf, v);
	if (ret_rev)
		*ret_rev = num(kv, "create_revision");
	free(v);
	return r;
}

static int parse_list(json_object *a, void (*fn)(void *u, const char *key, const char *value),
		      void *u, int64_t *ret_rev)
{
	json_object *kvs = child(a, "kvs");
	int n = 0;

	if (ret_rev)
		*ret_rev = num(child(a, "header"), "revision");
	if (!kvs || !json_object_is_type(kvs, json_type_array))
		return 0;
	for (size_t i = 0; i < json_object_array_length(kvs); i++) {
		json_object *kv = json_object_array_get_idx(kvs, i);
		char *k = unb64(kv, "key"), *v = unb64(kv, "value");

		if (k && v) {
			fn(u, k, v);
			n++;
		}
		free(k);
		free(v);
	}
	return n;
}

static void ignore_kv(void *u, const char *key, const char *value)
{
	size_t *n = u;

	*n += strlen(key) + strlen(value);
}

int etcd_fuzz_answer(const uint8_t *data, size_t len)
{
	json_tokener *tok = json_tokener_new();
	struct etcd e = { .watch_key = "k", .any = false };
	json_object *a;
	char buf[64];
	int64_t x;
	size_t n = 0;

	if (!tok)
		return -ENOMEM;
	a = json_tokener_parse_ex(tok, (const char *) data, (int) (len < INT32_MAX ? len : 0));
	json_tokener_free(tok);
	if (a) {
		parse_grant(a, &x);
		parse_keepalive(a, &x);
		parse_create(a, &x);
		parse_get(a, buf, sizeof(buf), &x, &x);
		parse_list(a, ignore_kv, &n, &x);
		num(a, "code");
		json_object_put(a);
	}
	/* and as a watch's stream, in two pieces */
	on_body((char *) data, 1, len / 2, &e);
	on_body((char *) data + len / 2, 1, len - len / 2, &e);
	free(e.body);
	return 0;
}

/* ---- the calls ---- */

int etcd_lease_grant(struct etcd *e, unsigned ttl_s, int64_t *ret_id)
{
	json_object *q = json_object_new_object(), *a;
	int r;

	add(q, "TTL", json_object_new_int64(ttl_s));
	r = post(e, "lease/grant", q, &a);
	if (r < 0)
		return r;
	r = parse_grant(a, ret_id);
	json_object_put(a);
	return r;
}

int etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ret_ttl)
{
	json_object *q = json_object_new_object(), *a;
	int r;

	add(q, "ID", id_string(id));
	r = post(e, "lease/keepalive", q, &a);
	if (r < 0)
		return r;
	r = parse_keepalive(a, ret_ttl);
	json_object_put(a);
	return r;
}

int etcd_lease_revoke(struct etcd *e, int64_t id)
{
	json_object *q = json_object_new_object(), *a;
	int r;

	add(q, "ID", id_string(id));
	r = post(e, "lease/revoke", q, &a);
	json_object_put(a);
	return r;
}

static json_object *put_request(const char *key, const char *value, int64_t lease)
{
	json_object *p = json_object_new_object();

	add(p, "key", b64(key));
	add(p, "value", b64(value));
	if (lease)
		add(p, "lease", id_string(lease));
	return p;
}

int etcd_create(struct etcd *e, const char *key, const char *value, int64_t lease,
		int64_t *ret_rev)
{
	json_object *q = json_object_new_object(), *a, *cmp = json_object_new_object();
	json_object *ok = json_object_new_object(), *no = json_object_new_object();
	json_object *rng = json_object_new_object(), *arr;
	int r;

	add(cmp, "key", b64(key));
	add(cmp, "target", json_object_new_string("CREATE"));
	add(cmp, "result", json_object_new_string("EQUAL"));
	add(cmp, "create_revision", json_object_new_string("0"));
	arr = json_object_new_array();
	json_object_array_add(arr, cmp);
	add(q, "compare", arr);
	add(ok, "request_put", put_request(key, value, lease));
	arr = json_object_new_array();
	json_object_array_add(arr, ok);
	add(q, "success", arr);
	add(rng, "key", b64(key));
	add(no, "request_range", rng);
	arr = json_object_new_array();
	json_object_array_add(arr, no);
	add(q, "failure", arr);
	r = post(e, "kv/txn", q, &a);
	if (r < 0)
		return r;
	r = parse_create(a, ret_rev);
	json_object_put(a);
	return r;
}

int etcd_put(struct etcd *e, const char *key, const char *value, int64_t lease)
{
	json_object *a;
	int r = post(e, "kv/put", put_request(key, value, lease), &a);

	json_object_put(a);
	return r;
}

int etcd_get_at(struct etcd *e, const char *key, char *buf, size_t cap, int64_t *ret_rev,
		int64_t *ret_at)
{
	json_object *q = json_object_new_object(), *a;
	int r;

	add(q, "key", b64(key));
	r = post(e, "kv/range", q, &a);
	if (r < 0)
		return r;
	r = parse_get(a, buf, cap, ret_rev, ret_at);
	json_object_put(a);
	return r;
}

int etcd_get(struct etcd *e, const char *key, char *buf, size_t cap, int64_t *ret_rev)
{
	return etcd_get_at(e, key, buf, cap, ret_rev, NULL);
}

int etcd_delete(struct etcd *e, const char *key)
{
	json_object *q = json_object_new_object(), *a;
	int r;

	add(q, "key", b64(key));
	r = post(e, "kv/deleterange", q, &a);
	json_object_put(a);
	return r;
}

/* The first key past every key under prefix: the prefix with its last
 * byte one more (malloc'd). */
static char *prefix_end(const char *prefix)
{
	size_t len = strlen(prefix);
	char *end = len ? strdup(prefix) : NULL;

	if (end)
		end[len - 1]++;
	return end;
}

int etcd_list(struct etcd *e, const char *prefix, size_t max,
	      void (*fn)(void *u, const char *key, const char *value), void *u, int64_t *ret_rev)
{
	json_object *q = json_object_new_object(), *a;
	char *end = prefix_end(prefix);
	int r, n = 0;

	if (!end) {
		json_object_put(q);
		return -EINVAL;
	}
	add(q, "key", b64(prefix));
	add(q, "range_end", b64(end));
	add(q, "limit", json_object_new_int64((int64_t) max));
	add(q, "sort_order", json_object_new_string("ASCEND"));
	add(q, "sort_target", json_object_new_string("KEY"));
	free(end);
	r = post(e, "kv/range", q, &a);
	if (r < 0)
		return r;
	n = parse_list(a, fn, u, ret_rev);
	json_object_put(a);
	return n;
}

int etcd_wait_gone(struct etcd *e, const char *key, int64_t rev, usec_t wait)
{
	json_object *q, *a = NULL, *c;
	usec_t deadline = mono_us() + wait;
	int r;

	if (!rev) {
		/* is it there now, and as of which revision? */
		q = json_object_new_object();
		add(q, "key", b64(key));
		r = post(e, "kv/range", q, &a);
		if (r < 0)
			return r;
		rev = num(child(a, "header"), "revision");
		r = child(a, "kvs") ? 0 : -ENOENT;
		json_object_put(a);
		if (r == -ENOENT)
			return 0;
	}
	q = json_object_new_object();
	c = json_object_new_object();
	add(c, "key", b64(key));
	add(c, "start_revision", id_string(rev + 1));
	add(q, "create_request", c);
	e->watch_key = key;
	r = mono_us() < deadline ? post_within(e, "watch", q, deadline - mono_us(), &a)
				 : -ETIMEDOUT;
	e->watch_key = NULL;
	json_object_put(q);
	if (r == 0 && !e->gone)
		r = -ETIMEDOUT; /* the stream ended without the deletion */
	json_object_put(a);
	return r;
}

int etcd_wait_change(struct etcd *e, const char *prefix, int64_t rev, usec_t wait)
{
	json_object *q = json_object_new_object(), *c = json_object_new_object(), *a = NULL;
	char *end = prefix_end(prefix);
	int r;

	if (!end) {
		json_object_put(q);
		json_object_put(c);
		return -EINVAL;
	}
	add(c, "key", b64(prefix));
	add(c, "range_end", b64(end));
	add(c, "start_revision", id_string(rev + 1));
	add(q, "create_request", c);
	free(end);
	e->watch_key = prefix;
	e->any = true;
	r = post_within(e, "watch", q, wait, &a);
	e->watch_key = NULL;
	e->any = false;
	json_object_put(q);
	if (r == 0 && !e->gone)
		r = -ETIMEDOUT;
	json_object_put(a);
	return r;
}
