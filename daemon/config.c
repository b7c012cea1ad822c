/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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
	c->promotion_hits = CONFIG_DEFAULT_PROMOTION_HITS;
	c->disk_size = UINT64_C(10) << 30;
	c->disk_zstd_level = 3;
	strcpy(c->protocol, "tcp");
	c->max_clients = CONFIG_DEFAULT_MAX_CLIENTS;
	c->spill_wait_ms = CONFIG_DEFAULT_SPILL_WAIT_MS;
	c->max_channels = CONFIG_DEFAULT_MAX_CHANNELS;
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

static int set_dram_size(struct config *c, const char *what, const char *v, char *err)
{
	uint64_t n;
	int r = shm_parse_size(v, &n);

	if (r < 0) {
		snprintf(err, CONFIG_ERR_MAX,
			 "invalid value '%s' for %s: expected a size like 4096, 512MB or 1GiB", v, what);
		return -EINVAL;
	}
	if (n < CONFIG_MIN_DRAM_SIZE) {
		snprintf(err, CONFIG_ERR_MAX, "%s must be at least 1MiB (got '%s')", what, v);
		return -EINVAL;
	}
	c->dram_size = n;
	return 0;
}

static int set_poll_us(struct config *c, const char *what, const char *v, char *err)
{
	char *end;
	unsigned long n;

	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || n > CONFIG_MAX_POLL_US) {
		snprintf(err, CONFIG_ERR_MAX,
			 "invalid value '%s' for %s: expected microseconds, 0..%u", v, what,
			 CONFIG_MAX_POLL_US);
		return -EINVAL;
	}
	c->poll_us = (uint32_t) n;
	return 0;
}

static int set_ratio(double *dst, const char *what, const char *v, double lo, double hi,
		     bool lo_open, char *err)
{
	char *end;
	double x;

	errno = 0;
	x = strtod(v, &end);
	if (errno || end == v || *end || !(x <= hi) || (lo_open ? !(x > lo) : !(x >= lo))) {
		snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected a ratio in %c%g, %g]",
			 v, what, lo_open ? '(' : '[', lo, hi);
		return -EINVAL;
	}
	*dst = x;
	return 0;
}

static int set_u64(uint64_t *dst, const char *what, const char *v, uint64_t max, char *err)
{
	char *end;
	unsigned long long n;

	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || n > max) {
		snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected 0..%llu", v, what,
			 (unsigned long long) max);
		return -EINVAL;
	}
	*dst = n;
	return 0;
}

static int set_device_size(struct config *c, const char *what, const char *v, char *err)
{
	uint64_t n;

	if (shm_parse_size(v, &n) < 0) {
		snprintf(err, CONFIG_ERR_MAX,
			 "invalid value '%s' for %s: expected a size like 0, 256MB or 1GiB", v, what);
		return -EINVAL;
	}
	if (n && n < CONFIG_MIN_DRAM_SIZE) {
		snprintf(err, CONFIG_ERR_MAX, "%s must be 0 (off) or at least 1MiB (got '%s')", what, v);
		return -EINVAL;
	}
	c->device_size = n;
	return 0;
}

static int set_promotion_hits(struct config *c, const char *what, const char *v, char *err)
{
	uint64_t n;
	int r = set_u64(&n, what, v, 1000000, err);

	if (r == 0 && n == 0) {
		snprintf(err, CONFIG_ERR_MAX, "%s must be at least 1", what);
		return -EINVAL;
	}
	if (r == 0)
		c->promotion_hits = (uint32_t) n;
	return r;
}

static int set_string(char *dst, size_t cap, const char *what, const char *v, char *err);

/* Keys shared by the command line (with -- and dashes or underscores) and
 * the JSON file. */
