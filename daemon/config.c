/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stddef.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kvc-config.h"
#include "log.h"
#include "wire.h"

#define CONFIG_MAX_FILE (1u << 20)
#define LOG_TOPIC "config"

static void warn_unknown(const char *key)
{
	log_warn("ignoring unknown config key \"%s\"", key);
}

static bool env_is(const char *name, const char *value)
{
	const char *v = getenv(name);

	return v && (value ? !strcmp(v, value) : true);
}

static unsigned long env_ulong(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? strtoul(v, NULL, 10) : 0;
}

static void test_hooks_read(struct test_hooks *t)
{
	const char *bogus = getenv("KVCACHE_TEST_BOGUS_RDMA");

	t->no_channel_push = env_is("KVCACHE_TEST_NO_CHANNEL_PUSH", NULL);
	t->no_channel_stream = env_is("KVCACHE_TEST_NO_CHANNEL_STREAM", "1");
	t->no_sums_ahead = env_is("KVCACHE_TEST_NO_SUMS_AHEAD", "1");
	t->sums_ahead_delay_ms = (unsigned) (env_ulong("KVCACHE_TEST_SUMS_AHEAD_DELAY_MS") % 60000);
	t->recovery_pause_ms = (unsigned) (env_ulong("KVCACHE_TEST_RECOVERY_PAUSE_MS") % 60000);
	t->shared_write_ms = (unsigned) (env_ulong("KVCACHE_TEST_SHARED_WRITE_MS") % 60000);
	t->corrupt_peer_send = env_is("KVCACHE_TEST_CORRUPT_PEER_SEND", "1");
	t->cut_peer_send = env_is("KVCACHE_TEST_CUT_PEER_SEND", "1");
	if (bogus && (!strcmp(bogus, "rkey") || !strcmp(bogus, "address")))
		t->bogus_rdma = bogus[0];
	t->rdma_over_tcp = env_is("KVCACHE_TEST_RDMA_OVER_TCP", "1");
	t->no_eager_push = env_is("KVCACHE_TEST_NO_EAGER_PUSH", "1");
	t->directory_queue = env_ulong("KVCACHE_TEST_DIRECTORY_QUEUE");
	t->peer_major = (unsigned) (env_ulong("KVCACHE_TEST_PEER_MAJOR") % 256);
}

void config_init(struct config *c)
{
	memset(c, 0, sizeof(*c));
	c->dram_size = CONFIG_DEFAULT_DRAM_SIZE;
	c->hugepages = SHM_HUGEPAGES_AUTO;
	strcpy(c->log_level, "notice");
	c->poll_us = CONFIG_DEFAULT_POLL_US;
	c->high_watermark = 0.95;
	c->eviction_ratio = 0.05;
	c->lease_ttl_ms = CONFIG_DEFAULT_LEASE_TTL_MS;
	c->max_leased_ratio = 0.5;
	c->promotion_hits = CONFIG_DEFAULT_PROMOTION_HITS;
	c->disk_size = UINT64_C(10) << 30;
	c->disk_zstd_level = 3;
	c->shared_size = UINT64_C(100) << 30;
	strcpy(c->protocol, "auto");
	c->client_ttl_s = 10;
	strcpy(c->metadata_server, "P2PHANDSHAKE");
	c->remote_timeout_ms = CONFIG_DEFAULT_REMOTE_TIMEOUT_MS;
	snprintf(c->metrics_address, sizeof(c->metrics_address), "127.0.0.1");
	c->data_streams = CONFIG_DEFAULT_DATA_STREAMS;
	snprintf(c->tcp_congestion, sizeof(c->tcp_congestion), "%s", "auto");
	c->max_clients = CONFIG_DEFAULT_MAX_CLIENTS;
	c->spill_wait_ms = CONFIG_DEFAULT_SPILL_WAIT_MS;
	c->lookup_wait_ms = CONFIG_DEFAULT_LOOKUP_WAIT_MS;
	c->max_channels = CONFIG_DEFAULT_MAX_CHANNELS;
	test_hooks_read(&c->test);
}

int config_parse_hugepages(const char *s, enum shm_hugepages *ret)
{
	if (strcmp(s, "auto") == 0)
		*ret = SHM_HUGEPAGES_AUTO;
	else if (strcmp(s, "on") == 0 || strcmp(s, "true") == 0 || strcmp(s, "yes") == 0)
		*ret = SHM_HUGEPAGES_ON;
	else if (strcmp(s, "off") == 0 || strcmp(s, "false") == 0 || strcmp(s, "no") == 0)
		*ret = SHM_HUGEPAGES_OFF;
	else
		return -EINVAL;
	return 0;
}

/* A JSON value as text: strings as they are, integers printed.  Sizes may be
 * given either way in mooncake.json. */
enum json_kind {
	JSON_STRING,
	JSON_WHOLE,  /* a whole number, or a string */
	JSON_NUMBER, /* any number, or a string */
};

