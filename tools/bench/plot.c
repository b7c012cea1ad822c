/* SPDX-License-Identifier: MIT */
/*
 * --plot FILE.svg: the figures just printed, drawn by gnuplot (Debian
 * gnuplot-nox): p50 latency and bandwidth against value size, kvcache's
 * operations beside the peers', with the same run's memcpy as the
 * reference line of the bandwidth chart.
 */
#include "bench.h"

static bool sized(const struct result *r, const char *op)
{
	return r->size && strcmp(r->op, op) == 0;
}

/* One data block per series: "size value" lines, then two blank lines. */
static int series(FILE *f, const struct result *v, size_t n, const char *op, bool gbs,
		  bool memcpy_line)
{
	int rows = 0;

	for (size_t i = 0; i < n; i++) {
		if (!sized(&v[i], op))
			continue;
		double y = memcpy_line ? v[i].memcpy_gbs : gbs ? gb_s(&v[i]) : v[i].p50;

		if (y <= 0)
			continue;
		fprintf(f, "%" PRIu64 " %g\n", v[i].size, y);
		rows++;
	}
	fprintf(f, "\n\n");
	return rows;
}

int bench_plot(const char *file, const struct result *res, size_t n,
	       const struct result *const peers[2], const size_t n_peer[2])
{
	static const char *const peer_names[2] = { "memcached", "redis" };
	static const char *const ops[] = { "get", "put", "acquire" };
	char data[128], script[128];
	FILE *d, *s;
	int idx = 0, st;
	pid_t pid;
	struct {
		int index;
		char title[64];
		bool dashed;
	} lt[16], bw[16];
	int n_lat = 0, n_bw = 0;

	snprintf(data, sizeof(data), "%s/plot.dat", tmpdir);
	snprintf(script, sizeof(script), "%s/plot.gp", tmpdir);
	d = fopen(data, "w");
	s = fopen(script, "w");
	if (!d || !s) {
		if (d)
			fclose(d);
		if (s)
			fclose(s);
		return -errno;
	}
	for (size_t o = 0; o < 3; o++) {
		if (series(d, res, n, ops[o], false, false)) {
			lt[n_lat].index = idx;
			lt[n_lat].dashed = false;
			snprintf(lt[n_lat++].title, sizeof(lt[0].title), "kvcache %s", ops[o]);
		}
		idx++;
		if (o < 2 && series(d, res, n, ops[o], true, false)) {
			bw[n_bw].index = idx;
			bw[n_bw].dashed = false;
			snprintf(bw[n_bw++].title, sizeof(bw[0].title), "kvcache %s", ops[o]);
		}
		if (o < 2)
			idx++;
	}
	if (series(d, res, n, "get", true, true)) {
		bw[n_bw].index = idx;
		bw[n_bw].dashed = true;
		snprintf(bw[n_bw++].title, sizeof(bw[0].title), "memcpy (this run)");
	}
	idx++;
	for (int p = 0; p < 2; p++)
		for (size_t o = 0; o < 2; o++) {
			if (series(d, peers[p], n_peer[p], ops[o], false, false)) {
				lt[n_lat].index = idx;
				lt[n_lat].dashed = true;
				snprintf(lt[n_lat++].title, sizeof(lt[0].title), "%s %s",
					 peer_names[p], ops[o]);
			}
			idx++;
			if (series(d, peers[p], n_peer[p], ops[o], true, false)) {
				bw[n_bw].index = idx;
				bw[n_bw].dashed = true;
				snprintf(bw[n_bw++].title, sizeof(bw[0].title), "%s %s",
					 peer_names[p], ops[o]);
			}
			idx++;
		}
	fclose(d);
	if (n_lat == 0) {
		fclose(s);
		return -ENODATA;
	}
	fprintf(s, "set terminal svg size 1100,460 dynamic font 'sans,11'\n"
		   "set output '%s'\n"
		   "set multiplot layout 1,2 title 'kvcache-bench local (kvcache %s), same run'\n"
		   "set logscale x 2\nset logscale y 10\nset grid\nset key top left\n"
		   "set format x '%%.0s%%cB'\nset xlabel 'value size'\n",
		file, KVC_VERSION);
	fprintf(s, "set title 'p50 latency'\nset ylabel 'microseconds'\nplot ");
	for (int i = 0; i < n_lat; i++)
		fprintf(s, "%s'%s' index %d with linespoints lw 2 %s title '%s'", i ? ", " : "",
			data, lt[i].index, lt[i].dashed ? "dt 2" : "dt 1", lt[i].title);
	fprintf(s, "\nset title 'bandwidth'\nset ylabel 'GB/s'\nset key bottom right\nplot ");
	for (int i = 0; i < n_bw; i++)
		fprintf(s, "%s'%s' index %d with linespoints lw 2 %s title '%s'", i ? ", " : "", data,
			bw[i].index, bw[i].dashed ? "dt 2" : "dt 1", bw[i].title);
	fprintf(s, "\nunset multiplot\n");
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
	unlink(data);
	unlink(script);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}