static int set_capacity_key(struct config *c, const char *k, const char *v, char *err)
{
	if (!strcmp(k, "device_size") || !strcmp(k, "device-size"))
		return set_device_size(c, k, v, err);
	if (!strcmp(k, "eviction_high_watermark_ratio") || !strcmp(k, "eviction-high-watermark-ratio"))
		return set_ratio(&c->high_watermark, k, v, 0, 1, true, err);
	if (!strcmp(k, "eviction_ratio") || !strcmp(k, "eviction-ratio"))
		return set_ratio(&c->eviction_ratio, k, v, 0, 1, false, err);
	if (!strcmp(k, "default_kv_lease_ttl") || !strcmp(k, "default-kv-lease-ttl"))
		return set_u64(&c->lease_ttl_ms, k, v, UINT64_C(86400000) * 365, err);
	if (!strcmp(k, "promotion_hits") || !strcmp(k, "promotion-hits"))
		return set_promotion_hits(c, k, v, err);
	if (!strcmp(k, "disk_dir") || !strcmp(k, "disk-dir")) {
		if (!*v) {
			snprintf(err, CONFIG_ERR_MAX, "%s must not be empty", k);
			return -EINVAL;
		}
		return set_string(c->disk_dir, sizeof(c->disk_dir), k, v, err);
	}
	if (!strcmp(k, "disk_size") || !strcmp(k, "disk-size")) {
		uint64_t n;

		if (shm_parse_size(v, &n) < 0 || n < CONFIG_MIN_DRAM_SIZE) {
			snprintf(err, CONFIG_ERR_MAX,
				 "invalid value '%s' for %s: expected a size of at least 1MiB", v, k);
			return -EINVAL;
		}
		c->disk_size = n;
		return 0;
	}
	if (!strcmp(k, "disk_compress") || !strcmp(k, "disk-compress")) {
		if (strcmp(v, "zstd") && strcmp(v, "none")) {
			snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected zstd or none",
				 v, k);
			return -EINVAL;
		}
		c->disk_zstd = !strcmp(v, "zstd");
		return 0;
	}
	if (!strcmp(k, "max_clients") || !strcmp(k, "max-clients") ||
	    !strcmp(k, "max_channels") || !strcmp(k, "max-channels")) {
		uint64_t n;
		int r = set_u64(&n, k, v, 1000000, err);

		if (r == 0 && n == 0) {
			snprintf(err, CONFIG_ERR_MAX, "%s must be at least 1", k);
			return -EINVAL;
		}
		if (r == 0 && strstr(k, "clients"))
			c->max_clients = (uint32_t) n;
		else if (r == 0)
			c->max_channels = (uint32_t) n;
		return r;
	}
	if (!strcmp(k, "spill_wait_ms") || !strcmp(k, "spill-wait-ms"))
		return set_u64(&c->spill_wait_ms, k, v, 3600000, err);
	if (!strcmp(k, "max_registered_bytes") || !strcmp(k, "max-registered-bytes")) {
		if (shm_parse_size(v, &c->max_registered) < 0) {
			snprintf(err, CONFIG_ERR_MAX,
				 "invalid value '%s' for %s: expected a size like 8GiB (0 = half of RAM)",
				 v, k);
			return -EINVAL;
		}
		return 0;
	}
	if (!strcmp(k, "disk_compress_level") || !strcmp(k, "disk-compress-level")) {
		uint64_t n;
		int r = set_u64(&n, k, v, 19, err);

		if (r == 0 && n == 0) {
			snprintf(err, CONFIG_ERR_MAX, "%s must be 1..19", k);
			return -EINVAL;
		}
		if (r == 0)
			c->disk_zstd_level = (int) n;
		return r;
	}
	return 1;
}

static int set_string(char *dst, size_t cap, const char *what, const char *v, char *err)
{
	if (strlen(v) >= cap) {
		snprintf(err, CONFIG_ERR_MAX, "%s is too long (at most %zu bytes)", what, cap - 1);
		return -EINVAL;
	}
	strcpy(dst, v);
	return 0;
}

static int set_socket(struct config *c, const char *what, const char *v, char *err)
{
	if (!*v) {
		snprintf(err, CONFIG_ERR_MAX, "%s must not be empty", what);
		return -EINVAL;
	}
	return set_string(c->socket, sizeof(c->socket), what, v, err);
}

static int set_log_level(struct config *c, const char *what, const char *v, char *err)
{
	if (log_level_parse(v) < 0) {
		snprintf(err, CONFIG_ERR_MAX,
			 "invalid value '%s' for %s: expected error, warn, notice, info, debug or trace",
			 v, what);
		return -EINVAL;
	}
	return set_string(c->log_level, sizeof(c->log_level), what, v, err);
}

static int set_hugepages(struct config *c, const char *what, const char *v, char *err)
{
	if (config_parse_hugepages(v, &c->hugepages) < 0) {
		snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected auto, on or off", v,
			 what);
		return -EINVAL;
	}
	return 0;
}