static int json_text(struct json_object *o, const char *key, char *buf, size_t cap,
		     enum json_kind kind, char *err)
{
	bool allow_int = kind != JSON_STRING;

	switch (json_object_get_type(o)) {
	case json_type_string:
		if (json_object_get_string_len(o) >= (int) cap ||
		    strlen(json_object_get_string(o)) != (size_t) json_object_get_string_len(o)) {
			snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": string too long or has NUL", key);
			return -EINVAL;
		}
		strcpy(buf, json_object_get_string(o));
		return 0;
	case json_type_int:
		if (allow_int) {
			int64_t v = json_object_get_int64(o);

			if (v < 0 || (v == INT64_MAX && errno == ERANGE)) {
				snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": out of range", key);
				return -EINVAL;
			}
			snprintf(buf, cap, "%lld", (long long) v);
			return 0;
		}
		break;
	case json_type_double:
		if (kind == JSON_NUMBER) {
			snprintf(buf, cap, "%.17g", json_object_get_double(o));
			return 0;
		}
		if (allow_int) {
			double d = json_object_get_double(o);

			if (d >= 0 && d < 1.8e19 && d == (double) (uint64_t) d) {
				snprintf(buf, cap, "%llu", (unsigned long long) (uint64_t) d);
				return 0;
			}
			snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": not a whole number of bytes", key);
			return -EINVAL;
		}
		break;
	default:
		break;
	}
	snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": expected a %s", key,
		 allow_int ? "number or a string" : "string");
	return -EINVAL;
}

/*
 * Every option, once: its flag (dashes), its JSON key and the Mooncake
 * spellings (underscores: every name is accepted both ways), its type and
 * limits, and its --help line.  The command line, the JSON file and --help
 * are all driven by this table.
 */
enum opt_type {
	T_SIZE,        /* 4096, 512MB, 1GiB; min..max */
	T_U64,         /* a whole number, min..max */
	T_U32,
	T_RATIO,       /* a fraction; lo_open: min excluded */
	T_STRING,      /* fits the field; nonempty unless min == 0 */
	T_HUGEPAGES,
	T_LOG_LEVEL,
	T_PROTOCOL,
	T_ZSTD,        /* zstd | none: bool */
	T_FLAG,        /* command line: no argument; JSON: true/false */
	T_CONFIG,      /* --config: read first, by config_parse_args() */
};

struct opt_def {
	const char *name;      /* dashes; the JSON key is the same with underscores */
	const char *alias;     /* another spelling (Mooncake's), or NULL */
	char short_name;
	enum opt_type type;
	size_t offset, size;   /* the field in struct config */
	double min, max;
	bool lo_open;          /* ratio: min itself is not allowed */
	bool json_only;        /* Mooncake keys the daemon reads but has no flag for */
	const char *arg;       /* --help: the argument's name */
	const char *help;      /* --help: what it does (\n continues the line) */
};

#define FIELD(f) offsetof(struct config, f), sizeof(((struct config *) 0)->f)
#define KiB1 1024.0
#define MiB1 (1024.0 * 1024.0)

