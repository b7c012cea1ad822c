/* SPDX-License-Identifier: MIT */
/*
 * --plot FILE.svg: the figures just printed, drawn by gnuplot (Debian
 * gnuplot-nox) against value size, with the same run's limits (memcpy,
 * the raw disk, iperf3) and peers as dashed reference lines.
 */
#include "bench.h"

static struct plot_panel *panel_of(struct plot *p, const char *title, const char *ylabel,
				   bool logy)
{
	for (size_t i = 0; i < p->n; i++)
		if (strcmp(p->panels[i].title, title) == 0)
			return &p->panels[i];
	if (p->n == PLOT_PANELS)
		return NULL;
	p->panels[p->n] = (struct plot_panel) { .logy = logy };
	snprintf(p->panels[p->n].title, sizeof(p->panels[0].title), "%s", title);
	snprintf(p->panels[p->n].ylabel, sizeof(p->panels[0].ylabel), "%s", ylabel);
	return &p->panels[p->n++];
}

void plot_add(struct plot *p, const char *panel, const char *ylabel, bool logy,
	      const char *series, bool reference, double x, double y)
{
	struct plot_panel *pp = panel_of(p, panel, ylabel, logy);
	struct plot_series *s = NULL;

	if (!pp || y <= 0)
		return;
	for (size_t i = 0; i < pp->n; i++)
		if (strcmp(pp->series[i].title, series) == 0)
			s = &pp->series[i];
	if (!s) {
		if (pp->n == PLOT_SERIES)
			return;
		s = &pp->series[pp->n++];
		*s = (struct plot_series) { .reference = reference };
		snprintf(s->title, sizeof(s->title), "%s", series);
	}
	for (size_t i = 0; i < s->n; i++)
		if (s->x[i] == x) { /* measured again: the last one stands */
			s->y[i] = y;
			return;
		}
	if (s->n < MAX_SIZES) {
		s->x[s->n] = x;
		s->y[s->n++] = y;
	}
}

int plot_draw(const struct plot *p, const char *file, const char *title)
{
	char script[128];
	FILE *s;
	int st, id = 0;
	pid_t pid;

	if (p->n == 0)
		return -ENODATA;
	snprintf(script, sizeof(script), "%s/plot.gp", tmpdir);
	s = fopen(script, "w");
	if (!s)
		return -errno;
	/* the data as inline blocks, one per series */
	for (size_t i = 0; i < p->n; i++)
		for (size_t j = 0; j < p->panels[i].n; j++, id++) {
			const struct plot_series *x = &p->panels[i].series[j];

			fprintf(s, "$d%d << EOD\n", id);
			for (size_t k = 0; k < x->n; k++)
				fprintf(s, "%.0f %g\n", x->x[k], x->y[k]);
			fprintf(s, "EOD\n");
		}
	fprintf(s, "set terminal svg size %d,460 dynamic font 'sans,11'\n"
		   "set output '%s'\n"
		   "set multiplot layout 1,%zu title '%s (kvcache %s), one run'\n"
		   "set logscale x 2\nset grid\nset key top left\n"
		   "set format x '%%.0s%%cB'\nset xlabel 'value size'\n",
		p->n > 1 ? 1100 : 640, file, p->n, title, KVC_VERSION);
	id = 0;
	for (size_t i = 0; i < p->n; i++) {
		const struct plot_panel *pp = &p->panels[i];

		fprintf(s, "set title '%s'\nset ylabel '%s'\n%s\nplot ", pp->title, pp->ylabel,
			pp->logy ? "set logscale y 10" : "unset logscale y\nset yrange [0:*]");
		for (size_t j = 0; j < pp->n; j++, id++)
			fprintf(s, "%s$d%d with linespoints lw 2 %s title '%s'", j ? ", " : "", id,
				pp->series[j].reference ? "dt 2" : "dt 1", pp->series[j].title);
		fprintf(s, "\n");
	}
	fprintf(s, "unset multiplot\n");
	fclose(s);
	pid = fork();
	if (pid == 0) {
		execlp("gnuplot", "gnuplot", script, (char *) NULL);
		fprintf(stderr, "kvcache-bench: cannot run gnuplot (Debian: gnuplot-nox): %s\n",
			strerror(errno));
		_exit(127);
	}
	if (pid < 0)
		return -errno;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	unlink(script);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

void plot_finish(const struct plot *p, const char *title)
{
	int r;

	if (!arg_plot)
		return;
	r = plot_draw(p, arg_plot, title);
	if (r < 0)
		fprintf(stderr, "kvcache-bench: the chart %s was not drawn: %s\n", arg_plot,
			strerror(-r));
	else if (!arg_json)
		printf("\nchart: %s\n", arg_plot);
}

void plot_results(struct plot *p, const struct result *res, size_t n, const char *system,
		  bool reference)
{
	static const char *const ops[] = { "get", "put", "acquire" };
	char name[64];

	for (size_t i = 0; i < n; i++) {
		const struct result *r = &res[i];

		for (size_t o = 0; o < 3; o++) {
			if (!r->size || strcmp(r->op, ops[o]) != 0)
				continue;
			snprintf(name, sizeof(name), "%s %s", system, ops[o]);
			plot_add(p, "p50 latency", "microseconds", true, name, reference,
				 (double) r->size, r->p50);
			if (o < 2)
				plot_add(p, "bandwidth", "GB/s", true, name, reference,
					 (double) r->size, gb_s(r));
			if (o == 0 && !reference && r->memcpy_gbs > 0)
				plot_add(p, "bandwidth", "GB/s", true, "memcpy (this run)", true,
					 (double) r->size, r->memcpy_gbs);
		}
	}
}
