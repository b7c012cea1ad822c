/* SPDX-License-Identifier: MIT */
/*
 * kvcache-master.  Flags parse the way Mooncake's mooncake_master (gflags)
 * parses them, because users paste their commands: -port 50001,
 * --port=50001 and --port 50001 are the same; booleans take =true/false, a
 * following true/false, or nothing.  Mooncake flags that mean nothing here
 * are accepted with a one-line warning.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "kvc-config.h"
#include "log.h"
#include "ha.h"
#include "loop.h"
#include "master.h"
#include "metrics.h"

#define LOG_TOPIC "main"

enum kind { K_PORT, K_STRING, K_UINT, K_DOUBLE, K_BOOL, K_IGNORED };

struct opts {
	unsigned port;
	char address[NET_HOST_MAX];
	unsigned client_ttl;
	unsigned long long lease_ttl;
	double high, ratio;
	char log_level[64];
	char secret_file[4096];
	unsigned metrics_port;
	char metrics_address[64];
	bool enable_ha;
	char etcd_endpoints[1024];
	char cluster_id[128];
	char ha_backend_type[32];
	unsigned ha_lease_ttl;
	char advertise[NET_HOST_MAX];
};

static struct opts o = { .port = 50051, .address = "0.0.0.0", .client_ttl = 10,
			 .log_level = "notice", .metrics_address = "127.0.0.1",
			 .cluster_id = "kvcache", .ha_backend_type = "etcd", .ha_lease_ttl = 5 };

static const struct flag {
	const char *name;
	enum kind kind;
	void *dst;
	const char *help;
} flags[] = {
	{ "port", K_PORT, &o.port, "port nodes and tools connect to (default 50051)" },
	{ "rpc_port", K_PORT, &o.port, "the same as --port" },
	{ "rpc_address", K_STRING, o.address, "address to listen on (default 0.0.0.0)" },
	{ "client_ttl", K_UINT, &o.client_ttl, "a node silent this many seconds is dropped (default 10)" },
	{ "default_kv_lease_ttl", K_UINT, &o.lease_ttl, "lease in ms handed to nodes that join" },
	{ "eviction_high_watermark_ratio", K_DOUBLE, &o.high, "handed to nodes that join" },
	{ "eviction_ratio", K_DOUBLE, &o.ratio, "handed to nodes that join" },
	{ "log-level", K_STRING, o.log_level, "error, warn, notice, info or debug" },
	{ "cluster-secret-file", K_STRING, o.secret_file,
	  "every node proves this secret (the nodes' --cluster-secret-file)" },
	/* Mooncake's, meaningless here */
	{ "enable_gc", K_BOOL, NULL, NULL },
	{ "max_threads", K_IGNORED, NULL, NULL },
	{ "rpc_thread_num", K_IGNORED, NULL, NULL },
	{ "rpc_conn_timeout_seconds", K_IGNORED, NULL, NULL },
	{ "rpc_enable_tcp_no_delay", K_BOOL, NULL, NULL },
	{ "enable_metric_reporting", K_BOOL, NULL, NULL },
	{ "metrics_port", K_PORT, &o.metrics_port,
	  "serve GET /metrics and /health over HTTP (default 0 = off)" },
	{ "metrics_address", K_STRING, o.metrics_address,
	  "the address /metrics listens on (default 127.0.0.1)" },
	{ "default_kv_soft_pin_ttl", K_IGNORED, NULL, NULL },
	{ "allow_evict_soft_pinned_objects", K_BOOL, NULL, NULL },
	{ "enable_ha", K_BOOL, &o.enable_ha,
	  "several masters, one leader elected on etcd (--etcd_endpoints)" },
	{ "etcd_endpoints", K_STRING, o.etcd_endpoints, "etcd's HOST:PORT[;HOST:PORT...]" },
	{ "cluster_id", K_STRING, o.cluster_id,
	  "the cluster's name in etcd: /kvcache/ID/master_view (default kvcache)" },
	{ "ha_backend_type", K_STRING, o.ha_backend_type, "etcd (the only one)" },
	{ "ha_backend_connstring", K_STRING, o.etcd_endpoints, "the same as --etcd_endpoints" },
	{ "ha_lease_ttl", K_UINT, &o.ha_lease_ttl,
	  "seconds a silent leader keeps its place (default 5)" },
	{ "advertise", K_STRING, o.advertise,
	  "the host nodes reach this master at (default --rpc_address, or the host name)" },
	{ "memory_allocator", K_IGNORED, NULL, NULL },
	{ "root_fs_dir", K_IGNORED, NULL, NULL },
	{ "global_file_segment_size", K_IGNORED, NULL, NULL },
	{ "enable_http_metadata_server", K_BOOL, NULL, NULL },
	{ "http_metadata_server_port", K_IGNORED, NULL, NULL },
	{ "http_metadata_server_host", K_IGNORED, NULL, NULL },
	{ "enable_snapshot", K_BOOL, NULL, NULL },
	{ "v", K_IGNORED, NULL, NULL },
	{ "logtostderr", K_BOOL, NULL, NULL },
	{ "alsologtostderr", K_BOOL, NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvcache-master [--port N] [--rpc_address ADDR] [--client_ttl S]\n"
		   "                      [--default_kv_lease_ttl MS] [--eviction_ratio R]\n"
		   "                      [--eviction_high_watermark_ratio R] [--log-level L]\n"
		   "                      [--metrics_port N] [--metrics_address ADDR]\n"
		   "                      [--enable_ha --etcd_endpoints H:P[;H:P] [--cluster_id ID]]\n\n"
		   "Membership and the directory of a kvcache cluster; data never passes\n"
		   "through it.  Flags may be written -flag V, --flag V or --flag=V.\n\n");
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		if (flags[i].help)
			fprintf(f, "  --%-32s %s\n", flags[i].name, flags[i].help);
	fprintf(f, "\nMooncake master flags that mean nothing here are accepted with a warning.\n");
}

