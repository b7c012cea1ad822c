/* SPDX-License-Identifier: MIT */
/*
 * GET /metrics and GET /health on libmicrohttpd's own thread.  Bad requests
 * (other methods, other paths, headers past the memory limit, connections
 * that send nothing) get the library's answers and limits; the loop is
 * never involved.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define MAX_CONNECTIONS 16
#define CONNECTION_TIMEOUT_S 5
#define CONNECTION_MEMORY 16384 /* headers beyond this are refused */

struct metrics {
	struct MHD_Daemon *d;
	pthread_mutex_t lock; /* text, len */
	char *text;
	size_t len;
	int serving; /* atomic */
};

/* ---- text ---- */

void mtext_printf(struct mtext *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->failed)
		return;
	for (;;) {
		size_t room = t->cap - t->len;

		va_start(ap, fmt);
		n = vsnprintf(t->buf ? t->buf + t->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = true;
			return;
		}
		if ((size_t) n < room) {
			t->len += (size_t) n;
			return;
		}
		size_t cap = t->cap ? t->cap * 2 : 4096;
		while (cap - t->len <= (size_t) n)
			cap *= 2;
		char *b = realloc(t->buf, cap);
		if (!b) {
			t->failed = true;
			return;
		}
		t->buf = b;
		t->cap = cap;
	}
}

void mtext_sample(struct mtext *t, const char *family, const char *type, const char *help,
		  const char *labels, uint64_t value)
{
	if (strcmp(t->family, family) != 0) {
		mtext_printf(t, "# HELP %s %s\n# TYPE %s %s\n", family, help, family, type);
		snprintf(t->family, sizeof(t->family), "%s", family);
	}
	if (labels && *labels)
		mtext_printf(t, "%s{%s} %" PRIu64 "\n", family, labels, value);
	else
		mtext_printf(t, "%s %" PRIu64 "\n", family, value);
}

void mtext_done(struct mtext *t)
{
	free(t->buf);
	*t = (struct mtext) { 0 };
}

/* ---- serving ---- */

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned status, const char *type,
			      const char *body, size_t len)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **state)
{
	struct metrics *m = cls;
	static const char text_type[] = "text/plain; version=0.0.4; charset=utf-8";
	enum MHD_Result ret;

	(void) version;
	(void) upload;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "GET only\n", 9);
	if (*upload_size) { /* a GET with a body: ignore it */
		*upload_size = 0;
		return MHD_YES;
	}
	(void) state;
	if (strcmp(url, "/health") == 0) {
		if (__atomic_load_n(&m->serving, __ATOMIC_ACQUIRE))
			return answer(conn, MHD_HTTP_OK, "text/plain", "ok\n", 3);
		return answer(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "not serving\n", 12);
	}
	if (strcmp(url, "/metrics") != 0)
		return answer(conn, MHD_HTTP_NOT_FOUND, "text/plain", "/metrics or /health\n", 20);
	pthread_mutex_lock(&m->lock);
	if (m->text)
		ret = answer(conn, MHD_HTTP_OK, text_type, m->text, m->len);
	else
		ret = answer(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "starting\n", 9);
	pthread_mutex_unlock(&m->lock);
	return ret;
}

int metrics_start(const char *address, uint16_t port, struct metrics **ret)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6, .sin6_port = htons(port) };
	const struct sockaddr *sa;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;
	struct metrics *m;

	if (port == 0 || !address)
		return -EINVAL;
	if (inet_pton(AF_INET, address, &sin.sin_addr) == 1) {
		sa = (const struct sockaddr *) &sin;
	} else if (inet_pton(AF_INET6, address, &sin6.sin6_addr) == 1) {
		sa = (const struct sockaddr *) &sin6;
		flags |= MHD_USE_IPv6;
	} else {
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	errno = 0;
	m->d = MHD_start_daemon(flags, port, NULL, NULL, handle, m,
				MHD_OPTION_SOCK_ADDR, sa,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned) MAX_CONNECTIONS,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned) MAX_CONNECTIONS / 2,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) CONNECTION_TIMEOUT_S,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) CONNECTION_MEMORY,
				MHD_OPTION_END);
	if (!m->d) {
		int r = errno ? -errno : -EADDRINUSE;

		pthread_mutex_destroy(&m->lock);
		free(m);
		return r;
	}
	*ret = m;
	return 0;
}

void metrics_publish(struct metrics *m, struct mtext *t)
{
	char *old = NULL;

	if (!m || t->failed) {
		mtext_done(t);
		return;
	}
	if (pthread_mutex_trylock(&m->lock) != 0) {
		mtext_done(t); /* being read: the next one comes soon */
		return;
	}
	old = m->text;
	m->text = t->buf;
	m->len = t->len;
	pthread_mutex_unlock(&m->lock);
	free(old);
	*t = (struct mtext) { 0 };
}

void metrics_set_serving(struct metrics *m, bool serving)
{
	if (m)
		__atomic_store_n(&m->serving, serving ? 1 : 0, __ATOMIC_RELEASE);
}

void metrics_stop(struct metrics *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	pthread_mutex_destroy(&m->lock);
	free(m->text);
	free(m);
}