static int set_protocol(struct config *c, const char *what, const char *v, char *err)
{
	if (strcmp(v, "tcp") != 0 && strcmp(v, "rdma") != 0) {
		snprintf(err, CONFIG_ERR_MAX, "invalid value '%s' for %s: expected tcp or rdma", v,
			 what);
		return -EINVAL;
	}
	return set_string(c->protocol, sizeof(c->protocol), what, v, err);
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
		static const char *const known[] = {
			"global_segment_size", "dram_size", "dram-size", "socket", "hugepages",
			"log_level", "log-level", "poll_us", "device_size", "eviction_high_watermark_ratio",
			"eviction_ratio", "default_kv_lease_ttl", "promotion_hits", "disk_dir",
			"disk_size", "disk_compress", "disk_compress_level", "local_hostname", "metadata_server", "protocol",
			"device_name", "master_server_address", "allow_overcommit", "max_clients",
			"max_channels", "max_registered_bytes", "spill_wait_ms",
		};
		char text[4096];
		const char *k = key;
		bool sized = strcmp(k, "global_segment_size") == 0 || strcmp(k, "dram_size") == 0 ||
			     strcmp(k, "dram-size") == 0;
		bool ratio = strcmp(k, "eviction_high_watermark_ratio") == 0 ||
			     strcmp(k, "eviction_ratio") == 0;
		bool whole = sized || strcmp(k, "poll_us") == 0 || strcmp(k, "device_size") == 0 ||
			     strcmp(k, "default_kv_lease_ttl") == 0 || strcmp(k, "promotion_hits") == 0 ||
			     strcmp(k, "disk_size") == 0 || strcmp(k, "disk_compress_level") == 0 ||
			     strcmp(k, "max_clients") == 0 || strcmp(k, "max_channels") == 0 ||
			     strcmp(k, "max_registered_bytes") == 0 || strcmp(k, "spill_wait_ms") == 0;
		bool is_known = false;

		for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
			is_known = is_known || strcmp(k, known[i]) == 0;
		if (!is_known) {
			if (warn)
				warn(k);
			continue;
		}
		if (strcmp(k, "allow_overcommit") == 0) {
			if (!json_object_is_type(val, json_type_boolean)) {
				snprintf(err, CONFIG_ERR_MAX, "config key \"%s\": expected true or false", k);
				r = -EINVAL;
				goto out;
			}
			tmp.allow_overcommit = json_object_get_boolean(val);
			continue;
		}
		r = json_text(val, k, text, sizeof(text),
			      ratio ? JSON_NUMBER : whole ? JSON_WHOLE : JSON_STRING, err);
		if (r < 0)
			goto out;
		if (sized)
			r = set_dram_size(&tmp, k, text, err);
		else if (strcmp(k, "poll_us") == 0)
			r = set_poll_us(&tmp, k, text, err);
		else if ((r = set_capacity_key(&tmp, k, text, err)) <= 0)
			; /* handled */
		else if (strcmp(k, "socket") == 0)
			r = set_socket(&tmp, k, text, err);
		else if (strcmp(k, "hugepages") == 0)
			r = set_hugepages(&tmp, k, text, err);
		else if (strcmp(k, "log_level") == 0 || strcmp(k, "log-level") == 0)
			r = set_log_level(&tmp, k, text, err);
		else if (strcmp(k, "local_hostname") == 0)
			r = set_string(tmp.local_hostname, sizeof(tmp.local_hostname), k, text, err);
		else if (strcmp(k, "metadata_server") == 0)
			r = set_string(tmp.metadata_server, sizeof(tmp.metadata_server), k, text, err);
		else if (strcmp(k, "protocol") == 0)
			r = set_protocol(&tmp, k, text, err);
		else if (strcmp(k, "device_name") == 0)
			r = set_string(tmp.device_name, sizeof(tmp.device_name), k, text, err);
		else
			r = set_string(tmp.master_server_address, sizeof(tmp.master_server_address), k,
				       text, err);
		if (r < 0)
			goto out;
	}
	if (tmp.eviction_ratio >= tmp.high_watermark) {
		snprintf(err, CONFIG_ERR_MAX, "eviction_ratio (%g) must be below "
			 "eviction_high_watermark_ratio (%g)", tmp.eviction_ratio, tmp.high_watermark);
		r = -EINVAL;
		goto out;
	}
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

enum {
	OPT_SOCKET = 's',
	OPT_HELP = 'h',
	OPT_VERSION = 'V',
	OPT_DRAM_SIZE = 0x100,
	OPT_HUGEPAGES,
	OPT_CONFIG,
	OPT_LOG_LEVEL,
	OPT_POLL_US,
	OPT_CAPACITY, /* handled by set_capacity_key() under its own name */
	OPT_OVERCOMMIT,
};

