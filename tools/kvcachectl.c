/* SPDX-License-Identifier: MIT */
/*
 * kvcachectl — inspect and poke a running kvcached.  Written only against the
 * public libkvcache API.
 *
 * Exit status: 0 ok, 1 not found, 2 usage error, 3 daemon unreachable,
 * 4 any other failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "kvc-config.h"
#include <kvcache/kvcache.h>

enum {
	EXIT_OK = 0,
	EXIT_NOTFOUND = 1,
	EXIT_USAGE = 2,
	EXIT_UNREACHABLE = 3,
	EXIT_FAIL = 4,
};

static const char *arg_socket;
static bool arg_json;
static const char *arg_push_to;
static bool arg_local_only, arg_peek;
static const char *arg_binary;
static char socket_path[108];

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvcachectl [-s SOCKET] [--json] COMMAND [ARGS]\n"
		"\n"
		"Commands:\n"
		"  status                       version, uptime, tiers, hugepages, clients\n"
		"  stats                        counters: puts, gets, hits, misses, bytes, errors\n"
		"  ls [PREFIX] [--limit N]      keys with size and state (default limit 1000)\n"
		"  put KEY [FILE|-] [--push-to NODE]\n"
		"                               store FILE (or stdin) under KEY; --push-to also\n"
		"                               copies it to that node of the cluster\n"
		"  get KEY [FILE|-]             write the object to FILE (or stdout)\n"
		"  exists KEY                   exit 0 if present, 1 if not\n"
		"  rm [--force] KEY             remove KEY (refused while viewed, or leased\n"
		"                               unless --force)\n"
		"  rm [--force] --prefix P | --all\n"
		"                               remove every key starting with P, or every key\n"
		"  pin KEY [--soft TTL|--hard]  protect KEY from eviction: soft (evicted after\n"
		"                               unpinned objects; TTL ms, 0 = until unpinned)\n"
		"                               or hard (never); default --soft 0\n"
		"  unpin KEY                    remove a pin\n"
		"  flush                        write every memory-only object to the disk tier\n"
		"                               and wait (before a planned restart)\n"
		"  evict [--tier T] [--bytes N | --all]\n"
		"                               drop unused objects, least recently used first\n"
		"  upgrade [--binary PATH] [-- FLAGS...]\n"
		"                               warm restart: start PATH (default: the running\n"
		"                               daemon's binary) with its flags (or FLAGS),\n"
		"                               taking over its memory and socket\n"
		"  cluster                      the cluster's members as this daemon sees them\n"
		"  where KEY                    the nodes holding KEY (exit 1 if none)\n"
		"  prefetch KEY...              start bringing KEYs into memory (from the disk\n"
		"                               tier or another node) and return at once\n"
		"  top [-n|--iterations N]      a live view, every second: ops/s, hit ratio,\n"
		"                               bytes/s, tiers, evictions, the slowest kinds of\n"
		"                               request; q quits; -n: N refreshes, then exit\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   daemon socket (default: $KVCACHE_SOCKET, then\n"
		"                      $XDG_RUNTIME_DIR/kvcached.sock, then /tmp/kvcached-<uid>.sock)\n"
		"  -j, --json          machine-readable output\n"
		"      --local-only    lookups and gets answer from this node alone (in a\n"
		"                      cluster: a key held only elsewhere is not found);\n"
		"                      rm removes this node's copies alone\n"
		"      --binary PATH   the kvcached binary upgrade starts\n"
		"      --binary PATH   the kvcached binary upgrade starts\n"
		"      --peek          exists only looks: no lease, no use (for scans)\n"
		"  -h, --help          this help\n"
		"  -V, --version       print the version\n"
		"\n"
		"Exit status: 0 ok, 1 not found, 2 usage error, 3 daemon unreachable, 4 other error.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvcachectl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'kvcachectl --help'.\n");
	return EXIT_USAGE;
}

/* Map an error from the daemon onto the exit status and say what happened. */
static int fail(const char *what, int r)
{
	const char *m = kvc_last_error_msg();

	if (r == -ENOENT) {
		fprintf(stderr, "kvcachectl: %s: not found\n", what);
		return EXIT_NOTFOUND;
	}
	fprintf(stderr, "kvcachectl: %s: %s%s%s\n", what,
		r == -ECONNRESET && *m ? "Connection reset" : kvc_strerror(r), *m ? ": " : "", m);
	/* a reset the daemon explains is a peer's, not this connection's */
	if (r == -ECONNRESET && !*m)
		return EXIT_UNREACHABLE;
	return EXIT_FAIL;
}

/* Output that could not be written (stdout closed, a full disk, a closed
 * pipe) is a failure, not a silent success. */
static int finish_stdout(int r)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvcachectl: Failed to write the output: %s\n", strerror(errno));
		return r == EXIT_OK || r == EXIT_NOTFOUND ? EXIT_FAIL : r;
	}
	return r;
}