static bool bool_word(const char *s, bool *ret)
{
	if (!strcmp(s, "true") || !strcmp(s, "1") || !strcmp(s, "yes")) {
		*ret = true;
		return true;
	}
	if (!strcmp(s, "false") || !strcmp(s, "0") || !strcmp(s, "no")) {
		*ret = false;
		return true;
	}
	return false;
}

/* The room a string flag has. */
static size_t string_cap(const void *dst)
{
	const struct {
		const void *p;
		size_t cap;
	} caps[] = {
		{ o.address, sizeof(o.address) },
		{ o.log_level, sizeof(o.log_level) },
		{ o.metrics_address, sizeof(o.metrics_address) },
		{ o.secret_file, sizeof(o.secret_file) },
		{ o.etcd_endpoints, sizeof(o.etcd_endpoints) },
		{ o.cluster_id, sizeof(o.cluster_id) },
		{ o.ha_backend_type, sizeof(o.ha_backend_type) },
		{ o.advertise, sizeof(o.advertise) },
	};

	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
		if (caps[i].p == dst)
			return caps[i].cap;
	return 0;
}

static int set(const struct flag *f, const char *v)
{
	char *end;

	switch (f->kind) {
	case K_PORT:
	case K_UINT: {
		unsigned long long x;

		if (!*v || *v == '-')
			return -EINVAL;
		errno = 0;
		x = strtoull(v, &end, 10);
		if (errno || *end || (f->kind == K_PORT && x > 65535) ||
		    ((f->dst == &o.client_ttl || f->dst == &o.ha_lease_ttl) && (x == 0 || x > 86400)))
			return -EINVAL;
		if (f->dst == &o.lease_ttl)
			o.lease_ttl = x;
		else
			*(unsigned *) f->dst = (unsigned) x;
		return 0;
	}
	case K_DOUBLE: {
		double x;

		errno = 0;
		x = strtod(v, &end);
		if (errno || *end || !*v || !(x > 0 && x <= 1))
			return -EINVAL;
		*(double *) f->dst = x;
		return 0;
	}
	case K_STRING:
		if (strlen(v) >= string_cap(f->dst))
			return -EINVAL;
		strcpy(f->dst, v);
		return 0;
	case K_BOOL: {
		bool b = true;

		if (v && !bool_word(v, &b))
			return -EINVAL;
		*(bool *) f->dst = b;
		return 0;
	}
	default:
		return 0;
	}
}