static const struct opt_def opts[] = {
	{ "socket", NULL, 's', T_STRING, FIELD(socket), 1, 0, false, false, "PATH",
	  "control socket (default: $KVCACHE_SOCKET,\n"
	  "$XDG_RUNTIME_DIR/kvcached.sock, /tmp/kvcached-<uid>.sock)" },
	{ "dram-size", "global-segment-size", 0, T_SIZE, FIELD(dram_size), MiB1, 0, false, false,
	  "SIZE", "DRAM tier capacity, e.g. 512MB, 4GiB (default 1GiB);\n"
	  "also --global-segment-size, --global_segment_size" },
	{ "hugepages", NULL, 0, T_HUGEPAGES, FIELD(hugepages), 0, 0, false, false, "MODE",
	  "auto|on|off: 2 MiB pages for shared segments (default auto)" },
	{ "prefault", NULL, 0, T_HUGEPAGES, FIELD(prefault), 0, 0, false, false, "MODE",
	  "auto|on|off: fault the memory tiers (and the start of\n"
	  "the catalog) in on a background thread at start, so\n"
	  "that the first bytes stored in a\n"
	  "page do not pay for clearing it; commits the tiers'\n"
	  "memory at start (default auto = on; off: as used)" },
	{ "config", NULL, 0, T_CONFIG, 0, 0, 0, 0, false, false, "FILE",
	  "JSON config; mooncake.json keys are understood\n"
	  "(default: $MOONCAKE_CONFIG_PATH if set); $MOONCAKE_MASTER\n"
	  "and $MOONCAKE_GLOBAL_SEGMENT_SIZE override the file" },
	{ "device-size", NULL, 0, T_SIZE, FIELD(device_size), MiB1, 0, false, false, "SIZE",
	  "capacity of the device tier (default 0 = off)" },
	{ "eviction-high-watermark-ratio", NULL, 0, T_RATIO, FIELD(high_watermark), 0, 1, true, false,
	  "R", "a tier above R x capacity is evicted down to\n"
	  "(R - --eviction-ratio) x capacity (default 0.95)" },
	{ "eviction-ratio", NULL, 0, T_RATIO, FIELD(eviction_ratio), 0, 1, false, false, "R",
	  "see above (default 0.05)" },
	{ "default-kv-lease-ttl", NULL, 0, T_U64, FIELD(lease_ttl_ms), 0, 86400000.0 * 365, false,
	  false, "MS", "a hit protects an object this long (default 10000)" },
	{ "max-leased-ratio", NULL, 0, T_RATIO, FIELD(max_leased_ratio), 0, 1, false, false, "R",
	  "leases protect at most R x a tier's capacity; a new\n"
	  "one breaks the oldest beyond it (default 0.5)" },
	{ "promotion-hits", NULL, 0, T_U32, FIELD(promotion_hits), 1, 1000000, false, false, "N",
	  "dram hits before an object moves to device (default 2)" },
	{ "disk-dir", NULL, 0, T_STRING, FIELD(disk_dir), 1, 0, false, false, "DIR",
	  "spill to record files here (default: no disk tier);\n"
	  "records found there at start are served again" },
	{ "disk-size", NULL, 0, T_SIZE, FIELD(disk_size), MiB1, 0, false, false, "SIZE",
	  "disk tier capacity (default 10GiB)" },
	/* Mooncake's SSD offload: a disk tier in ssd_offload_path */
	{ "enable-ssd-offload", NULL, 0, T_FLAG, FIELD(ssd_offload), 0, 0, false, true, NULL, NULL },
	{ "ssd-offload-path", NULL, 0, T_STRING, FIELD(ssd_offload_path), 0, 0, false, true, NULL,
	  NULL },
	{ "disk-compress", NULL, 0, T_ZSTD, FIELD(disk_zstd), 0, 0, false, false, "zstd|none",
	  "compress records (default none)" },
	{ "disk-compress-level", NULL, 0, T_U32, FIELD(disk_zstd_level), 1, 19, false, false, "N",
	  "zstd level 1..19 (default 3)" },
	{ "shared-dir", "storage-backends", 0, T_STRING, FIELD(shared_dir), 1, 0, false, false,
	  "DIR", "a directory several nodes mount (NFS, 3FS): objects\n"
	  "leaving memory are kept there and any node reads them\n"
	  "(default: no shared tier); also UCM's storage_backends" },
	{ "shared-size", NULL, 0, T_SIZE, FIELD(shared_size), MiB1, 0, false, false, "SIZE",
	  "the shared tier's capacity, kept by every node using\n"
	  "it (default 100GiB)" },
	{ "shared-write-through", NULL, 0, T_FLAG, FIELD(shared_write_through), 0, 0, false, false,
	  NULL, "copy each put to the shared tier as it commits (a\n"
	  "prefill node), not only as it leaves memory" },
	{ "spill-wait-ms", NULL, 0, T_U64, FIELD(spill_wait_ms), 0, 3600000, false, false, "MS",
	  "with a disk tier, a put that needs room held by\n"
	  "objects not yet on disk waits this long for the\n"
	  "spill, then fails with EAGAIN (default 5000)" },
	{ "lookup-wait-ms", NULL, 0, T_U64, FIELD(lookup_wait_ms), 0, 60000, false, false, "MS",
	  "a lookup of a key whose put is in progress waits this\n"
	  "long for its commit instead of missing (default 2000;\n"
	  "0 = a miss at once)" },
	{ "max-clients", NULL, 0, T_U32, FIELD(max_clients), 1, 1000000, false, false, "N",
	  "connected clients at once (default 1024)" },
	{ "max-channels", NULL, 0, T_U32, FIELD(max_channels), 1, 1000000, false, false, "N",
	  "shared-memory channels at once (default 4096)" },
	{ "max-registered-bytes", NULL, 0, T_SIZE, FIELD(max_registered), 0, 0, false, false, "SIZE",
	  "registered buffers of all clients together\n"
	  "(default 0 = half of this machine's memory)" },
	{ "take-over", NULL, 0, T_FLAG, FIELD(take_over), 0, 0, false, false, NULL,
	  "take the memory tiers (with what they hold), their\n"
	  "catalog and the listening socket over from the kvcached\n"
	  "serving --socket, which stops (a warm restart; tier\n"
	  "sizes must match); with nobody serving, start empty" },
	{ "allow-overcommit", NULL, 0, T_FLAG, FIELD(allow_overcommit), 0, 0, false, false, NULL,
	  "start even when the memory tiers exceed this\n"
	  "machine's physical memory" },
	{ "poll-us", NULL, 0, T_U32, FIELD(poll_us), 0, CONFIG_MAX_POLL_US, false, false, "N",
	  "keep polling client rings this long after serving a\n"
	  "client on its ring before sleeping (default 100,\n"
	  "stretched up to 64x; data threads poll a peer's\n"
	  "socket up to 10x this without a byte; 0 = never spin)" },
	{ "log-level", NULL, 0, T_LOG_LEVEL, FIELD(log_level), 0, 0, false, false, "LEVEL",
	  "error|warn|notice|info|debug|trace (default notice);\n"
	  "$KVCACHE_LOG=\"info,session:debug\" sets it per topic" },
	/* the cluster (docs/cluster.rst); mooncake.json spellings as aliases */
	{ "master", "master-server-address", 0, T_STRING, FIELD(master_server_address), 0, 0, false,
	  false, "HOST:PORT[,...]", "join the cluster of these masters (several: the\n"
	  "directory is sharded over them by key hash)" },
	{ "listen", NULL, 0, T_STRING, FIELD(listen), 0, 0, false, false, "[HOST:]PORT",
	  "serve peers here (default: port 50052 on the --advertise\n"
	  "host, else on every address)" },
	{ "advertise", "local-hostname", 0, T_STRING, FIELD(local_hostname), 0, 0, false, false,
	  "HOST", "the address peers reach this node at (default: the\n"
	  "--listen host, else the host name)" },
	{ "node-id", NULL, 0, T_STRING, FIELD(node_id), 0, 0, false, false, "NAME",
	  "this node's name in the cluster (default HOST:PORT)" },
	{ "protocol", NULL, 0, T_PROTOCOL, FIELD(protocol), 0, 0, false, false, "tcp|rdma|auto",
	  "how data moves between nodes: auto (default) uses RDMA\n"
	  "(UCX) with peers that have it when a verbs port is\n"
	  "active here, else tcp; rdma refuses to start without one;\n"
	  "Mooncake's other names (ascend, nvlink, ...) run as auto" },
	{ "device-name", NULL, 0, T_STRING, FIELD(device_name), 0, 0, false, false, "NAMES",
	  "RDMA devices to use, e.g. mlx5_0:1 (default: any active)" },
	{ "numa-node", NULL, 0, T_STRING, FIELD(numa_node), 0, 0, false, false, "N|auto",
	  "bind the memory tiers and the daemon's threads to NUMA\n"
	  "node N; auto: the node of the RDMA device in use (none:\n"
	  "placement is left alone; default)" },
	{ "metadata-server", NULL, 0, T_STRING, FIELD(metadata_server), 0, 0, false, false,
	  "P2PHANDSHAKE", "how members find each other (default P2PHANDSHAKE:\n"
	  "through the master; etcd://HOST:PORT[,...][/ID]: through etcd)" },
	{ "client-ttl", NULL, 0, T_U32, FIELD(client_ttl_s), 1, 86400, false, false, "S",
	  "with an etcd metadata server, a node silent this long\n"
	  "leaves the member list (default 10)" },
	{ "cluster-secret-file", NULL, 0, T_STRING, FIELD(secret_file), 0, 0, false, false, "FILE",
	  "every peer and master connection proves this secret" },
	{ "insecure", NULL, 0, T_FLAG, FIELD(insecure), 0, 0, false, false, NULL,
	  "listen on a non-loopback address without a secret" },
	{ "remote-timeout-ms", NULL, 0, T_U64, FIELD(remote_timeout_ms), 1, 3600000, false, false,
	  "MS", "a remote operation ends within this (default 2000)" },
	{ "data-streams", NULL, 0, T_U32, FIELD(data_streams), 1, 16, false, false, "N",
	  "transfers with other nodes at once, each way: fetching\n"
	  "and pushing, and serving (default 2)" },
	{ "peer-tcp-congestion", NULL, 0, T_STRING, FIELD(tcp_congestion), 1, 0, false, false,
	  "NAME", "TCP congestion control of connections to other nodes\n"
	  "and masters: auto (default) uses cubic where the\n"
	  "system's is bbr (whose pacing starves bursts of\n"
	  "fetches) on paths under 1 ms; system: the system's;\n"
	  "or a name (cubic, dctcp)" },
	/* operations (docs/operating.rst) */
	{ "metrics-port", NULL, 0, T_U32, FIELD(metrics_port), 0, 65535, false, false, "PORT",
	  "serve GET /metrics (Prometheus) and /health over HTTP\n"
	  "on this port (default 0 = off)" },
	{ "metrics-address", NULL, 0, T_STRING, FIELD(metrics_address), 1, 0, false, false, "ADDR",
	  "the address /metrics listens on (default 127.0.0.1)" },
};