static int connect_daemon(struct kvc_client **ret)
{
	int r;

	r = kvc_socket_path(arg_socket, socket_path, sizeof(socket_path));
	if (r < 0) {
		fprintf(stderr, "kvcachectl: bad socket path: %s\n", kvc_strerror(r));
		return EXIT_USAGE;
	}
	r = kvc_connect(socket_path, ret);
	if (r < 0) {
		const char *m = kvc_last_error_msg();

		fprintf(stderr, "kvcachectl: cannot reach kvcached at %s: %s%s%s\n", socket_path,
			r == -ENOENT ? "no such socket" : kvc_strerror(r), *m ? ": " : "", m);
		return EXIT_UNREACHABLE;
	}
	return EXIT_OK;
}

void human(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double d = (double) v;
	unsigned u = 0;

	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", d, units[u]);
}

static void print_json(struct json_object *o)
{
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY |
							  JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
}

/* The shared tier's figures (stats shared.*): false when there is none. */
struct shared_view {
	uint64_t on, writable, size, bytes, records, reads, writes, skips, errors, offs;
};

static bool shared_view(struct kvc_client *c, struct shared_view *v)
{
	struct kvc_counter *k;
	size_t n;
	bool found = false;

	*v = (struct shared_view) { 0 };
	if (kvc_stats_get(c, &k, &n) < 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		const char *s = k[i].name;
		uint64_t x = k[i].value;

		if (strncmp(s, "shared.", 7))
			continue;
		s += 7;
		found |= !strcmp(s, "size");
		if (!strcmp(s, "on"))
			v->on = x;
		else if (!strcmp(s, "writable"))
			v->writable = x;
		else if (!strcmp(s, "size"))
			v->size = x;
		else if (!strcmp(s, "bytes"))
			v->bytes = x;
		else if (!strcmp(s, "records"))
			v->records = x;
		else if (!strcmp(s, "reads"))
			v->reads = x;
		else if (!strcmp(s, "writes"))
			v->writes = x;
		else if (!strcmp(s, "write_skips") || !strcmp(s, "skipped_newer") ||
			 !strcmp(s, "skipped_damaged"))
			v->skips += x;
		else if (!strcmp(s, "write_errors") || !strcmp(s, "read_errors") ||
			 !strcmp(s, "checksum_failures") || !strcmp(s, "timeouts"))
			v->errors += x;
		else if (!strcmp(s, "offs"))
			v->offs = x;
	}
	kvc_stats_free(k);
	return found;
}

static const char *shared_state(const struct shared_view *v)
{
	return !v->on ? "off" : v->writable ? "on" : "read-only";
}

