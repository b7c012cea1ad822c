/* SPDX-License-Identifier: MIT */
/*
 * The metrics endpoint of kvcached and kvcache-master: GET /metrics in the
 * Prometheus text format and GET /health, served by libmicrohttpd on its
 * own thread.  The loop never waits for it: the loop formats its figures
 * into a text (struct mtext) at a bounded rate and hands it over with
 * metrics_publish(), which never blocks; the HTTP thread serves the last
 * text handed over.
 */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct metrics;

/* A growing text; on allocation failure it stops growing and says so. */
struct mtext {
	char *buf;
	size_t len, cap;
	bool failed;
	/* the last family given a HELP and TYPE line */
	char family[96];
};

void mtext_printf(struct mtext *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One sample of family (HELP and TYPE lines the first time in a row):
 * type "counter" or "gauge"; labels "" or 'tier="dram"'. */
void mtext_sample(struct mtext *t, const char *family, const char *type, const char *help,
		  const char *labels, uint64_t value);
void mtext_done(struct mtext *t);

/* Serve on address:port (port > 0).  -EADDRINUSE, -EINVAL (address),
 * -errno. */
int metrics_start(const char *address, uint16_t port, struct metrics **ret);
/* Hand over a text (taken, and reset); dropped if the HTTP thread is
 * reading the previous one right now, as the next one comes soon. */
void metrics_publish(struct metrics *m, struct mtext *t);
/* /health: 200 while serving, 503 while starting or stopping. */
void metrics_set_serving(struct metrics *m, bool serving);
void metrics_stop(struct metrics *m); /* NULL-safe */