#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* Does `key` spell `name` (dashes and underscores alike)? */
static bool same_name(const char *key, const char *name)
{
	for (; *key && *name; key++, name++)
		if (*key != *name && !((*key == '_' || *key == '-') && *name == '-'))
			return false;
	return !*key && !*name;
}

static const struct opt_def *find_opt(const char *key)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (same_name(key, opts[i].name) || (opts[i].alias && same_name(key, opts[i].alias)))
			return &opts[i];
	return NULL;
}

static int parse_whole(const char *v, uint64_t *ret)
{
	char *end;
	unsigned long long n;

	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-')
		return -EINVAL;
	*ret = n;
	return 0;
}

/*
 * The transports Mooncake's transfer engine names.  kvcache drives tcp and
 * rdma; a file written for one of the others (vLLM-Ascend's mooncake.json
 * says "ascend") runs as auto, and the daemon says once what auto chose
 * (config.protocol_asked keeps the name for that).  A name nobody uses is
 * still a typo and is refused.
 */
static const char *const foreign_protocols[] = {
	/* MultiTransport::installTransport's names, and the store's rpc_only */
	"ascend", "ub", "barex", "nvmeof", "nccl", "nvlink_intra", "hip", "maca", "musa",
	"nvlink", "cxl", "ubshmem", "efa", "cxi", "sunrise_link", "rpc_only",
	/* what Mooncake's Ascend examples call their transports */
	"hccl", "ascend_direct",
};