static int cmd_status(struct kvc_client *c)
{
	struct kvc_status *s;
	int r = kvc_status_get(c, &s);

	if (r < 0)
		return fail("status", r);
	if (arg_json) {
		struct json_object *o = json_object_new_object(), *tiers = json_object_new_array();
		char proto[32];

		snprintf(proto, sizeof(proto), "%u.%u", s->protocol_major, s->protocol_minor);
		json_object_object_add(o, "version", json_object_new_string(s->version));
		json_object_object_add(o, "protocol", json_object_new_string(proto));
		json_object_object_add(o, "layout_version", json_object_new_int64(s->layout_version));
		json_object_object_add(o, "pid", json_object_new_int64(s->pid));
		json_object_object_add(o, "socket", json_object_new_string(s->socket));
		json_object_object_add(o, "uptime_s", json_object_new_uint64(s->uptime_s));
		json_object_object_add(o, "hugepages", json_object_new_boolean(s->hugepages));
		json_object_object_add(o, "numa_node", s->numa_node < 0 ? NULL :
				       json_object_new_int64(s->numa_node));
		json_object_object_add(o, "clients", json_object_new_int64(s->clients));
		json_object_object_add(o, "objects", json_object_new_uint64(s->objects));
		for (size_t i = 0; i < s->n_tiers; i++) {
			struct json_object *t = json_object_new_object();

			json_object_object_add(t, "name", json_object_new_string(s->tiers[i].name));
			json_object_object_add(t, "capacity", json_object_new_uint64(s->tiers[i].capacity));
			json_object_object_add(t, "used", json_object_new_uint64(s->tiers[i].used));
			json_object_object_add(t, "objects", json_object_new_uint64(s->tiers[i].objects));
			json_object_object_add(t, "high_watermark",
					       json_object_new_uint64(s->tiers[i].high_watermark));
			json_object_array_add(tiers, t);
		}
		json_object_object_add(o, "tiers", tiers);
		{
			struct shared_view v;

			if (shared_view(c, &v)) {
				struct json_object *sh = json_object_new_object();

				json_object_object_add(sh, "state", json_object_new_string(shared_state(&v)));
				json_object_object_add(sh, "capacity", json_object_new_uint64(v.size));
				json_object_object_add(sh, "used", json_object_new_uint64(v.bytes));
				json_object_object_add(sh, "records", json_object_new_uint64(v.records));
				json_object_object_add(sh, "reads", json_object_new_uint64(v.reads));
				json_object_object_add(sh, "writes", json_object_new_uint64(v.writes));
				json_object_object_add(sh, "skips", json_object_new_uint64(v.skips));
				json_object_object_add(sh, "errors", json_object_new_uint64(v.errors));
				json_object_object_add(sh, "offs", json_object_new_uint64(v.offs));
				json_object_object_add(o, "shared", sh);
			}
		}
		if (s->recovery_total) {
			struct json_object *rec = json_object_new_object();

			json_object_object_add(rec, "done", json_object_new_boolean(!s->recovering));
			json_object_object_add(rec, "indexed", json_object_new_uint64(s->recovered));
			json_object_object_add(rec, "total", json_object_new_uint64(s->recovery_total));
			json_object_object_add(o, "recovery", rec);
		}
		{
			struct kvc_cluster *v;

			if (kvc_cluster_get(c, &v) == 0) {
				struct json_object *cl = json_object_new_object(),
						   *m = json_object_new_array();

				json_object_object_add(cl, "role", json_object_new_string(
					v->self[0] ? "node" : "single"));
				if (v->self[0])
					json_object_object_add(cl, "self", json_object_new_string(v->self));
				for (size_t i = 0; i < v->n_masters; i++)
					json_object_array_add(m, json_object_new_string(v->masters[i]));
				json_object_object_add(cl, "masters", m);
				json_object_object_add(cl, "masters_up",
						       json_object_new_uint64(v->masters_up));
				json_object_object_add(o, "cluster", cl);
				kvc_cluster_free(v);
			}
		}
		print_json(o);
	} else {
		printf("kvcached %s (pid %u) on %s\n", s->version, s->pid, s->socket);
		printf("protocol:   %u.%u, shm layout %u\n", s->protocol_major, s->protocol_minor,
		       s->layout_version);
		printf("uptime:     %" PRIu64 " s\n", s->uptime_s);
		printf("hugepages:  %s\n", s->hugepages ? "yes (2 MiB pages)" : "no (4 KiB pages)");
		if (s->numa_node >= 0)
			printf("numa:       node %d (memory and threads bound)\n", s->numa_node);
		else
			printf("numa:       not bound\n");
		printf("clients:    %u\n", s->clients);
		printf("objects:    %" PRIu64 "\n", s->objects);
		{
			struct kvc_cluster *v;

			if (kvc_cluster_get(c, &v) == 0) {
				if (!v->self[0])
					printf("cluster:    none (a single node)\n");
				else {
					printf("cluster:    node %s, masters", v->self);
					for (size_t i = 0; i < v->n_masters; i++)
						printf("%s %s", i ? "," : "", v->masters[i]);
					printf(" (%zu of %zu joined)\n", v->masters_up, v->n_masters);
				}
				kvc_cluster_free(v);
			}
		}
		if (s->recovering)
			printf("recovery:   %" PRIu64 " of %" PRIu64 " disk records indexed so far "
			       "(the rest are misses until then)\n", s->recovered, s->recovery_total);
		printf("%-8s %12s %12s %6s %12s %10s\n", "TIER", "CAPACITY", "USED", "USE%",
		       "HIGH-WATER", "OBJECTS");
		for (size_t i = 0; i < s->n_tiers; i++) {
			char cap[32], used[32], high[32];

			human(s->tiers[i].capacity, cap, sizeof(cap));
			human(s->tiers[i].used, used, sizeof(used));
			human(s->tiers[i].high_watermark, high, sizeof(high));
			printf("%-8s %12s %12s %5.1f%% %12s %10" PRIu64 "\n", s->tiers[i].name, cap, used,
			       s->tiers[i].capacity ? 100.0 * (double) s->tiers[i].used /
							      (double) s->tiers[i].capacity : 0.0,
			       high, s->tiers[i].objects);
		}
		{
			struct shared_view v;

			if (shared_view(c, &v)) {
				char cap[32], used[32];

				human(v.size, cap, sizeof(cap));
				human(v.bytes, used, sizeof(used));
				printf("%-8s %12s %12s %5.1f%% %12s %10" PRIu64 "  (%s; as this node counts)\n",
				       "shared", cap, used,
				       v.size ? 100.0 * (double) v.bytes / (double) v.size : 0.0, "-",
				       v.records, shared_state(&v));
				printf("shared:     %" PRIu64 " reads, %" PRIu64 " writes, %" PRIu64
				       " skipped, %" PRIu64 " errors, off %" PRIu64 " time(s)\n", v.reads,
				       v.writes, v.skips, v.errors, v.offs);
			}
		}
	}
	kvc_status_free(s);
	return EXIT_OK;
}

