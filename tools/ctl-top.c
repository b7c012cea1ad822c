/* SPDX-License-Identifier: MIT */
/*
 * kvcachectl top: a live view of a running kvcached, refreshed every
 * second from kvc_stats_get() and kvc_status_get(): operations per second
 * by kind, the hit ratio, bytes per second in and out, each tier's use and
 * evictions, clients, and the kinds of request that took the daemon
 * longest (from its sampled service times).  On a terminal it redraws in
 * place and 'q' quits; otherwise it prints plain text, one block per
 * refresh.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ctl.h"

struct sample {
	struct kvc_counter *v;
	size_t n;
	struct kvc_status *st;
	double t;
};

static volatile sig_atomic_t stop;
static struct termios saved;
static bool raw;

static void on_signal(int sig)
{
	(void) sig;
	stop = 1;
}

static void restore_terminal(void)
{
	if (raw) {
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
		raw = false;
	}
}

static double now_s(void)
{
	return (double) mono_ns() / 1e9;
}

static uint64_t get(const struct sample *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i].name, name) == 0)
			return s->v[i].value;
	return 0;
}

static double rate(const struct sample *a, const struct sample *b, const char *name)
{
	uint64_t x = get(a, name), y = get(b, name);

	return y >= x && b->t > a->t ? (double) (y - x) / (b->t - a->t) : 0;
}

static int take(struct kvc_client *c, struct sample *s)
{
	int r = kvc_stats_get(c, &s->v, &s->n);

	if (r < 0)
		return r;
	r = kvc_status_get(c, &s->st);
	if (r < 0) {
		kvc_stats_free(s->v);
		return r;
	}
	s->t = now_s();
	return 0;
}

static void drop(struct sample *s)
{
	kvc_stats_free(s->v);
	kvc_status_free(s->st);
	*s = (struct sample) { 0 };
}

static const char *const kinds[] = {
	"exists", "acquire", "release", "reserve", "commit", "abort", "remove",
	"batch_exists", "prefix_lookup", "get_into", "put_from",
};
#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

static void draw(FILE *f, const struct sample *a, const struct sample *b, bool tty)
{
	const struct kvc_status *st = b->st;
	double hits = rate(a, b, "hits"), misses = rate(a, b, "misses");
	char used[32], cap[32];
	struct {
		const char *kind;
		double mean_us, per_s;
	} slow[N_KINDS];
	size_t n_slow = 0;

	if (tty)
		fputs("\033[H\033[2J", f);
	fprintf(f, "kvcachectl top: kvcached %s, pid %u, up %" PRIu64 " s, %u clients, %" PRIu64
		   " objects%s\n",
		st->version, st->pid, st->uptime_s, st->clients, st->objects,
		tty ? "   (q quits)" : "");
	fprintf(f, "ops/s      put %-9.0f get %-9.0f exists %-9.0f remove %-9.0f reserve %.0f\n",
		rate(a, b, "puts"), rate(a, b, "gets"), rate(a, b, "exists"), rate(a, b, "removes"),
		rate(a, b, "reserves"));
	if (hits + misses > 0)
		fprintf(f, "hit ratio  %.1f%%", 100 * hits / (hits + misses));
	else
		fprintf(f, "hit ratio  -");
	fprintf(f, "   in %.1f MB/s   out %.1f MB/s   errors/s %.0f   evictions/s %.0f\n",
		rate(a, b, "bytes_in") / 1e6, rate(a, b, "bytes_out") / 1e6, rate(a, b, "errors"),
		rate(a, b, "evictions"));
	fprintf(f, "%-8s %12s %12s %6s %10s %12s %10s\n", "tier", "used", "capacity", "use",
		"objects", "evictions/s", "hits/s");
	for (size_t i = 0; i < st->n_tiers; i++) {
		const struct kvc_tier_status *t = &st->tiers[i];
		char name[64];

		human(t->used, used, sizeof(used));
		human(t->capacity, cap, sizeof(cap));
		snprintf(name, sizeof(name), "%s.evictions", t->name);
		double ev = rate(a, b, name);
		snprintf(name, sizeof(name), "%s.hits", t->name);
		fprintf(f, "%-8s %12s %12s %5.0f%% %10" PRIu64 " %12.0f %10.0f\n", t->name, used, cap,
			t->capacity ? 100.0 * (double) t->used / (double) t->capacity : 0, t->objects,
			ev, rate(a, b, name));
	}
	if (get(b, "remote_hits") || get(b, "remote_served") || get(b, "remote_misses"))
		fprintf(f, "cluster    remote hits/s %.0f   served/s %.0f   in %.1f MB/s   out %.1f "
			   "MB/s\n",
			rate(a, b, "remote_hits"), rate(a, b, "remote_served"),
			rate(a, b, "remote_bytes_in") / 1e6, rate(a, b, "remote_bytes_out") / 1e6);
	/* the slowest kinds in the last interval, by mean daemon-side time */
	for (size_t k = 0; k < N_KINDS; k++) {
		char tn[64], nn[64];
		uint64_t ta, tb, na, nb;

		snprintf(tn, sizeof(tn), "op.%s.timed", kinds[k]);
		snprintf(nn, sizeof(nn), "op.%s.ns", kinds[k]);
		ta = get(a, tn);
		tb = get(b, tn);
		na = get(a, nn);
		nb = get(b, nn);
		if (tb <= ta || nb < na)
			continue;
		slow[n_slow].kind = kinds[k];
		slow[n_slow].mean_us = (double) (nb - na) / (double) (tb - ta) / 1e3;
		slow[n_slow].per_s = rate(a, b, tn);
		n_slow++;
	}
	for (size_t i = 1; i < n_slow; i++) /* a few entries: insertion sort */
		for (size_t j = i; j > 0 && slow[j].mean_us > slow[j - 1].mean_us; j--) {
			__typeof__(slow[0]) x = slow[j];

			slow[j] = slow[j - 1];
			slow[j - 1] = x;
		}
	fprintf(f, "slowest    ");
	if (n_slow == 0)
		fprintf(f, "-");
	for (size_t i = 0; i < n_slow && i < 4; i++)
		fprintf(f, "%s %.1f us%s", slow[i].kind, slow[i].mean_us,
			i + 1 < n_slow && i < 3 ? "   " : "");
	fprintf(f, "\n");
	if (!tty)
		fprintf(f, "\n");
	fflush(f);
}