static int set_protocol(struct config *c, const char *v, const char *what, char *err)
{
	char lower[sizeof(c->protocol)];
	size_t i;

	for (i = 0; v[i] && i + 1 < sizeof(lower); i++)
		lower[i] = (char) tolower((unsigned char) v[i]);
	lower[i] = '\0';
	if (!*v) /* Mooncake's store takes "" for its host-memory default */
		strcpy(lower, "auto");
	if (!v[i] && (!strcmp(lower, "tcp") || !strcmp(lower, "rdma") || !strcmp(lower, "auto"))) {
		strcpy(c->protocol, lower);
		c->protocol_asked[0] = '\0';
		return 0;
	}
	for (size_t k = 0; !v[i] && k < sizeof(foreign_protocols) / sizeof(foreign_protocols[0]);
	     k++)
		if (!strcmp(lower, foreign_protocols[k])) {
			strcpy(c->protocol, "auto");
			strcpy(c->protocol_asked, lower);
			return 0;
		}
	snprintf(err, CONFIG_ERR_MAX, "invalid value '%.64s' for %s: expected tcp, rdma or auto "
		 "(Mooncake's ascend, nvlink, cxl, efa, ... run as auto)", v, what);
	return -EINVAL;
}

/* Where Mooncake's SSD offload goes without ssd_offload_path (its
 * FileStorageConfig's storage_filepath) */
#define MOONCAKE_OFFLOAD_DIR "/data/file_storage"

/* A yes/no as Mooncake's configuration reads one (true/false, yes/no,
 * on/off, 1/0, enable/disable, any case; empty is no): 1, 0, or -1. */
static int flag_word(const char *v)
{
	static const char *const yes[] = { "true", "yes", "on", "1", "enable" };
	static const char *const no[] = { "", "false", "no", "off", "0", "disable" };
	char w[16];
	size_t n = 0;

	while (*v == ' ' || *v == '\t')
		v++;
	for (; *v && n < sizeof(w) - 1; v++)
		w[n++] = (char) tolower((unsigned char) *v);
	while (n && (w[n - 1] == ' ' || w[n - 1] == '\t'))
		n--;
	if (*v)
		return -1;
	w[n] = '\0';
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		if (!strcmp(w, yes[i]))
			return 1;
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		if (!strcmp(w, no[i]))
			return 0;
	return -1;
}

/* A JSON config's yes/no: true or false; Mooncake's keys (mooncake) also
 * take the words and numbers Mooncake's configuration reads ("enable", 1).
 * 1, 0, or -1. */
static int json_flag(struct json_object *val, bool mooncake)
{
	if (json_object_is_type(val, json_type_boolean))
		return json_object_get_boolean(val);
	if (mooncake && json_object_is_type(val, json_type_int)) {
		int64_t n = json_object_get_int64(val);

		return n == 0 || n == 1 ? (int) n : -1;
	}
	if (mooncake && json_object_is_type(val, json_type_string))
		return flag_word(json_object_get_string(val));
	return -1;
}