static int cmd_cluster(struct kvc_client *c)
{
	struct kvc_cluster *v;
	int r = kvc_cluster_get(c, &v);

	if (r < 0)
		return fail("cluster", r);
	if (arg_json) {
		struct json_object *o = json_object_new_object(), *m = json_object_new_array(),
				   *nodes = json_object_new_array();

		json_object_object_add(o, "self", v->self[0] ? json_object_new_string(v->self) : NULL);
		for (size_t i = 0; i < v->n_masters; i++)
			json_object_array_add(m, json_object_new_string(v->masters[i]));
		json_object_object_add(o, "masters", m);
		json_object_object_add(o, "masters_up", json_object_new_uint64(v->masters_up));
		for (size_t i = 0; i < v->n_nodes; i++) {
			const struct kvc_node *n = &v->nodes[i];
			struct json_object *x = json_object_new_object();

			json_object_object_add(x, "id", json_object_new_string(n->id));
			json_object_object_add(x, "address", json_object_new_string(n->address));
			json_object_object_add(x, "state", json_object_new_string(n->state));
			json_object_object_add(x, "transport", json_object_new_string(n->transport));
			json_object_object_add(x, "capacity", json_object_new_uint64(n->capacity));
			json_object_object_add(x, "used", json_object_new_uint64(n->used));
			json_object_object_add(x, "objects", json_object_new_uint64(n->objects));
			json_object_object_add(x, "version", json_object_new_string(v->versions[i]));
			json_object_array_add(nodes, x);
		}
		json_object_object_add(o, "nodes", nodes);
		print_json(o);
	} else if (!v->self[0]) {
		printf("not in a cluster (kvcached runs without --master)\n");
	} else {
		printf("self %s, masters", v->self);
		for (size_t i = 0; i < v->n_masters; i++)
			printf("%s %s", i ? "," : "", v->masters[i]);
		printf(" (%zu of %zu joined)\n", v->masters_up, v->n_masters);
		printf("%-24s %-24s %-8s %-16s %12s %12s %10s %s\n", "NODE", "ADDRESS", "STATE",
		       "TRANSPORT", "CAPACITY", "USED", "OBJECTS", "VERSION");
		for (size_t i = 0; i < v->n_nodes; i++) {
			const struct kvc_node *n = &v->nodes[i];

			printf("%-24s %-24s %-8s %-16s %12llu %12llu %10llu %s\n", n->id, n->address,
			       n->state, n->transport, (unsigned long long) n->capacity,
			       (unsigned long long) n->used, (unsigned long long) n->objects,
			       v->versions[i][0] ? v->versions[i] : "-");
		}
	}
	kvc_cluster_free(v);
	return 0;
}

static int cmd_where(struct kvc_client *c, const char *key)
{
	char **nodes;
	size_t n;
	int r = kvc_where(c, key, &nodes, &n);

	if (r == -ENOENT) {
		if (arg_json)
			printf("[]\n");
		fprintf(stderr, "kvcachectl: %s: held by no node\n", key);
		return 1;
	}
	if (r < 0)
		return fail("where", r);
	if (arg_json) {
		struct json_object *a = json_object_new_array();

		for (size_t i = 0; i < n; i++)
			json_object_array_add(a, json_object_new_string(nodes[i]));
		print_json(a);
	} else
		for (size_t i = 0; i < n; i++)
			printf("%s\n", nodes[i]);
	kvc_where_free(nodes);
	return 0;
}

static int cmd_stats(struct kvc_client *c)
{
	struct kvc_counter *v;
	size_t n;
	int r = kvc_stats_get(c, &v, &n);

	if (r < 0)
		return fail("stats", r);
	if (arg_json) {
		struct json_object *o = json_object_new_object(), *tiers = json_object_new_object();

		for (size_t i = 0; i < n; i++) {
			const char *dot = strchr(v[i].name, '.');

			if (dot) {
				char tier[32];
				struct json_object *t;

				snprintf(tier, sizeof(tier), "%.*s", (int) (dot - v[i].name), v[i].name);
				if (!json_object_object_get_ex(tiers, tier, &t)) {
					t = json_object_new_object();
					json_object_object_add(tiers, tier, t);
				}
				json_object_object_add(t, dot + 1, json_object_new_uint64(v[i].value));
			} else
				json_object_object_add(o, v[i].name, json_object_new_uint64(v[i].value));
		}
		json_object_object_add(o, "tiers", tiers);
		print_json(o);
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%-24s %" PRIu64 "\n", v[i].name, v[i].value);
	}
	kvc_stats_free(v);
	return EXIT_OK;
}

static const char *state_name(int s)
{
	return s == KVC_STATE_RESERVED ? "reserved" : s == KVC_STATE_COMMITTED ? "committed" : "?";
}

static const char *tier_name(int t)
{
	switch (t) {
	case KVC_TIER_DEVICE: return "device";
	case KVC_TIER_DRAM: return "dram";
	case KVC_TIER_DISK: return "disk";
	default: return "?";
	}
}

static int cmp_keys(const void *a, const void *b)
{
	return strcmp(((const struct kvc_key_info *) a)->key, ((const struct kvc_key_info *) b)->key);
}