static const struct option options[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "dram-size", required_argument, NULL, OPT_DRAM_SIZE },
	{ "dram_size", required_argument, NULL, OPT_DRAM_SIZE },
	{ "global-segment-size", required_argument, NULL, OPT_DRAM_SIZE },
	{ "global_segment_size", required_argument, NULL, OPT_DRAM_SIZE },
	{ "hugepages", required_argument, NULL, OPT_HUGEPAGES },
	{ "config", required_argument, NULL, OPT_CONFIG },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "log_level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "poll-us", required_argument, NULL, OPT_POLL_US },
	{ "device-size", required_argument, NULL, OPT_CAPACITY },
	{ "device_size", required_argument, NULL, OPT_CAPACITY },
	{ "eviction-high-watermark-ratio", required_argument, NULL, OPT_CAPACITY },
	{ "eviction_high_watermark_ratio", required_argument, NULL, OPT_CAPACITY },
	{ "eviction-ratio", required_argument, NULL, OPT_CAPACITY },
	{ "eviction_ratio", required_argument, NULL, OPT_CAPACITY },
	{ "default-kv-lease-ttl", required_argument, NULL, OPT_CAPACITY },
	{ "default_kv_lease_ttl", required_argument, NULL, OPT_CAPACITY },
	{ "promotion-hits", required_argument, NULL, OPT_CAPACITY },
	{ "promotion_hits", required_argument, NULL, OPT_CAPACITY },
	{ "disk-dir", required_argument, NULL, OPT_CAPACITY },
	{ "disk_dir", required_argument, NULL, OPT_CAPACITY },
	{ "disk-size", required_argument, NULL, OPT_CAPACITY },
	{ "disk_size", required_argument, NULL, OPT_CAPACITY },
	{ "disk-compress", required_argument, NULL, OPT_CAPACITY },
	{ "disk_compress", required_argument, NULL, OPT_CAPACITY },
	{ "disk-compress-level", required_argument, NULL, OPT_CAPACITY },
	{ "disk_compress_level", required_argument, NULL, OPT_CAPACITY },
	{ "poll_us", required_argument, NULL, OPT_POLL_US },
	{ "spill-wait-ms", required_argument, NULL, OPT_CAPACITY },
	{ "spill_wait_ms", required_argument, NULL, OPT_CAPACITY },
	{ "max-clients", required_argument, NULL, OPT_CAPACITY },
	{ "max_clients", required_argument, NULL, OPT_CAPACITY },
	{ "max-channels", required_argument, NULL, OPT_CAPACITY },
	{ "max_channels", required_argument, NULL, OPT_CAPACITY },
	{ "max-registered-bytes", required_argument, NULL, OPT_CAPACITY },
	{ "max_registered_bytes", required_argument, NULL, OPT_CAPACITY },
	{ "allow-overcommit", no_argument, NULL, OPT_OVERCOMMIT },
	{ "allow_overcommit", no_argument, NULL, OPT_OVERCOMMIT },
	{ "help", no_argument, NULL, OPT_HELP },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ 0 },
};

void config_usage(FILE *f)
{
	fprintf(f,
		"Usage: kvcached [OPTIONS]\n"
		"\n"
		"The node-local KV-cache daemon.\n"
		"\n"
		"  -s, --socket PATH          control socket (default: $KVCACHE_SOCKET,\n"
		"                             $XDG_RUNTIME_DIR/kvcached.sock, /tmp/kvcached-<uid>.sock)\n"
		"      --dram-size SIZE       DRAM tier capacity, e.g. 512MB, 4GiB (default 1GiB);\n"
		"                             also --global-segment-size, --global_segment_size\n"
		"      --hugepages MODE       auto|on|off: 2 MiB pages for shared segments (default auto)\n"
		"      --config FILE          JSON config; mooncake.json keys are understood\n"
		"                             (default: $MOONCAKE_CONFIG_PATH if set)\n"
		"      --device-size SIZE     capacity of the device tier (default 0 = off)\n"
		"      --eviction-high-watermark-ratio R\n"
		"                             a tier above R x capacity is evicted down to\n"
		"      --eviction-ratio R     (R_high - R) x capacity (defaults 0.95 and 0.05)\n"
		"      --default-kv-lease-ttl MS\n"
		"                             a hit protects an object this long (default 10000)\n"
		"      --promotion-hits N     dram hits before an object moves to device (default 2)\n"
		"      --disk-dir DIR         spill to record files here (default: no disk tier);\n"
		"                             records found there at start are served again\n"
		"      --disk-size SIZE       disk tier capacity (default 10GiB)\n"
		"      --disk-compress zstd|none  compress records (default none)\n"
		"      --disk-compress-level N    zstd level 1..19 (default 3)\n"
		"      --spill-wait-ms MS     with a disk tier, a put that needs room held by\n"
		"                             objects not yet on disk waits this long for the\n"
		"                             spill, then fails with EAGAIN (default 5000)\n"
		"                             (each also spelled with underscores)\n"
		"      --poll-us N            keep polling client rings this long after the last\n"
		"                             request before sleeping (default 100; 0 = never spin)\n"
		"      --max-clients N        connected clients at once (default 1024)\n"
		"      --max-channels N       shared-memory channels at once (default 4096)\n"
		"      --max-registered-bytes SIZE\n"
		"                             registered buffers of all clients together\n"
		"                             (default 0 = half of this machine's memory)\n"
		"      --allow-overcommit     start even when the memory tiers exceed this\n"
		"                             machine's physical memory\n"
		"      --log-level LEVEL      error|warn|notice|info|debug|trace (default notice);\n"
		"                             $KVCACHE_LOG=\"info,session:debug\" sets it per topic\n"
		"  -h, --help                 show this help\n"
		"  -V, --version              print daemon, protocol and shm layout versions\n"
		"\n"
		"Command-line flags override the config file.\n");
}