/* Set option o from text v; `what` is the name as the user spelled it. */
static int set_opt(struct config *c, const struct opt_def *o, const char *what, const char *v,
		   char *err)
{
	void *field = (uint8_t *) c + o->offset;
	uint64_t n;
	double x;
	char *end;

	switch (o->type) {
	case T_SIZE:
		if (shm_parse_size(v, &n) < 0) {
			snprintf(err, CONFIG_ERR_MAX,
				 "invalid value '%s' for %s: expected a size like 4096, 512MB or 1GiB",
				 v, what);
			return -EINVAL;
		}
		if (o->min && n && n < (uint64_t) o->min) {
			snprintf(err, CONFIG_ERR_MAX, "%s must be %sat least 1MiB (got '%s')", what,
				 strcmp(o->name, "device-size") == 0 ? "0 (off) or " : "", v);
			return -EINVAL;
		}
		if (o->min && !n && strcmp(o->name, "device-size") != 0) {
			snprintf(err, CONFIG_ERR_MAX, "%s must be at least 1MiB (got '%s')", what, v);
			return -EINVAL;
		}
		*(uint64_t *) field = n;
		return 0;
	case T_U64:
	case T_U32:
		if (parse_whole(v, &n) < 0 || (double) n < o->min || (double) n > o->max) {
			snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected %.0f..%.0f", v,
				 what, o->min, o->max);
			return -EINVAL;
		}
		if (o->type == T_U64)
			*(uint64_t *) field = n;
		else if (o->size == sizeof(int))
			*(uint32_t *) field = (uint32_t) n;
		return 0;
	case T_RATIO:
		errno = 0;
		x = strtod(v, &end);
		if (errno || end == v || *end || !(x <= o->max) ||
		    (o->lo_open ? !(x > o->min) : !(x >= o->min))) {
			snprintf(err, CONFIG_ERR_MAX,
				 "invalid value '%s' for %s: expected a ratio in %c%g, %g]", v, what,
				 o->lo_open ? '(' : '[', o->min, o->max);
			return -EINVAL;
		}
		*(double *) field = x;
		return 0;
	case T_STRING:
		if (o->min && !*v) {
			snprintf(err, CONFIG_ERR_MAX, "%s must not be empty", what);
			return -EINVAL;
		}
		if (strlen(v) >= o->size) {
			snprintf(err, CONFIG_ERR_MAX, "%s is too long (at most %zu bytes)", what,
				 o->size - 1);
			return -EINVAL;
		}
		strcpy(field, v);
		return 0;
	case T_HUGEPAGES:
		if (config_parse_hugepages(v, field) < 0) {
			snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected auto, on or off",
				 v, what);
			return -EINVAL;
		}
		return 0;
	case T_LOG_LEVEL:
		if (log_level_parse(v) < 0 || strlen(v) >= o->size) {
			snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected error, warn, "
				 "notice, info, debug or trace", v, what);
			return -EINVAL;
		}
		strcpy(field, v);
		return 0;
	case T_PROTOCOL:
		return set_protocol(c, v, what, err);
	case T_ZSTD:
		if (strcmp(v, "zstd") && strcmp(v, "none")) {
			snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected zstd or none", v,
				 what);
			return -EINVAL;
		}
		*(bool *) field = !strcmp(v, "zstd");
		return 0;
	case T_FLAG:
		/* a command-line flag has no value; a file's or a variable's says */
		if (v) {
			int f = flag_word(v);

			if (f < 0) {
				snprintf(err, CONFIG_ERR_MAX,
					 "invalid value '%s' for %s: expected true or false", v, what);
				return -EINVAL;
			}
			*(bool *) field = f;
			return 0;
		}
		*(bool *) field = true;
		return 0;
	case T_CONFIG:
		return 0;
	}
	return -EINVAL;
}

static int check_ratios(const struct config *c, bool flags, char *err)
{
	if (c->eviction_ratio >= c->high_watermark) {
		snprintf(err, CONFIG_ERR_MAX, "%s (%g) must be below %s (%g)",
			 flags ? "--eviction-ratio" : "eviction_ratio", c->eviction_ratio,
			 flags ? "--eviction-high-watermark-ratio" : "eviction_high_watermark_ratio",
			 c->high_watermark);
		return -EINVAL;
	}
	return 0;
}

int config_parse_json(struct config *c, const char *buf, size_t len, char *err,
		      void (*warn)(const char *key))
{
	struct json_tokener *tok;
	struct json_object *root;
	struct config tmp = *c;
	int r = 0;

	if (len > CONFIG_MAX_FILE) {
		snprintf(err, CONFIG_ERR_MAX, "config is larger than 1MiB");
		return -EINVAL;
	}
	tok = json_tokener_new_ex(32);
	if (!tok)
		return -ENOMEM;
	root = json_tokener_parse_ex(tok, buf, (int) len);
	if (!root || json_tokener_get_error(tok) != json_tokener_success ||
	    (size_t) json_tokener_get_parse_end(tok) != len) {
		/* trailing whitespace is fine, anything else is not */
		size_t end = root ? json_tokener_get_parse_end(tok) : 0;
		bool only_space = root != NULL;

		for (size_t i = end; only_space && i < len; i++)
			if (!strchr(" \t\r\n", buf[i]))
				only_space = false;
		if (!only_space) {
			snprintf(err, CONFIG_ERR_MAX, "config is not valid JSON: %s",
				 root ? "trailing data after the object"
				      : json_tokener_error_desc(json_tokener_get_error(tok)));
			r = -EINVAL;
			goto out;
		}
	}
	if (!json_object_is_type(root, json_type_object)) {
		snprintf(err, CONFIG_ERR_MAX, "config must be a JSON object");
		r = -EINVAL;
		goto out;
	}

	json_object_object_foreach(root, key, val) {
		const struct opt_def *o = find_opt(key);
		enum json_kind kind;
		char text[4096];

		if (!o || o->type == T_CONFIG) {
			if (warn)
				warn(key);
			continue;
		}
		if (o->type == T_FLAG) {
			int f = json_flag(val, o->json_only);

			if (f < 0) {
				snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": expected true or false",
					 key);
				r = -EINVAL;
				goto out;
			}
			*(bool *) ((uint8_t *) &tmp + o->offset) = f;
			continue;
		}
		kind = o->type == T_RATIO ? JSON_NUMBER :
		       o->type == T_SIZE || o->type == T_U64 || o->type == T_U32 ? JSON_WHOLE :
		       JSON_STRING;
		r = json_text(val, key, text, sizeof(text), kind, err);
		if (r == 0)
			r = set_opt(&tmp, o, key, text, err);
		if (r < 0)
			goto out;
	}
	r = check_ratios(&tmp, false, err);
	if (r == 0)
		*c = tmp;