static int cmd_ls(struct kvc_client *c, const char *prefix, size_t limit)
{
	struct kvc_key_info *v;
	uint64_t total;
	size_t n;
	int r = kvc_list(c, prefix, limit, &v, &n, &total);

	if (r < 0)
		return fail("ls", r);
	qsort(v, n, sizeof(*v), cmp_keys);
	if (arg_json) {
		struct json_object *o = json_object_new_object(), *keys = json_object_new_array();

		for (size_t i = 0; i < n; i++) {
			struct json_object *k = json_object_new_object();

			json_object_object_add(k, "key", json_object_new_string(v[i].key));
			json_object_object_add(k, "size", json_object_new_uint64(v[i].size));
			json_object_object_add(k, "state", json_object_new_string(state_name(v[i].state)));
			json_object_object_add(k, "tier", json_object_new_string(tier_name(v[i].tier)));
			json_object_object_add(k, "on_disk", json_object_new_boolean(v[i].on_disk));
			json_object_array_add(keys, k);
		}
		json_object_object_add(o, "keys", keys);
		json_object_object_add(o, "total", json_object_new_uint64(total));
		print_json(o);
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%-12" PRIu64 " %-10s %-7s%s %s\n", v[i].size, state_name(v[i].state),
			       tier_name(v[i].tier), v[i].on_disk && v[i].tier != KVC_TIER_DISK ? "+d" : "  ",
			       v[i].key);
		if (total > n)
			fprintf(stderr, "(%zu of %" PRIu64 " keys shown; use --limit)\n", n, total);
	}
	kvc_list_free(v);
	return EXIT_OK;
}

static int read_all(int fd, uint8_t **ret, size_t *ret_len)
{
	size_t cap = 1 << 16, len = 0;
	uint8_t *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	for (;;) {
		ssize_t n;

		if (len == cap) {
			uint8_t *nb;

			if (cap >= KVC_VALUE_MAX) {
				free(buf);
				return -E2BIG;
			}
			nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int r = -errno;

			free(buf);
			return r;
		}
		if (n == 0)
			break;
		len += (size_t) n;
	}
	*ret = buf;
	*ret_len = len;
	return 0;
}

