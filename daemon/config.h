/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/un.h>

#include "shmem.h"

#define CONFIG_DEFAULT_DRAM_SIZE (UINT64_C(1) << 30)
#define CONFIG_MIN_DRAM_SIZE (UINT64_C(1) << 20)
#define CONFIG_ERR_MAX 256
#define CONFIG_DEFAULT_POLL_US 100
#define CONFIG_DEFAULT_LEASE_TTL_MS 10000
#define CONFIG_DEFAULT_PROMOTION_HITS 2
#define CONFIG_MAX_POLL_US 100000
#define CONFIG_DEFAULT_MAX_CLIENTS 1024
#define CONFIG_DEFAULT_SPILL_WAIT_MS 5000
#define CONFIG_DEFAULT_LOOKUP_WAIT_MS 2000
#define CONFIG_DEFAULT_MAX_CHANNELS 4096
#define CONFIG_DEFAULT_REMOTE_TIMEOUT_MS 2000
#define CONFIG_DEFAULT_DATA_STREAMS 2

/*
 * Switches the test suites set in the environment to reach paths a
 * healthy setup never takes; read once, by config_init(), and listed in
 * docs/operating.rst.  Never for production.
 */
struct test_hooks {
	bool no_channel_push;         /* KVCACHE_TEST_NO_CHANNEL_PUSH: a daemon before SHM_SQE_PUSH */
	bool no_channel_stream;       /* KVCACHE_TEST_NO_CHANNEL_STREAM=1: as before SHM_SQE_STREAM */
	bool no_sums_ahead;           /* KVCACHE_TEST_NO_SUMS_AHEAD=1 */
	unsigned sums_ahead_delay_ms; /* KVCACHE_TEST_SUMS_AHEAD_DELAY_MS: the first one waits */
	unsigned recovery_pause_ms;   /* KVCACHE_TEST_RECOVERY_PAUSE_MS: per record recovered */
	unsigned shared_write_ms;     /* KVCACHE_TEST_SHARED_WRITE_MS: each shared-tier copy waits first */
	bool corrupt_peer_send;       /* KVCACHE_TEST_CORRUPT_PEER_SEND=1: objects sent damaged */
	/* KVCACHE_TEST_CUT_PEER_SEND=1: a fetch answer on a connection that
	 * carried one before sends half its bytes, as garbage, and closes it */
	bool cut_peer_send;
	char bogus_rdma;              /* KVCACHE_TEST_BOGUS_RDMA=rkey|address: 'r', 'a' or 0 */
	bool rdma_over_tcp;           /* KVCACHE_TEST_RDMA_OVER_TCP=1: UCX on its tcp transport */
	bool no_eager_push;           /* KVCACHE_TEST_NO_EAGER_PUSH=1 */
	unsigned long directory_queue; /* KVCACHE_TEST_DIRECTORY_QUEUE: a node's queue per master */
	unsigned peer_major;          /* KVCACHE_TEST_PEER_MAJOR: speak another (0: ours) */
};

struct config {
	char socket[sizeof(((struct sockaddr_un *) 0)->sun_path)]; /* "" = default */
	uint64_t dram_size;
	enum shm_hugepages hugepages;
	enum shm_hugepages prefault;   /* auto|on|off, parsed like hugepages */
	char log_level[64];
	uint32_t poll_us; /* spin this long after the last request; 0 = always sleep */
	uint64_t device_size;          /* 0 = no device tier */
	double high_watermark;         /* eviction_high_watermark_ratio */
	double eviction_ratio;
	uint64_t lease_ttl_ms;         /* default_kv_lease_ttl */
	double max_leased_ratio;       /* leased bytes of a tier, at most */
	uint32_t promotion_hits;       /* hits in dram before moving to device */
	char disk_dir[4096];           /* "" = no disk tier */
	bool ssd_offload;              /* mooncake.json: enable_ssd_offload */
	bool disk_from_ssd_offload;    /* disk_dir is the SSD offload's */
	char ssd_offload_path[4096];   /* mooncake.json: the disk tier's directory then */
	uint64_t disk_size;
	bool disk_zstd;
	int disk_zstd_level;
	char shared_dir[4096];         /* "" = no shared tier */
	uint64_t shared_size;
	bool shared_write_through;     /* copy each put at its commit */
	char config_path[4096];
	bool allow_overcommit;         /* tiers may exceed physical memory */
	bool take_over;                /* --take-over: the running daemon's memory and socket */
	uint64_t spill_wait_ms;        /* a put waits this long for a spill, then -EAGAIN */
	uint64_t lookup_wait_ms;       /* a lookup waits this long for a put in flight; 0 = not */
	uint32_t max_clients;          /* connected sessions, daemon-wide */
	uint32_t max_channels;         /* shared-memory channels, daemon-wide */
	uint64_t max_registered;       /* registered buffer bytes, daemon-wide; 0 = half of RAM */

	/* the cluster; the Mooncake spellings are aliases */
	char local_hostname[256];          /* --advertise */
	char metadata_server[256];         /* P2PHANDSHAKE */
	char protocol[16];                 /* "tcp", "rdma" or "auto" */
	char protocol_asked[16];           /* a Mooncake protocol run as auto, or "" */
	char numa_node[16];                /* "", "auto" or a node number */
	char device_name[128];
	char master_server_address[1024];  /* --master: HOST:PORT[,...] */
	char listen[300];                  /* [HOST:]PORT for peers */
	char node_id[256];
	char secret_file[4096];
	bool insecure;
	uint64_t remote_timeout_ms;
	uint32_t data_streams;             /* transfers at once with other nodes, each way */
	char tcp_congestion[16];           /* peer connections': a name, "auto" or "system" */
	uint32_t client_ttl_s;             /* --client-ttl: this node's etcd lease */

	uint32_t metrics_port;             /* GET /metrics and /health; 0 = off */
	char metrics_address[64];
	struct test_hooks test;            /* from the environment, not flags */
};

void config_init(struct config *c);

/* Apply a JSON document.  -EINVAL with err filled in when a key has the wrong
 * type or value; unknown keys are reported through warn (may be NULL). */
int config_parse_json(struct config *c, const char *buf, size_t len, char *err,
		      void (*warn)(const char *key));

int config_load_file(struct config *c, const char *path, char *err,
		     void (*warn)(const char *key));

/* Command line.  Returns 0 to run, 1 when --help/--version was printed, or
 * -EINVAL with err naming the flag. */
int config_parse_args(struct config *c, int argc, char **argv, char *err);

int config_parse_hugepages(const char *s, enum shm_hugepages *ret);

void config_usage(FILE *f);

/* Do the memory tiers fit this machine?  0, or -E2BIG with err saying what
 * to do (allow_overcommit skips the check).  phys and avail in bytes. */
int config_check_memory(const struct config *c, uint64_t phys, uint64_t avail, char *err,
			bool *ret_warn);