out:
	if (root)
		json_object_put(root);
	json_tokener_free(tok);
	return r;
}

int config_load_file(struct config *c, const char *path, char *err, void (*warn)(const char *key))
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd, r;

	/* O_NONBLOCK: a FIFO or a device must not hang the start; it is
	 * refused below because it is not a regular file */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		snprintf(err, CONFIG_ERR_MAX, "cannot read config file %s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > CONFIG_MAX_FILE) {
		snprintf(err, CONFIG_ERR_MAX, "config file %s is not a regular file of at most 1MiB",
			 path);
		r = -EINVAL;
		goto out;
	}
	buf = malloc((size_t) st.st_size + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (got < (size_t) st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t) st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			snprintf(err, CONFIG_ERR_MAX, "cannot read config file %s: %s", path,
				 strerror(-r));
			goto out;
		}
		got += (size_t) n;
	}
	buf[got] = '\0';
	r = config_parse_json(c, buf, got, err, warn);
	if (r < 0) {
		char inner[CONFIG_ERR_MAX];

		snprintf(inner, sizeof(inner), "%s", err);
		snprintf(err, CONFIG_ERR_MAX, "%.96s: %.150s", path, inner);
	}
out:
	free(buf);
	close(fd);
	return r;
}

/*
 * Mooncake's environment variables override its file (its store setup reads
 * MOONCAKE_MASTER and MOONCAKE_GLOBAL_SEGMENT_SIZE before the JSON), so a
 * deployment that sets them beside mooncake.json means them; flags still
 * override both.
 */
