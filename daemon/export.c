/* SPDX-License-Identifier: MIT */
/*
 * kvcached's figures for Prometheus: twice a second the loop turns what
 * kvcachectl stats shows (server_export()), the clients and objects, and
 * the sampled service times of channel requests into the text format and
 * hands it to the metrics thread.  Names: kvcache_<name>_total for
 * counters, kvcache_<name> for gauges, kvcache_tier_<name> with a tier
 * label for a tier's figures; dots become underscores.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "kvc-config.h"
#include "log.h"

#define LOG_TOPIC "metrics"
#define EXPORT_PERIOD (500 * USEC_PER_MSEC)
#define MAX_FIGURES 768

struct figure {
	char family[96];
	char help[96];
	char labels[160];
	bool counter;
	uint64_t value;
};

struct exporter {
	struct server *sv;
	struct metrics *m;
	struct loop_source *timer;
	struct figure figs[MAX_FIGURES];
	size_t n;
};

static void collect(void *u, const char *name, const char *tier, enum export_kind kind,
		    uint64_t value)
{
	struct exporter *e = u;
	struct figure *f;
	char *p;

	if (e->n == MAX_FIGURES || strncmp(name, "op.", 3) == 0)
		return; /* the service times: kvcache_op_duration_seconds */
	f = &e->figs[e->n++];
	f->labels[0] = '\0';
	if (strncmp(name, "peer.", 5) == 0 && strrchr(name, '.') > name + 5) {
		/* peer.<address>.<figure>: one family, the address a label */
		const char *what = strrchr(name, '.') + 1;

		snprintf(f->family, sizeof(f->family), "kvcache_peer_%s%s", what,
			 kind == EXPORT_COUNTER ? "_total" : "");
		snprintf(f->labels, sizeof(f->labels), "peer=\"%.*s\"",
			 (int) (what - 1 - (name + 5)), name + 5);
		snprintf(f->help, sizeof(f->help), "kvcachectl stats: peer.<address>.%s.", what);
	} else {
		snprintf(f->family, sizeof(f->family), "kvcache_%s%s%s", tier ? "tier_" : "", name,
			 kind == EXPORT_COUNTER ? "_total" : "");
		if (tier)
			snprintf(f->labels, sizeof(f->labels), "tier=\"%s\"", tier);
		snprintf(f->help, sizeof(f->help), "kvcachectl stats: %s%s%s.",
			 tier ? "<tier>" : "", tier ? "." : "", name);
	}
	for (p = f->family; *p; p++)
		if (*p == '.' || *p == '-')
			*p = '_';
	f->counter = kind == EXPORT_COUNTER;
	f->value = value;
}

static const char *const op_names[SHM_OP_MAX] = {
	[SHM_OP_NOP] = "nop",
	[SHM_OP_EXISTS] = "exists",
	[SHM_OP_ACQUIRE] = "acquire",
	[SHM_OP_RELEASE] = "release",
	[SHM_OP_RESERVE] = "reserve",
	[SHM_OP_COMMIT] = "commit",
	[SHM_OP_ABORT] = "abort",
	[SHM_OP_REMOVE] = "remove",
	[SHM_OP_BATCH_EXISTS] = "batch_exists",
	[SHM_OP_PREFIX_LOOKUP] = "prefix_lookup",
	[SHM_OP_GET_INTO] = "get_into",
	[SHM_OP_PUT_FROM] = "put_from",
};

static void histograms(struct mtext *t, const struct server *sv)
{
	static const char fam[] = "kvcache_op_duration_seconds";

	mtext_printf(t, "# HELP %s Daemon-side service time of shared-memory requests, by kind "
		     "(one request in %d is timed).\n# TYPE %s histogram\n",
		     fam, OPHIST_SAMPLE, fam);
	for (unsigned op = 1; op < SHM_OP_MAX; op++) {
		const struct ophist *h = &sv->ophist[op];
		uint64_t cum = 0;

		for (unsigned b = 0; b < OPHIST_BUCKETS; b++) {
			cum += h->bucket[b];
			if (b < OPHIST_BUCKETS - 1)
				mtext_printf(t, "%s_bucket{op=\"%s\",le=\"%g\"} %llu\n", fam, op_names[op],
					     (double) ophist_bounds_ns[b] / 1e9,
					     (unsigned long long) cum);
			else
				mtext_printf(t, "%s_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", fam,
					     op_names[op], (unsigned long long) cum);
		}
		mtext_printf(t, "%s_sum{op=\"%s\"} %.9f\n%s_count{op=\"%s\"} %llu\n", fam,
			     op_names[op], (double) h->sum_ns / 1e9, fam, op_names[op],
			     (unsigned long long) h->count);
	}
}

static int by_family(const void *a, const void *b)
{
	return strcmp(((const struct figure *) a)->family, ((const struct figure *) b)->family);
}

/* Build the whole text: every family's samples together, as the format
 * wants. */
static void build(struct exporter *e, struct mtext *t)
{
	struct server *sv = e->sv;
	struct store_info info;

	store_info(sv->st, &info);
	e->n = 0;
	server_export(sv, collect, e);
	mtext_sample(t, "kvcache_info", "gauge", "kvcached's version.", "version=\"" KVC_VERSION "\"",
		     1);
	mtext_sample(t, "kvcache_uptime_seconds", "gauge", "Seconds since kvcached started.", "",
		     (loop_now(sv->loop) - sv->started) / USEC_PER_SEC);
	mtext_sample(t, "kvcache_clients", "gauge", "Connected clients.", "", sv->n_sessions);
	mtext_sample(t, "kvcache_objects", "gauge", "Objects stored, all tiers.", "",
		     info.objects);
	/* a family's samples together: sorted by family, O(n log n) */
	qsort(e->figs, e->n, sizeof(e->figs[0]), by_family);
	for (size_t i = 0; i < e->n; i++) {
		const struct figure *f = &e->figs[i];

		mtext_sample(t, f->family, f->counter ? "counter" : "gauge", f->help, f->labels,
			     f->value);
	}
	histograms(t, sv);
}

static void on_timer(struct loop_source *s, void *u)
{
	struct exporter *e = u;
	struct mtext t = { 0 };

	build(e, &t);
	metrics_publish(e->m, &t);
	loop_timer_arm(s, loop_now(e->sv->loop) + EXPORT_PERIOD);
}

int export_new(struct server *sv, const struct config *cfg, struct exporter **ret)
{
	struct exporter *e;
	int r;

	*ret = NULL;
	if (!cfg->metrics_port)
		return 0;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->sv = sv;
	r = metrics_start(cfg->metrics_address, (uint16_t) cfg->metrics_port, &e->m);
	if (r < 0) {
		log_error_errno(r, "Cannot serve metrics on %s:%u", cfg->metrics_address,
				cfg->metrics_port);
		free(e);
		return r;
	}
	r = loop_add_timer(sv->loop, on_timer, e, &e->timer);
	if (r < 0) {
		metrics_stop(e->m);
		free(e);
		return r;
	}
	on_timer(e->timer, e); /* the first text now: /metrics answers from the start */
	log_notice("metrics on http://%s:%u/metrics", cfg->metrics_address, cfg->metrics_port);
	*ret = e;
	return 0;
}

void export_serving(struct exporter *e, bool serving)
{
	if (e)
		metrics_set_serving(e->m, serving);
}

void export_free(struct exporter *e)
{
	if (!e)
		return;
	metrics_set_serving(e->m, false);
	metrics_stop(e->m);
	free(e); /* its timer goes with the loop */
}
