/* SPDX-License-Identifier: MIT */
/* Daemon configuration: flags, underscore spellings, JSON files with
 * Mooncake's keys, MOONCAKE_CONFIG_PATH, and errors that name the culprit. */
#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "helpers.h"

static char unknown_seen[64];

static void warn(const char *key)
{
	snprintf(unknown_seen, sizeof(unknown_seen), "%s", key);
}

static int parse(struct config *c, char *err, ...)
{
	char *argv[16];
	int argc = 0;
	va_list ap;

	argv[argc++] = (char *) "kvcached";
	va_start(ap, err);
	for (char *a; (a = va_arg(ap, char *));)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	config_init(c);
	err[0] = '\0';
	return config_parse_args(c, argc, argv, err);
}

static int json(struct config *c, const char *text, char *err)
{
	config_init(c);
	err[0] = '\0';
	return config_parse_json(c, text, strlen(text), err, warn);
}

int main(void)
{
	struct config c;
	char err[CONFIG_ERR_MAX], path[] = "/tmp/kvc-config-XXXXXX";
	int fd;

	unsetenv("MOONCAKE_CONFIG_PATH");
	unsetenv("MOONCAKE_MASTER");
	unsetenv("MOONCAKE_GLOBAL_SEGMENT_SIZE");
	CHECK_EQ(parse(&c, err, NULL), 0);
	CHECK_EQ(c.dram_size, CONFIG_DEFAULT_DRAM_SIZE);
	CHECK_EQ(c.hugepages, SHM_HUGEPAGES_AUTO);

	CHECK_EQ(parse(&c, err, "--dram-size", "512MB", "--hugepages", "off", "--socket", "/tmp/a.sock",
		       NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(512) << 20);
	CHECK_EQ(c.hugepages, SHM_HUGEPAGES_OFF);
	CHECK(strcmp(c.socket, "/tmp/a.sock") == 0);
	CHECK_EQ(parse(&c, err, "--global_segment_size", "2GiB", NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(2) << 30);
	CHECK_EQ(parse(&c, err, "--global-segment-size=30000000000", NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(30000000000));

	/* capacity flags, both spellings */
	CHECK_EQ(parse(&c, err, "--device-size", "256MB", "--eviction-high-watermark-ratio", "0.9",
		       "--eviction_ratio", "0.2", "--default_kv_lease_ttl", "500", "--promotion-hits",
		       "3", NULL), 0);
	CHECK_EQ(c.device_size, UINT64_C(256) << 20);
	CHECK(c.high_watermark == 0.9 && c.eviction_ratio == 0.2);
	CHECK_EQ(c.lease_ttl_ms, 500);
	CHECK_EQ(c.promotion_hits, 3);
	CHECK_EQ(parse(&c, err, NULL), 0);
	CHECK(c.high_watermark == 0.95 && c.eviction_ratio == 0.05);
	CHECK_EQ(c.lease_ttl_ms, 10000);
	CHECK_EQ(c.device_size, 0);
	CHECK_EQ(parse(&c, err, "--eviction_high_watermark_ratio", "1.5", NULL), -EINVAL);
	CHECK(strstr(err, "eviction_high_watermark_ratio") && strstr(err, "1.5"));
	CHECK_EQ(parse(&c, err, "--eviction-high-watermark-ratio", "0", NULL), -EINVAL);
	CHECK_EQ(parse(&c, err, "--eviction-ratio", "0.96", NULL), -EINVAL);
	CHECK(strstr(err, "--eviction-ratio"));
	CHECK_EQ(parse(&c, err, "--default-kv-lease-ttl", "-1", NULL), -EINVAL);
	CHECK(strstr(err, "--default-kv-lease-ttl"));
	CHECK_EQ(parse(&c, err, "--device-size", "12KB", NULL), -EINVAL);
	CHECK(strstr(err, "--device-size"));
	CHECK_EQ(parse(&c, err, "--promotion-hits", "0", NULL), -EINVAL);
	CHECK_EQ(json(&c, "{\"eviction_high_watermark_ratio\": 0.8, \"eviction_ratio\": 0.1,"
			  " \"default_kv_lease_ttl\": 5000, \"device_size\": \"1GB\"}", err), 0);
	CHECK(c.high_watermark == 0.8 && c.eviction_ratio == 0.1);
	CHECK_EQ(c.lease_ttl_ms, 5000);
	CHECK_EQ(c.device_size, UINT64_C(1) << 30);
	CHECK_EQ(json(&c, "{\"eviction_high_watermark_ratio\": 0.5, \"eviction_ratio\": 0.6}", err),
		 -EINVAL);
	CHECK(strstr(err, "eviction_ratio"));

	/* bad values name their flag */
	CHECK_EQ(parse(&c, err, "--dram-size", "lots", NULL), -EINVAL);
	CHECK(strstr(err, "--dram-size") && strstr(err, "lots"));
	CHECK_EQ(parse(&c, err, "--dram-size", "1KB", NULL), -EINVAL);
	CHECK(strstr(err, "--dram-size"));
	CHECK_EQ(parse(&c, err, "--hugepages", "maybe", NULL), -EINVAL);
	CHECK(strstr(err, "--hugepages"));
	CHECK_EQ(parse(&c, err, "--log-level", "loud", NULL), -EINVAL);
	CHECK(strstr(err, "--log-level"));
	CHECK_EQ(parse(&c, err, "stray", NULL), -EINVAL);
	CHECK(strstr(err, "stray"));
	CHECK_EQ(parse(&c, err, "--config", "/nonexistent/kvc.json", NULL), -EINVAL);
	CHECK(strstr(err, "/nonexistent/kvc.json"));

	/* JSON: Mooncake keys, sizes as numbers or strings */
	CHECK_EQ(json(&c, "{\"local_hostname\": \"node1\", \"metadata_server\": \"etcd://x:2379\","
			  " \"protocol\": \"rdma\", \"device_name\": \"mlx5_0\","
			  " \"master_server_address\": \"10.0.0.1:50051\","
			  " \"global_segment_size\": 3355443200}", err), 0);
	CHECK_EQ(c.dram_size, UINT64_C(3355443200));
	CHECK(strcmp(c.local_hostname, "node1") == 0);
	CHECK(strcmp(c.protocol, "rdma") == 0);
	CHECK(strcmp(c.device_name, "mlx5_0") == 0);
	CHECK(strcmp(c.master_server_address, "10.0.0.1:50051") == 0);
	CHECK_EQ(json(&c, "{\"global_segment_size\": \"4GB\", \"hugepages\": \"off\"}", err), 0);
	CHECK_EQ(c.dram_size, UINT64_C(4) << 30);
	CHECK_EQ(c.hugepages, SHM_HUGEPAGES_OFF);
	CHECK_EQ(json(&c, "{\"global_segment_size\": 3.2e9}", err), 0);
	CHECK_EQ(c.dram_size, UINT64_C(3200000000));
	unknown_seen[0] = '\0';
	CHECK_EQ(json(&c, "{\"future_key\": 1}\n", err), 0);
	CHECK(strcmp(unknown_seen, "future_key") == 0);

	CHECK_EQ(json(&c, "{\"global_segment_size\": -5}", err), -EINVAL);
	CHECK(strstr(err, "global_segment_size"));
	CHECK_EQ(json(&c, "{\"global_segment_size\": \"big\"}", err), -EINVAL);
	CHECK(strstr(err, "global_segment_size"));
	CHECK_EQ(json(&c, "{\"protocol\": \"carrier-pigeon\"}", err), -EINVAL);
	CHECK(strstr(err, "protocol") && strstr(err, "carrier-pigeon"));
	/* Mooncake's other transports (vLLM-Ascend writes "ascend") run as auto,
	 * and the name is kept for the warning at start */
	{
		static const char *const names[] = { "ascend", "HCCL", "nvlink", "cxl", "efa",
						     "nvmeof", "barex", "ubshmem" };

		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			char t[128];

			snprintf(t, sizeof(t), "{\"protocol\": \"%s\"}", names[i]);
			CHECK_EQ(json(&c, t, err), 0);
			CHECK(strcmp(c.protocol, "auto") == 0);
			CHECK(strcasecmp(c.protocol_asked, names[i]) == 0);
		}
	}
	CHECK_EQ(json(&c, "{\"protocol\": \"TCP\"}", err), 0);
	CHECK(strcmp(c.protocol, "tcp") == 0 && c.protocol_asked[0] == '\0');
	CHECK_EQ(parse(&c, err, "--protocol", "ascend", "--protocol", "rdma", NULL), 0);
	CHECK(strcmp(c.protocol, "rdma") == 0 && c.protocol_asked[0] == '\0');
	CHECK_EQ(parse(&c, err, "--protocol", "ascendx", NULL), -EINVAL);
	CHECK(strstr(err, "--protocol") && strstr(err, "ascendx"));
	CHECK_EQ(parse(&c, err, "--protocol", "ascend_direct_and_more_too_long", NULL), -EINVAL);
	CHECK_EQ(json(&c, "{\"local_hostname\": 5}", err), -EINVAL);
	CHECK(strstr(err, "local_hostname"));
	CHECK_EQ(json(&c, "[1,2]", err), -EINVAL);
	CHECK_EQ(json(&c, "{\"a\": ", err), -EINVAL);
	CHECK_EQ(json(&c, "{} {}", err), -EINVAL);
	CHECK_EQ(json(&c, "", err), -EINVAL);
	/* a failed parse leaves the config untouched */
	config_init(&c);
	{
		const char *t = "{\"global_segment_size\": \"1GB\", \"protocol\": 3}";

		CHECK_EQ(config_parse_json(&c, t, strlen(t), err, NULL), -EINVAL);
	}
	CHECK_EQ(c.dram_size, CONFIG_DEFAULT_DRAM_SIZE);

	/* file + flags: flags win; MOONCAKE_CONFIG_PATH is the default file */
	fd = mkstemp(path);
	CHECK(fd >= 0);
	CHECK(write(fd, "{\"global_segment_size\": \"256MB\", \"hugepages\": \"off\"}", 52) == 52);
	close(fd);
	CHECK_EQ(parse(&c, err, "--config", path, NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(256) << 20);
	CHECK_EQ(parse(&c, err, "--dram-size", "64MB", "--config", path, NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(64) << 20);
	CHECK_EQ(c.hugepages, SHM_HUGEPAGES_OFF);
	setenv("MOONCAKE_CONFIG_PATH", path, 1);
	CHECK_EQ(parse(&c, err, NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(256) << 20);
	/* Mooncake's environment overrides its file; flags override both */
	setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "128mb", 1);
	setenv("MOONCAKE_MASTER", "10.1.1.1:50088", 1);
	CHECK_EQ(parse(&c, err, NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(128) << 20);
	CHECK(strcmp(c.master_server_address, "10.1.1.1:50088") == 0);
	CHECK_EQ(parse(&c, err, "--dram-size", "96MB", "--master", "m:1", NULL), 0);
	CHECK_EQ(c.dram_size, UINT64_C(96) << 20);
	CHECK(strcmp(c.master_server_address, "m:1") == 0);
	setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "lots", 1);
	CHECK_EQ(parse(&c, err, NULL), -EINVAL);
	CHECK(strstr(err, "$MOONCAKE_GLOBAL_SEGMENT_SIZE") && strstr(err, "lots"));
	unsetenv("MOONCAKE_GLOBAL_SEGMENT_SIZE");
	unsetenv("MOONCAKE_MASTER");
	unsetenv("MOONCAKE_CONFIG_PATH");
	unlink(path);

	/* Mooncake's SSD offload is a disk tier in ssd_offload_path, its yes/no
	 * in Mooncake's words; --disk-dir wins; asked without a path, an error */
	{
		static const struct {
			const char *text;
			int res;
			const char *dir;
		} cases[] = {
			{ "{\"enable_ssd_offload\": true, \"ssd_offload_path\": \"/nvme/off\"}", 0,
			  "/nvme/off" },
			{ "{\"enable_ssd_offload\": \"Enable\", \"ssd_offload_path\": \"/n\"}", 0, "/n" },
			{ "{\"enable_ssd_offload\": 1, \"ssd_offload_path\": \"/n\"}", 0, "/n" },
			{ "{\"enable_ssd_offload\": \"no\", \"ssd_offload_path\": \"/n\"}", 0, "" },
			{ "{\"ssd_offload_path\": \"/n\"}", 0, "" },
			{ "{\"enable_ssd_offload\": \"true\"}", 0, "/data/file_storage" },
			{ "{\"enable_ssd_offload\": \"maybe\", \"ssd_offload_path\": \"/n\"}", -EINVAL,
			  NULL },
			{ "{\"enable_ssd_offload\": 2, \"ssd_offload_path\": \"/n\"}", -EINVAL, NULL },
		};

		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
			CHECK(fd >= 0);
			CHECK(write(fd, cases[i].text, strlen(cases[i].text)) ==
			      (ssize_t) strlen(cases[i].text));
			close(fd);
			CHECK_EQ(parse(&c, err, "--config", path, NULL), cases[i].res);
			if (cases[i].dir)
				CHECK(strcmp(c.disk_dir, cases[i].dir) == 0);
			else
				CHECK(strstr(err, "enable_ssd_offload"));
		}
		/* asked without a path, with a disk tier on the command line */
		fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		CHECK(write(fd, "{\"enable_ssd_offload\": true}", 28) == 28);
		close(fd);
		CHECK_EQ(parse(&c, err, "--config", path, "--disk-dir", "/d", NULL), 0);
		CHECK(strcmp(c.disk_dir, "/d") == 0 && !c.disk_from_ssd_offload);
		CHECK_EQ(parse(&c, err, "--config", path, NULL), 0);
		CHECK(c.disk_from_ssd_offload);
		fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		CHECK(write(fd, "{\"enable_ssd_offload\": \"on\", \"ssd_offload_path\": \"/n\"}", 55) == 55);
		close(fd);
		CHECK_EQ(parse(&c, err, "--config", path, "--disk-dir", "/d", NULL), 0);
		CHECK(strcmp(c.disk_dir, "/d") == 0);
		setenv("MOONCAKE_OFFLOAD_ENABLED", "true", 1);
		setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/from/env", 1);
		CHECK_EQ(parse(&c, err, NULL), 0);
		CHECK(strcmp(c.disk_dir, "/from/env") == 0);
		unsetenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH");
		CHECK_EQ(parse(&c, err, NULL), 0);
		CHECK(strcmp(c.disk_dir, "/data/file_storage") == 0);
		unsetenv("MOONCAKE_OFFLOAD_ENABLED");
		/* Mooncake's keys only: they are not flags, and our own flags
		 * stay true or false in a file */
		CHECK_EQ(parse(&c, err, "--enable-ssd-offload", NULL), -EINVAL);
		CHECK_EQ(json(&c, "{\"allow_overcommit\": \"yes\"}", err), -EINVAL);
		unlink(path);
	}

	/* one table: every flag in both spellings, and as a JSON key */
	CHECK_EQ(parse(&c, err, "--spill_wait_ms", "7", "--max_clients", "9", "--max-channels=11",
		       "--max_registered_bytes", "1GiB", "--disk_compress", "zstd", "--poll_us", "5",
		       NULL), 0);
	CHECK_EQ(c.spill_wait_ms, 7);
	CHECK_EQ(c.max_clients, 9);
	CHECK_EQ(c.max_channels, 11);
	CHECK_EQ(c.max_registered, UINT64_C(1) << 30);
	CHECK(c.disk_zstd);
	CHECK_EQ(c.poll_us, 5);
	CHECK_EQ(json(&c, "{\"spill-wait-ms\": 8, \"max_clients\": \"12\", \"disk_compress_level\": 5,"
			  " \"allow_overcommit\": true}", err), 0);
	CHECK_EQ(c.spill_wait_ms, 8);
	CHECK_EQ(c.max_clients, 12);
	CHECK_EQ(c.disk_zstd_level, 5);
	CHECK(c.allow_overcommit);
	CHECK_EQ(parse(&c, err, "--max-clients", "0", NULL), -EINVAL);
	CHECK(strstr(err, "--max-clients"));
	CHECK_EQ(parse(&c, err, "--disk-compress-level", "20", NULL), -EINVAL);
	CHECK_EQ(json(&c, "{\"max_clients\": 1.5}", err), -EINVAL);
	CHECK(strstr(err, "max_clients"));
	/* the cluster's flags, and their mooncake.json spellings */
	CHECK_EQ(parse(&c, err, "--local-hostname", "x", NULL), 0);
	CHECK(strcmp(c.local_hostname, "x") == 0);
	CHECK_EQ(parse(&c, err, "--master", "m1:50051,m2:50051", "--node-id", "a", "--insecure",
		       "--remote-timeout-ms", "500", "--protocol", "auto", NULL), 0);
	CHECK(strcmp(c.master_server_address, "m1:50051,m2:50051") == 0);
	CHECK(strcmp(c.node_id, "a") == 0 && c.insecure && c.remote_timeout_ms == 500);
	CHECK_EQ(parse(&c, err, "--remote-timeout-ms", "0", NULL), -EINVAL);
	CHECK_EQ(json(&c, "{\"master_server_address\": \"m3:1\", \"metadata_server\": "
			  "\"P2PHANDSHAKE\", \"local_hostname\": \"10.0.0.2\"}", err), 0);
	CHECK(strcmp(c.master_server_address, "m3:1") == 0);
	CHECK(strcmp(c.local_hostname, "10.0.0.2") == 0);
	unknown_seen[0] = '\0';
	CHECK_EQ(json(&c, "{\"config\": \"/x\"}", err), 0);
	CHECK(strcmp(unknown_seen, "config") == 0);

	/* tiers larger than the machine: refused unless overcommit is asked */
	{
		const uint64_t G = UINT64_C(1) << 30;
		bool warn;

		CHECK_EQ(parse(&c, err, "--dram-size", "60T", NULL), 0);
		CHECK_EQ(config_check_memory(&c, 24 * G, 20 * G, err, &warn), -E2BIG);
		CHECK(strstr(err, "--allow-overcommit"));
		CHECK_EQ(parse(&c, err, "--dram-size", "16G", NULL), 0);
		CHECK_EQ(config_check_memory(&c, 24 * G, 20 * G, err, &warn), 0);
		CHECK(!warn);
		CHECK_EQ(config_check_memory(&c, 24 * G, 8 * G, err, &warn), 0);
		CHECK(warn);
		CHECK_EQ(parse(&c, err, "--dram-size", "60T", "--allow-overcommit", NULL), 0);
		CHECK_EQ(config_check_memory(&c, 24 * G, 20 * G, err, &warn), 0);
		CHECK_EQ(config_parse_json(&c, "{\"allow_overcommit\": 1}", 22, err, NULL), -EINVAL);
	}
	return 0;
}