static int apply_env(struct config *c, char *err)
{
	static const struct {
		const char *env, *opt;
	} vars[] = {
		{ "MOONCAKE_MASTER", "master" },
		{ "MOONCAKE_GLOBAL_SEGMENT_SIZE", "dram-size" },
		{ "MOONCAKE_OFFLOAD_ENABLED", "enable-ssd-offload" },
		{ "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "ssd-offload-path" },
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i].env);
		char what[64];
		int r;

		if (!v || !*v)
			continue;
		snprintf(what, sizeof(what), "$%s", vars[i].env);
		r = set_opt(c, find_opt(vars[i].opt), what, v, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static void print_version(void)
{
	printf("kvcached %s\nprotocol %u.%u\nshm-layout %u\nrdma %s\nnuma %s\n", KVC_VERSION,
	       KVC_PROTO_MAJOR, KVC_PROTO_MINOR, SHM_LAYOUT_VERSION, KVC_HAVE_RDMA ? "yes" : "no",
	       KVC_HAVE_NUMA ? "yes" : "no");
}

/* getopt's table: every option under its name and its alias, each with
 * dashes and with underscores.  Index i of the table maps to opts[i / 4]. */
static struct option long_opts[N_OPTS * 4 + 3];
static char long_names[N_OPTS * 4][64];

static void build_long_opts(void)
{
	size_t n = 0;

	for (size_t i = 0; i < N_OPTS; i++) {
		const char *names[2] = { opts[i].name, opts[i].alias };

		for (int a = 0; a < 2; a++)
			for (int u = 0; u < 2; u++) {
				char *p = long_names[i * 4 + (size_t) a * 2 + (size_t) u];

				long_opts[n] = (struct option) { 0 };
				if (!names[a] || opts[i].json_only)
					continue;
				snprintf(p, 64, "%s", names[a]);
				for (char *q = p; u && *q; q++)
					if (*q == '-')
						*q = '_';
				if (u && !strcmp(p, names[a]))
					continue; /* no dash: one spelling */
				long_opts[n++] = (struct option) {
					.name = p,
					.has_arg = opts[i].type == T_FLAG ? no_argument : required_argument,
					.val = 0x100 + (int) i,
				};
			}
	}
	long_opts[n++] = (struct option) { "help", no_argument, NULL, 'h' };
	long_opts[n++] = (struct option) { "version", no_argument, NULL, 'V' };
	long_opts[n] = (struct option) { 0 };
}

void config_usage(FILE *f)
{
	fprintf(f, "Usage: kvcached [OPTIONS]\n\nThe node-local KV-cache daemon.\n\n");
	for (size_t i = 0; i < N_OPTS; i++) {
		const struct opt_def *o = &opts[i];
		char left[80];
		const char *h = o->help;

		if (o->json_only)
			continue;
		snprintf(left, sizeof(left), "%c%c%c --%s%s%s", o->short_name ? '-' : ' ',
			 o->short_name ? o->short_name : ' ', o->short_name ? ',' : ' ', o->name,
			 o->arg ? " " : "", o->arg ? o->arg : "");
		if (strlen(left) > 28) {
			fprintf(f, "  %s\n", left);
			left[0] = '\0';
		}
		while (h) {
			const char *nl = strchr(h, '\n');
			int len = nl ? (int) (nl - h) : (int) strlen(h);

			fprintf(f, "  %-28s %.*s\n", left, len, h);
			left[0] = '\0';
			h = nl ? nl + 1 : NULL;
		}
	}
	fprintf(f, "  -h, --help                   show this help\n"
		   "  -V, --version                print daemon, protocol and shm layout versions\n"
		   "\n"
		   "Every flag is also accepted with underscores (--dram_size), and as a key of the\n"
		   "JSON config with underscores (dram_size).  Command-line flags override the file.\n");
}

int config_parse_args(struct config *c, int argc, char **argv, char *err)
{
	const struct opt_def *cfg_opt = find_opt("config");
	const char *config_path = NULL;
	int opt, r, idx = 0;

	build_long_opts();
	/* First pass: only find --config, so the file can be applied before
	 * the flags that override it. */
	opterr = 0;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:hV", long_opts, NULL)) != -1)
		if (opt >= 0x100 && &opts[opt - 0x100] == cfg_opt)
			config_path = optarg;
	if (!config_path) {
		const char *e = getenv("MOONCAKE_CONFIG_PATH");

		if (e && *e)
			config_path = e;
	}
	if (config_path) {
		if (strlen(config_path) >= sizeof(c->config_path)) {
			snprintf(err, CONFIG_ERR_MAX, "--config is too long (at most %zu bytes)",
				 sizeof(c->config_path) - 1);
			return -EINVAL;
		}
		strcpy(c->config_path, config_path);
		r = config_load_file(c, config_path, err, warn_unknown);
		if (r < 0)
			return -EINVAL;
	}
	r = apply_env(c, err);
	if (r < 0)
		return r;

	opterr = 1;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:hV", long_opts, &idx)) != -1) {
		char name[80];

		switch (opt) {
		case 'h':
			config_usage(stdout);
			return 1;
		case 'V':
			print_version();
			return 1;
		case 's':
			r = set_opt(c, find_opt("socket"), "--socket", optarg, err);
			break;
		default:
			if (opt < 0x100 || opt >= 0x100 + (int) N_OPTS) {
				snprintf(err, CONFIG_ERR_MAX, "unknown or incomplete option (see --help)");
				return -EINVAL;
			}
			/* errors name the flag as the user spelled it */
			snprintf(name, sizeof(name), "--%s", long_opts[idx].name);
			r = set_opt(c, &opts[opt - 0x100], name,
				    opts[opt - 0x100].type == T_FLAG ? NULL : optarg ? optarg : "", err);
			break;
		}
		if (r < 0)
			return r;
	}
	if (optind < argc) {
		snprintf(err, CONFIG_ERR_MAX, "unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	/* Mooncake's SSD offload is a disk tier there (Mooncake's default
	 * directory without a path), unless a disk tier was given (--disk-dir,
	 * disk_dir) */
	if (c->ssd_offload && !c->disk_dir[0]) {
		snprintf(c->disk_dir, sizeof(c->disk_dir), "%s",
			 c->ssd_offload_path[0] ? c->ssd_offload_path : MOONCAKE_OFFLOAD_DIR);
		c->disk_from_ssd_offload = true;
	}
	return check_ratios(c, true, err);
}

static void human_size(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double d = (double) v;
	unsigned u = 0;

	while (d >= 1024 && u < 6) {
		d /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", d, units[u]);
}

int config_check_memory(const struct config *c, uint64_t phys, uint64_t avail, char *err,
			bool *ret_warn)
{
	uint64_t want = c->dram_size + c->device_size;
	char a[32], b[32];

	*ret_warn = false;
	if (c->allow_overcommit || phys == 0)
		return 0;
	human_size(want, a, sizeof(a));
	if (want > phys) {
		human_size(phys, b, sizeof(b));
		snprintf(err, CONFIG_ERR_MAX,
			 "the memory tiers (--dram-size + --device-size = %s) exceed this machine's "
			 "memory (%s); lower them, or pass --allow-overcommit to start anyway", a, b);
		return -E2BIG;
	}
	if (want > avail) {
		human_size(avail, b, sizeof(b));
		snprintf(err, CONFIG_ERR_MAX,
			 "the memory tiers (%s) exceed the memory available now (%s): filling them "
			 "will swap or meet the OOM killer", a, b);
		*ret_warn = true;
	}
	return 0;
}
