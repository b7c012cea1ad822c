/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "kvc-config.h"
#include "log.h"
#include "disk.h"
#include "export.h"
#include "node.h"
#include "placement.h"
#include "prefault.h"
#include "channel.h"
#include "server.h"

#define LOG_TOPIC "main"

/* MemAvailable from /proc/meminfo (0 if unknown). */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	unsigned long long kb = 0;
	char line[128];

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t) kb * 1024;
}

int main(int argc, char **argv)
{
	struct config cfg;
	struct store *st = NULL;
	struct loop *loop = NULL;
	struct server sv = { .cfg = &cfg };
	struct node *node = NULL;
	struct disk *disk = NULL;
	struct prefault *prefault = NULL;
	int numa_node = -1;
	struct store_info info;
	struct exporter *exporter = NULL;
	bool bad_config = false;
	char err[CONFIG_ERR_MAX] = "";
	const char *env;
	int r;

	loop_tune_malloc();
	config_init(&cfg);
	r = config_parse_args(&cfg, argc, argv, err);
	if (r > 0)
		return 0;
	if (r < 0) {
		fprintf(stderr, "kvcached: %s\n", err);
		return 2;
	}
	{
		struct sysinfo si;
		bool warn;

		if (sysinfo(&si) == 0) {
			uint64_t unit = si.mem_unit ? si.mem_unit : 1;

			uint64_t avail = mem_available();

			r = config_check_memory(&cfg, (uint64_t) si.totalram * unit,
						avail ? avail : (uint64_t) si.freeram * unit, err, &warn);
			if (r < 0) {
				fprintf(stderr, "kvcached: %s\n", err);
				return 2;
			}
			if (warn)
				fprintf(stderr, "kvcached: warning: %s\n", err);
			if (cfg.max_registered == 0)
				cfg.max_registered = (uint64_t) si.totalram * unit / 2;
		}
	}
	if (cfg.max_registered == 0)
		cfg.max_registered = UINT64_C(8) << 30;
	{
		/* every client costs fds (socket, channels, buffers): take what
		 * the hard limit allows; the daemon-wide limits keep it in check */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
	}
	env = getenv("KVCACHE_LOG");
	if (log_configure(cfg.log_level) < 0 || (env && *env && log_configure(env) < 0)) {
		fprintf(stderr, "kvcached: invalid log level specification in KVCACHE_LOG\n");
		return 2;
	}
	r = shm_socket_path(cfg.socket, sv.socket_path, sizeof(sv.socket_path));
	if (r < 0) {
		fprintf(stderr, "kvcached: socket path too long (at most %zu bytes)\n",
			sizeof(sv.socket_path) - 1);
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &sv.started);
	if (cfg.config_path[0])
		log_info("configuration read from %s", cfg.config_path);
	sv.listen_fd = sv.signal_fd = sv.lock_fd = -1;

	/* Before any thread starts: every thread inherits the mask, and the
	 * signals arrive through a signalfd only. */
	{
		sigset_t mask;

		sigemptyset(&mask);
		sigaddset(&mask, SIGTERM);
		sigaddset(&mask, SIGINT);
		sigprocmask(SIG_BLOCK, &mask, NULL);
	}
	r = loop_new(cfg.poll_us, &loop);
	if (r < 0) {
		log_error_errno(r, "Failed to set up the event loop");
		return 1;
	}
	sv.loop = loop;
	/* placement first: every thread started after it (the copier's, the
	 * data threads) and the tiers' pages are on that node */
	r = placement_resolve(&cfg, &numa_node, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		bad_config = true;
		goto out;
	}
	r = store_new(&cfg, loop, numa_node, &st);
	if (r < 0)
		goto out;
	sv.st = st;
	r = server_init(&sv);
	if (r < 0)
		goto out;
	r = channel_init(&sv);
	if (r < 0)
		goto out;
	r = prefault_start(st, &prefault);
	if (r < 0)
		goto out;
	r = disk_new(st, &disk);
	if (r < 0)
		goto out;
	r = node_new(st, &cfg, &node, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		if (r == -EINVAL)
			bad_config = true;
		goto out;
	}
	sv.admin = node_admin(node);
	r = export_new(&sv, &cfg, &exporter);
	if (r < 0) {
		bad_config = r == -EINVAL;
		goto out;
	}
	store_info(st, &info);
	log_notice("kvcached %s listening on %s (dram %llu bytes, %s pages)", KVC_VERSION,
		   sv.socket_path, (unsigned long long) cfg.dram_size, info.hugepages ? "2 MiB" : "4 KiB");
	export_serving(exporter, true);
	/* under systemd (Type=notify): ready now; a no-op elsewhere */
	sd_notifyf(0, "READY=1\nSTATUS=serving on %s\nMAINPID=%lu", sv.socket_path,
		   (unsigned long) getpid());
	r = loop_run(loop);
	sd_notify(0, "STOPPING=1");
out:
	export_free(exporter);
	/* sessions first: nothing waits on a remote fetch after this */
	server_done(&sv);
	node_free(node);
	/* Wait for disk I/O in flight, then free every object without
	 * touching its record: records are what survives a restart. */
	disk_free(disk);
	prefault_stop(prefault);
	store_free(st);
	loop_free(loop);
	if (r == 0)
		log_notice("stopped");
	return bad_config ? 2 : r < 0 ? 1 : 0;
}