/* Wait up to ms for a key; true when it asks to quit. */
static bool wait_key(int ms)
{
	struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
	char ch;

	if (!raw) {
		if (ms > 0)
			poll(NULL, 0, ms);
		return stop;
	}
	if (poll(&p, 1, ms) == 1 && read(STDIN_FILENO, &ch, 1) == 1)
		return ch == 'q' || ch == 'Q' || ch == 3 /* ^C */;
	return stop;
}

int ctl_top(struct kvc_client *c, long refreshes)
{
	bool tty = isatty(STDOUT_FILENO);
	struct sample a = { 0 }, b = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };
	int r;

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (tty && isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0) {
		struct termios t = saved;

		t.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
		t.c_cc[VMIN] = 0;
		t.c_cc[VTIME] = 0;
		if (tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0)
			raw = true;
	}
	r = take(c, &a);
	if (r < 0)
		goto out;
	for (long i = 0; refreshes <= 0 || i < refreshes; i++) {
		if (wait_key(1000))
			break;
		r = take(c, &b);
		if (r < 0)
			break;
		draw(stdout, &a, &b, tty);
		if (ferror(stdout)) {
			r = -EPIPE;
			break;
		}
		drop(&a);
		a = b;
		b = (struct sample) { 0 };
	}
out:
	restore_terminal();
	drop(&a);
	drop(&b);
	return r;
}