static void print_version(void)
{
	printf("kvcached %s\nprotocol %u.%u\nshm-layout %u\n", KVC_VERSION, KVC_PROTO_MAJOR,
	       KVC_PROTO_MINOR, SHM_LAYOUT_VERSION);
}

int config_parse_args(struct config *c, int argc, char **argv, char *err)
{
	const char *config_path = NULL;
	int opt, r, idx = 0;

	/* First pass: only find --config, so the file can be applied before
	 * the flags that override it. */
	opterr = 0;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:hV", options, NULL)) != -1)
		if (opt == OPT_CONFIG)
			config_path = optarg;
	if (!config_path) {
		const char *e = getenv("MOONCAKE_CONFIG_PATH");

		if (e && *e)
			config_path = e;
	}
	if (config_path) {
		r = set_string(c->config_path, sizeof(c->config_path), "--config", config_path, err);
		if (r < 0)
			return r;
		r = config_load_file(c, config_path, err, warn_unknown);
		if (r < 0)
			return -EINVAL;
	}

	opterr = 1;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:hV", options, &idx)) != -1) {
		switch (opt) {
		case OPT_CAPACITY: {
			char name[64];

			/* errors name the flag as the user spelled it */
			snprintf(name, sizeof(name), "--%s", options[idx].name);
			r = set_capacity_key(c, options[idx].name, optarg, err);
			if (r < 0 && !strstr(err, name)) {
				char inner[CONFIG_ERR_MAX];

				snprintf(inner, sizeof(inner), "%s", err);
				snprintf(err, CONFIG_ERR_MAX, "%s: %.180s", name, inner);
			}
			break;
		}
		case OPT_SOCKET:
			r = set_socket(c, "--socket", optarg, err);
			break;
		case OPT_DRAM_SIZE:
			r = set_dram_size(c, "--dram-size", optarg, err);
			break;
		case OPT_HUGEPAGES:
			r = set_hugepages(c, "--hugepages", optarg, err);
			break;
		case OPT_CONFIG:
			r = 0;
			break;
		case OPT_OVERCOMMIT:
			c->allow_overcommit = true;
			r = 0;
			break;
		case OPT_LOG_LEVEL:
			r = set_log_level(c, "--log-level", optarg, err);
			break;
		case OPT_POLL_US:
			r = set_poll_us(c, "--poll-us", optarg, err);
			break;
		case OPT_HELP:
			config_usage(stdout);
			return 1;
		case OPT_VERSION:
			print_version();
			return 1;
		default:
			snprintf(err, CONFIG_ERR_MAX, "unknown or incomplete option (see --help)");
			return -EINVAL;
		}
		if (r < 0)
			return r;
	}
	if (optind < argc) {
		snprintf(err, CONFIG_ERR_MAX, "unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	if (c->eviction_ratio >= c->high_watermark) {
		snprintf(err, CONFIG_ERR_MAX, "--eviction-ratio (%g) must be below "
			 "--eviction-high-watermark-ratio (%g)", c->eviction_ratio, c->high_watermark);
		return -EINVAL;
	}
	return 0;
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