static int read_exact(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

static int cmd_put(struct kvc_client *c, const char *key, const char *file)
{
	struct stat st;
	int fd = 0, r;

	if (file && strcmp(file, "-") != 0) {
		fd = open(file, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			fprintf(stderr, "kvcachectl: cannot open %s: %s\n", file, strerror(errno));
			return EXIT_FAIL;
		}
	}
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
		/* A regular file goes straight into the reserved space. */
		struct kvc_buf b;

		r = kvc_reserve(c, key, (size_t) st.st_size, NULL, &b);
		if (r < 0)
			goto done;
		r = read_exact(fd, b.data, b.len);
		if (r < 0) {
			fprintf(stderr, "kvcachectl: cannot read %s: %s\n", file ? file : "stdin",
				strerror(-r));
			kvc_abort(c, &b);
			if (fd)
				close(fd);
			return EXIT_FAIL;
		}
		r = kvc_commit(c, &b);
		if (r == 0 && arg_push_to)
			r = kvc_push(c, key, arg_push_to);
	} else {
		uint8_t *buf = NULL;
		size_t len = 0;

		r = read_all(fd, &buf, &len);
		if (r < 0) {
			fprintf(stderr, "kvcachectl: cannot read %s: %s\n", file ? file : "stdin",
				kvc_strerror(r));
			if (fd)
				close(fd);
			return EXIT_FAIL;
		}
		r = len ? kvc_put(c, key, buf, len, &(struct kvc_put_opts) { .push_to = arg_push_to })
			: -EINVAL;
		if (!len)
			fprintf(stderr, "kvcachectl: put: empty value (values are 1 byte or more)\n");
		free(buf);
	}
done:
	if (fd)
		close(fd);
	return r < 0 ? fail(key, r) : EXIT_OK;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

static int cmd_get(struct kvc_client *c, const char *key, const char *file)
{
	struct kvc_view v;
	int fd = 1, r;

	r = kvc_acquire(c, key, &v);
	if (r < 0)
		return fail(key, r);
	if (file && strcmp(file, "-") != 0) {
		fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			fprintf(stderr, "kvcachectl: cannot create %s: %s\n", file, strerror(errno));
			kvc_release(c, &v);
			return EXIT_FAIL;
		}
	}
	r = write_all(fd, v.data, v.len);
	if (fd != 1 && close(fd) < 0 && r == 0)
		r = -errno;
	kvc_release(c, &v);
	if (r < 0) {
		fprintf(stderr, "kvcachectl: cannot write %s: %s\n", file ? file : "stdout",
			strerror(-r));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

static int parse_tier(const char *s, int *ret)
{
	if (strcmp(s, "device") == 0)
		*ret = KVC_TIER_DEVICE;
	else if (strcmp(s, "dram") == 0)
		*ret = KVC_TIER_DRAM;
	else if (strcmp(s, "disk") == 0)
		*ret = KVC_TIER_DISK;
	else if (strcmp(s, "all") == 0)
		*ret = KVC_TIER_DEFAULT;
	else
		return -EINVAL;
	return 0;
}

/* The command line, parsed: the command, its arguments, its options. */
struct ctl {
	const char *cmd;
	int nargs;
	char **args;     /* the command's arguments (nargs) */
	const char *a1, *a2;
	const char *prefix;
	bool force, all, hard, have_soft, have_bytes, have_limit, have_tier, have_refreshes;
	uint64_t limit, bytes, soft_ttl;
	int tier;
	long refreshes;
	bool dashdash;   /* its arguments came after -- */
};

/* Options only some commands take (the others refuse them, saying which
 * take them). */
enum {
	TAKES_REFRESHES = 1u << 0, /* -n: top */
	TAKES_LIMIT = 1u << 1,     /* --limit: ls */
	TAKES_EVICT = 1u << 2,     /* --tier, --bytes: evict */
	TAKES_ALL = 1u << 3,       /* --all: evict, rm */
	TAKES_PUSH_TO = 1u << 4,   /* --push-to: put */
	TAKES_RM = 1u << 5,        /* --force, --prefix: rm */
	TAKES_PIN = 1u << 6,       /* --soft, --hard: pin */
	NO_JSON = 1u << 7,         /* top: no --json */
	ARG_PREFIX = 1u << 8,      /* its argument is a prefix (ls), not a key */
	TAKES_BINARY = 1u << 9,    /* --binary: upgrade */
	ARGS_FLAGS = 1u << 10,     /* its arguments are kvcached's flags (upgrade) */
};

struct verb {
	const char *name;
	unsigned flags;
	/* the arguments' shape: EXIT_OK, or a usage error said */
	int (*check)(const struct ctl *a);
	int (*run)(struct kvc_client *c, const struct ctl *a);
};

static int check_none(const struct ctl *a)
{
	return a->nargs ? usage_error("%s takes no arguments", a->cmd) : EXIT_OK;
}

static int check_key(const struct ctl *a)
{
	return a->nargs != 1 ? usage_error("usage: %s KEY", a->cmd) : EXIT_OK;
}

static int check_ls(const struct ctl *a)
{
	return a->nargs > 1 ? usage_error("%s", "usage: ls [PREFIX] [--limit N]") : EXIT_OK;
}

static int check_put_get(const struct ctl *a)
{
	return a->nargs < 1 || a->nargs > 2 ? usage_error("usage: %s KEY [FILE|-]", a->cmd) : EXIT_OK;
}

static int check_pin(const struct ctl *a)
{
	if (a->nargs != 1 || (a->hard && a->have_soft))
		return usage_error("%s", "usage: pin KEY [--soft TTL|--hard]");
	return EXIT_OK;
}

static int check_rm(const struct ctl *a)
{
	if ((a->prefix || a->all) ? a->nargs != 0 || (a->prefix && a->all) : a->nargs != 1)
		return usage_error("%s", "usage: rm [--force] (KEY | --prefix P | --all)");
	if (a->prefix && strlen(a->prefix) > KVC_KEY_MAX)
		return usage_error("invalid prefix of %zu bytes: keys are at most 511 bytes",
				   strlen(a->prefix));
	return EXIT_OK;
}

static int check_prefetch(const struct ctl *a)
{
	if (a->nargs < 1 || a->nargs > 4096)
		return usage_error("%s", "usage: prefetch KEY...");
	for (int i = 0; i < a->nargs; i++)
		if (!*a->args[i] || strlen(a->args[i]) > KVC_KEY_MAX)
			return usage_error("invalid key '%s': keys are 1..511 bytes", a->args[i]);
	return EXIT_OK;
}

static int check_evict(const struct ctl *a)
{
	if (a->nargs != 0 || (a->all == a->have_bytes))
		return usage_error("%s", "usage: evict [--tier T] (--bytes N | --all)");
	return EXIT_OK;
}

static int run_status(struct kvc_client *c, const struct ctl *a)
{
	(void) a;
	return cmd_status(c);
}

static int run_cluster(struct kvc_client *c, const struct ctl *a)
{
	(void) a;
	return cmd_cluster(c);
}

static int run_where(struct kvc_client *c, const struct ctl *a)
{
	return cmd_where(c, a->a1);
}

static int run_prefetch(struct kvc_client *c, const struct ctl *a)
{
	int n = kvc_prefetch(c, (const char *const *) a->args, (size_t) a->nargs);

	if (n < 0)
		return fail("prefetch", n);
	printf("%d fetch%s started\n", n, n == 1 ? "" : "es");
	return EXIT_OK;
}

static int run_stats(struct kvc_client *c, const struct ctl *a)
{
	(void) a;
	return cmd_stats(c);
}

static int run_top(struct kvc_client *c, const struct ctl *a)
{
	int r = ctl_top(c, a->refreshes);

	return r < 0 && r != -EPIPE ? fail("top", r) : EXIT_OK;
}

static int run_ls(struct kvc_client *c, const struct ctl *a)
{
	return cmd_ls(c, a->a1, (size_t) a->limit);
}

static int run_put(struct kvc_client *c, const struct ctl *a)
{
	return cmd_put(c, a->a1, a->a2);
}

static int run_get(struct kvc_client *c, const struct ctl *a)
{
	return cmd_get(c, a->a1, a->a2);
}

static int run_exists(struct kvc_client *c, const struct ctl *a)
{
	int r = kvc_exists(c, a->a1);

	if (r < 0)
		return fail(a->a1, r);
	if (arg_json) {
		struct json_object *k = json_object_new_string(a->a1);

		printf("{\"key\": %s, \"exists\": %s}\n", json_object_to_json_string(k),
		       r ? "true" : "false");
		json_object_put(k);
	}
	return r ? EXIT_OK : EXIT_NOTFOUND;
}

static int run_rm(struct kvc_client *c, const struct ctl *a)
{
	uint64_t skipped = 0;
	int64_t n;
	int r;

	if (!a->prefix && !a->all) {
		r = a->force ? kvc_remove_force(c, a->a1) : kvc_remove(c, a->a1);
		return r < 0 ? fail(a->a1, r) : EXIT_OK;
	}
	n = kvc_remove_prefix(c, a->prefix, a->force ? KVC_REMOVE_FORCE : 0, &skipped);
	if (n < 0)
		return fail("rm", (int) n);
	if (arg_json)
		printf("{\"removed\": %" PRId64 ", \"skipped\": %" PRIu64 "}\n", n, skipped);
	else
		printf("removed %" PRId64 " objects\n", n);
	if (skipped && !arg_json)
		fprintf(stderr, "kvcachectl: %" PRIu64 " objects in use were kept (viewed%s)\n",
			skipped, a->force ? "" : " or leased; --force removes leased ones");
	return EXIT_OK;
}

static int run_pin(struct kvc_client *c, const struct ctl *a)
{
	int r = kvc_pin(c, a->a1, a->hard ? KVC_PIN_HARD : 0, (uint32_t) a->soft_ttl);

	return r < 0 ? fail(a->a1, r) : EXIT_OK;
}

static int run_unpin(struct kvc_client *c, const struct ctl *a)
{
	int r = kvc_unpin(c, a->a1);

	return r < 0 ? fail(a->a1, r) : EXIT_OK;
}

static int run_flush(struct kvc_client *c, const struct ctl *a)
{
	int r = kvc_flush(c, -1);

	(void) a;
	return r < 0 ? fail("flush", r) : EXIT_OK;
}

static int run_evict(struct kvc_client *c, const struct ctl *a)
{
	uint64_t freed, objs;
	int r = kvc_evict(c, a->tier, a->bytes, a->all ? KVC_EVICT_ALL : 0, &freed, &objs);

	if (r < 0)
		return fail("evict", r);
	if (arg_json)
		printf("{\"bytes\": %" PRIu64 ", \"objects\": %" PRIu64 "}\n", freed, objs);
	else
		printf("evicted %" PRIu64 " objects, %" PRIu64 " bytes\n", objs, freed);
	return EXIT_OK;
}

static int check_upgrade(const struct ctl *a)
{
	if (a->nargs && !a->dashdash)
		return usage_error("%s", "upgrade takes kvcached's flags after --");
	return EXIT_OK;
}

static int run_upgrade(struct kvc_client *c, const struct ctl *a)
{
	bool flags = a->dashdash && a->nargs > 0;

	return ctl_upgrade(c, socket_path, arg_binary, flags ? a->args : NULL,
			   flags ? a->nargs : 0, arg_json);
}

static const struct verb verbs[] = {
	{ "status", 0, check_none, run_status },
	{ "stats", 0, check_none, run_stats },
	{ "flush", 0, check_none, run_flush },
	{ "cluster", 0, check_none, run_cluster },
	{ "top", TAKES_REFRESHES | NO_JSON, check_none, run_top },
	{ "ls", TAKES_LIMIT | ARG_PREFIX, check_ls, run_ls },
	{ "put", TAKES_PUSH_TO, check_put_get, run_put },
	{ "get", 0, check_put_get, run_get },
	{ "pin", TAKES_PIN, check_pin, run_pin },
	{ "rm", TAKES_ALL | TAKES_RM, check_rm, run_rm },
	{ "exists", 0, check_key, run_exists },
	{ "unpin", 0, check_key, run_unpin },
	{ "where", 0, check_key, run_where },
	{ "prefetch", 0, check_prefetch, run_prefetch },
	{ "evict", TAKES_EVICT | TAKES_ALL, check_evict, run_evict },
	{ "upgrade", TAKES_BINARY | ARGS_FLAGS, check_upgrade, run_upgrade },
};

/* Options given to a command that does not take them: the first, said. */
static int check_options(const struct verb *v, const struct ctl *a)
{
	if (a->have_refreshes && !(v->flags & TAKES_REFRESHES))
		return usage_error("%s", "-n applies to top only");
	if (arg_json && (v->flags & NO_JSON))
		return usage_error("%s", "top has no --json (see stats --json)");
	if (a->have_limit && !(v->flags & TAKES_LIMIT))
		return usage_error("%s", "--limit applies to ls only");
	if ((a->have_tier || a->have_bytes) && !(v->flags & TAKES_EVICT))
		return usage_error("%s", "--tier and --bytes apply to evict only");
	if (a->all && !(v->flags & TAKES_ALL))
		return usage_error("%s", "--all applies to evict and rm only");
	if (arg_push_to && !(v->flags & TAKES_PUSH_TO))
		return usage_error("%s", "--push-to applies to put only");
	if ((a->force || a->prefix) && !(v->flags & TAKES_RM))
		return usage_error("%s", "--force and --prefix apply to rm only");
	if ((a->hard || a->have_soft) && !(v->flags & TAKES_PIN))
		return usage_error("%s", "--soft and --hard apply to pin only");
	if (arg_binary && !(v->flags & TAKES_BINARY))
		return usage_error("%s", "--binary applies to upgrade only");
	if (v->flags & ARGS_FLAGS)
		return EXIT_OK;
	if (a->a1 && !(v->flags & ARG_PREFIX) && (strlen(a->a1) == 0 || strlen(a->a1) > KVC_KEY_MAX))
		return usage_error("invalid key '%s': keys are 1..511 bytes", a->a1);
	if (a->a1 && (v->flags & ARG_PREFIX) && strlen(a->a1) > KVC_KEY_MAX)
		return usage_error("invalid prefix of %zu bytes: keys are at most 511 bytes",
				   strlen(a->a1));
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "limit", required_argument, NULL, 'l' },
		{ "tier", required_argument, NULL, 't' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "all", no_argument, NULL, 'a' },
		{ "soft", required_argument, NULL, 'S' },
		{ "hard", no_argument, NULL, 'H' },
		{ "force", no_argument, NULL, 'f' },
		{ "push-to", required_argument, NULL, 'U' },
		{ "prefix", required_argument, NULL, 'P' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "local-only", no_argument, NULL, 'o' },
		{ "peek", no_argument, NULL, 'K' },
		{ "binary", required_argument, NULL, 'B' },
		{ 0 },
	};
	struct ctl a = { .tier = KVC_TIER_DEFAULT };
	const struct verb *v = NULL;
	struct kvc_client *c = NULL;
	int opt, r;

	/* "+" would stop at the command; options may also follow it. */
	while ((opt = getopt_long(argc, argv, "s:jhVn:", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			arg_socket = optarg;
			break;
		case 'j':
			arg_json = true;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case 'V':
			printf("kvcachectl %s\n", KVC_VERSION);
			return EXIT_OK;
		case 'l': {
			char *end;

			errno = 0;
			a.limit = strtoull(optarg, &end, 10);
			if (errno || *end || !*optarg || optarg[0] == '-' || a.limit == 0 ||
			    a.limit > 4096)
				return usage_error("invalid --limit '%s': expected 1..4096", optarg);
			a.have_limit = true;
			break;
		}
		case 't':
			if (parse_tier(optarg, &a.tier) < 0)
				return usage_error("invalid --tier '%s': expected device, dram or disk",
						   optarg);
			a.have_tier = true;
			break;
		case 'b':
			if (kvc_parse_size(optarg, &a.bytes) < 0)
				return usage_error("invalid --bytes '%s': expected a size like 64MB",
						   optarg);
			a.have_bytes = true;
			break;
		case 'a':
			a.all = true;
			break;
		case 'S': {
			char *end;

			errno = 0;
			a.soft_ttl = strtoull(optarg, &end, 10);
			if (errno || *end || !*optarg || optarg[0] == '-' || a.soft_ttl > UINT32_MAX)
				return usage_error("invalid --soft '%s': expected a TTL in ms", optarg);
			a.have_soft = true;
			break;
		}
		case 'H':
			a.hard = true;
			break;
		case 'U':
			arg_push_to = optarg;
			break;
		case 'f':
			a.force = true;
			break;
		case 'P':
			a.prefix = optarg;
			break;
		case 'o':
			arg_local_only = true;
			break;
		case 'K':
			arg_peek = true;
			break;
		case 'B':
			arg_binary = optarg;
			break;
		case 'n': {
			char *end;

			errno = 0;
			a.refreshes = strtol(optarg, &end, 10);
			if (errno || *end || !*optarg || a.refreshes < 1 || a.refreshes > 1000000)
				return usage_error("invalid -n '%s': expected 1..1000000", optarg);
			a.have_refreshes = true;
			break;
		}
		default:
			fprintf(stderr, "Try 'kvcachectl --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind >= argc)
		return usage_error("%s", "no command given");
	a.cmd = argv[optind];
	a.nargs = argc - optind - 1;
	a.args = argv + optind + 1;
	a.a1 = a.nargs > 0 ? a.args[0] : NULL;
	a.a2 = a.nargs > 1 ? a.args[1] : NULL;
	a.dashdash = optind >= 2 && !strcmp(argv[optind - 1], "--");

	/* Check the command line fully before touching the daemon. */
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]) && !v; i++)
		if (strcmp(a.cmd, verbs[i].name) == 0)
			v = &verbs[i];
	if (!v)
		return usage_error("unknown command '%s'", a.cmd);
	r = v->check(&a);
	if (r == EXIT_OK)
		r = check_options(v, &a);
	if (r != EXIT_OK)
		return r;

	r = connect_daemon(&c);
	if (r != EXIT_OK)
		return r;
	if (arg_local_only || arg_peek)
		kvc_set_get_flags(c, (arg_local_only ? KVC_LOCAL_ONLY : 0) | (arg_peek ? KVC_PEEK : 0));
	r = v->run(c, &a);
	kvc_disconnect(c);
	return finish_stdout(r);
}