/* 0, 1 for --help, or -1 after printing why. */
static int parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *eq, *v = NULL;
		const struct flag *f = NULL;
		char name[64];
		size_t len;

		if (a[0] != '-' || !a[1]) {
			fprintf(stderr, "kvcache-master: unexpected argument '%s'\n", a);
			return -1;
		}
		a += a[1] == '-' ? 2 : 1;
		if (!strcmp(a, "help") || !strcmp(a, "h")) {
			usage(stdout);
			return 1;
		}
		if (!strcmp(a, "version")) {
			printf("kvcache-master %s\n", KVC_VERSION);
			return 1;
		}
		eq = strchr(a, '=');
		len = eq ? (size_t) (eq - a) : strlen(a);
		if (len >= sizeof(name)) {
			fprintf(stderr, "kvcache-master: unknown flag '%s'\n", argv[i]);
			return -1;
		}
		memcpy(name, a, len);
		name[len] = '\0';
		for (char *p = name; *p; p++)
			if (*p == '-' && strcmp(name, "log-level") && strcmp(name, "cluster-secret-file"))
				*p = '_';
		if (!strcmp(name, "cluster_secret_file"))
			strcpy(name, "cluster-secret-file");
		for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
			if (!strcmp(flags[k].name, name))
				f = &flags[k];
		if (!f) {
			fprintf(stderr, "kvcache-master: unknown flag '%s' (see --help)\n", argv[i]);
			return -1;
		}
		if (eq)
			v = eq + 1;
		else if (f->kind == K_BOOL) {
			bool b;

			if (i + 1 < argc && bool_word(argv[i + 1], &b))
				v = argv[++i];
		} else if (i + 1 < argc)
			v = argv[++i];
		else {
			fprintf(stderr, "kvcache-master: flag --%s needs a value\n", name);
			return -1;
		}
		if (!f->dst) {
			fprintf(stderr, "kvcache-master: warning: --%s means nothing to kvcache; "
					"ignored\n", name);
			continue;
		}
		if (set(f, v) < 0) {
			fprintf(stderr, "kvcache-master: invalid value '%s' for --%s\n", v, name);
			return -1;
		}
	}
	return 0;
}

/* ---- /metrics: the master's figures, twice a second ---- */

struct exporter {
	struct master *m;
	struct loop *l;
	struct metrics *metrics;
	struct mtext t;
};

static void emit(void *u, const char *name, const char *state, bool counter, uint64_t value)
{
	struct exporter *e = u;
	char family[96], labels[32] = "";

	snprintf(family, sizeof(family), "kvcache_master_%s%s", name, counter ? "_total" : "");
	if (state)
		snprintf(labels, sizeof(labels), "state=\"%s\"", state);
	mtext_sample(&e->t, family, counter ? "counter" : "gauge",
		     state ? "Member nodes by state." : "kvcache-master's own figure.", labels, value);
}

static void on_export(struct loop_source *s, void *u)
{
	struct exporter *e = u;

	e->t = (struct mtext) { 0 };
	mtext_sample(&e->t, "kvcache_master_info", "gauge", "kvcache-master's version.",
		     "version=\"" KVC_VERSION "\"", 1);
	master_export(e->m, emit, e);
	metrics_publish(e->metrics, &e->t);
	loop_timer_arm(s, loop_now(e->l) + 500 * USEC_PER_MSEC);
}

static void on_signal(struct loop_source *s, int fd, uint32_t events, void *u)
{
	struct signalfd_siginfo si;

	(void) s;
	(void) events;
	if (read(fd, &si, sizeof(si)) == sizeof(si))
		log_notice("%s: stopping", strsignal((int) si.ssi_signo));
	loop_quit(u);
}

int main(int argc, char **argv)
{
	struct master_config cfg = { 0 };
	struct loop_source *sig_src = NULL, *export_src = NULL;
	struct exporter ex = { 0 };
	struct master *m = NULL;
	struct loop *l = NULL;
	struct ha *ha = NULL;
	bool bad_flag = false;
	sigset_t mask;
	int r, sfd;

	log_set_ident("kvcache-master");
	loop_tune_malloc();
	r = parse(argc, argv);
	if (r != 0)
		return r > 0 ? 0 : 2;
	if (log_configure(o.log_level) < 0) {
		fprintf(stderr, "kvcache-master: invalid --log-level '%s'\n", o.log_level);
		return 2;
	}
	snprintf(cfg.listen.host, sizeof(cfg.listen.host), "%s",
		 strcmp(o.address, "0.0.0.0") ? o.address : "");
	cfg.listen.port = (uint16_t) o.port;
	cfg.client_ttl_s = o.client_ttl;
	cfg.default_kv_lease_ttl_ms = o.lease_ttl;
	cfg.eviction_high_watermark_ratio = o.high;
	cfg.eviction_ratio = o.ratio;
	if (o.enable_ha) {
		if (strcmp(o.ha_backend_type, "etcd")) {
			fprintf(stderr, "kvcache-master: --ha_backend_type %s: only etcd is supported\n",
				o.ha_backend_type);
			return 2;
		}
		if (!o.etcd_endpoints[0]) {
			fprintf(stderr, "kvcache-master: --enable_ha needs --etcd_endpoints HOST:PORT[;...]\n");
			return 2;
		}
		cfg.standby = true; /* until elected */
	}
	if (o.secret_file[0]) {
		static struct peer_secret secret;
		char err[512];

		if (peer_secret_load(o.secret_file, &secret, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvcache-master: %s\n", err);
			return 2;
		}
		cfg.secret = &secret;
	} else if (cfg.listen.host[0] == '\0' || !net_addr_is_loopback(&cfg.listen))
		fprintf(stderr, "kvcache-master: warning: no --cluster-secret-file: any host that "
				"reaches this port can join\n");

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	r = loop_new(0, &l);
	if (r < 0 || sfd < 0) {
		fprintf(stderr, "kvcache-master: cannot set up the event loop\n");
		return 1;
	}
	r = master_new(l, &cfg, &m);
	if (r < 0) {
		fprintf(stderr, "kvcache-master: cannot listen on %s:%u: %s\n", o.address, o.port,
			strerror(-r));
		loop_free(l);
		return 1;
	}
	r = loop_add_io(l, sfd, EPOLLIN, on_signal, l, &sig_src);
	if (r < 0)
		goto out;
	if (o.metrics_port) {
		r = metrics_start(o.metrics_address, (uint16_t) o.metrics_port, &ex.metrics);
		if (r < 0) {
			fprintf(stderr, "kvcache-master: cannot serve metrics on %s:%u: %s\n",
				o.metrics_address, o.metrics_port, strerror(-r));
			goto out;
		}
		ex.m = m;
		ex.l = l;
		r = loop_add_timer(l, on_export, &ex, &export_src);
		if (r < 0)
			goto out;
		on_export(export_src, &ex);
		metrics_set_serving(ex.metrics, true);
		log_notice("metrics on http://%s:%u/metrics", o.metrics_address, o.metrics_port);
	}
	if (o.enable_ha) {
		struct ha_config hc = { .endpoints = o.etcd_endpoints, .cluster_id = o.cluster_id,
					.lease_ttl_s = o.ha_lease_ttl };
		char addr[NET_HOST_MAX + 8];
		const char *host = o.advertise[0]		  ? o.advertise
				   : strcmp(o.address, "0.0.0.0") ? o.address
								  : NULL;
		struct utsname un;

		if (!host && uname(&un) == 0)
			host = un.nodename;
		snprintf(addr, sizeof(addr), "%s:%u", host ? host : "localhost", master_port(m));
		hc.address = addr;
		r = ha_start(l, m, &hc, &ha);
		if (r == -EINVAL) {
			fprintf(stderr, "kvcache-master: --etcd_endpoints %s --cluster_id %s: expected "
					"HOST:PORT[;HOST:PORT...] and a name without '/'\n",
				o.etcd_endpoints, o.cluster_id);
			bad_flag = true;
			goto out;
		}
		if (r < 0) {
			fprintf(stderr, "kvcache-master: cannot campaign on etcd %s (cluster %s): %s\n",
				o.etcd_endpoints, o.cluster_id, strerror(-r));
			goto out;
		}
		log_notice("standing for cluster %s on etcd %s as %s (lease %u s)", o.cluster_id,
			   o.etcd_endpoints, addr, o.ha_lease_ttl);
	}
	log_notice("kvcache-master %s listening on %s:%u (client_ttl %u s)", KVC_VERSION, o.address,
		   master_port(m), o.client_ttl);
	sd_notifyf(0, "READY=1\nSTATUS=listening on %s:%u", o.address, master_port(m));
	r = loop_run(l);
	sd_notify(0, "STOPPING=1");
out:
	ha_stop(ha);
	metrics_set_serving(ex.metrics, false);
	metrics_stop(ex.metrics);
	loop_source_free(export_src);
	loop_source_free(sig_src);
	master_free(m);
	loop_free(l);
	close(sfd);
	return bad_flag ? 2 : r < 0 ? 1 : 0;
}
