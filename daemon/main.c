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
#include "shared.h"
#include "export.h"
#include "handover.h"
#include "node.h"
#include "placement.h"
#include "presum.h"
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

/* Flags, the config file, the memory check and the log settings: -1 to
 * go on, or the exit status (0: --help or --version; 2: refused). */
static int read_config(int argc, char **argv, struct config *cfg)
{
	char err[CONFIG_ERR_MAX] = "";
	struct sysinfo si;
	const char *env;
	bool warn;
	int r;

	config_init(cfg);
	r = config_parse_args(cfg, argc, argv, err);
	if (r > 0)
		return 0;
	if (r < 0) {
		fprintf(stderr, "kvcached: %s\n", err);
		return 2;
	}
	if (sysinfo(&si) == 0) {
		uint64_t unit = si.mem_unit ? si.mem_unit : 1;
		uint64_t avail = mem_available();

		r = config_check_memory(cfg, (uint64_t) si.totalram * unit,
					avail ? avail : (uint64_t) si.freeram * unit, err, &warn);
		if (r < 0) {
			fprintf(stderr, "kvcached: %s\n", err);
			return 2;
		}
		if (warn)
			fprintf(stderr, "kvcached: warning: %s\n", err);
		if (cfg->max_registered == 0)
			cfg->max_registered = (uint64_t) si.totalram * unit / 2;
	}
	if (cfg->max_registered == 0)
		cfg->max_registered = UINT64_C(8) << 30;
	env = getenv("KVCACHE_LOG");
	if (log_configure(cfg->log_level) < 0 || (env && *env && log_configure(env) < 0)) {
		fprintf(stderr, "kvcached: invalid log level specification in KVCACHE_LOG\n");
		return 2;
	}
	return -1;
}

/* Every client costs fds (socket, channels, buffers): take what the hard
 * limit allows; the daemon-wide limits keep it in check.  And, before any
 * thread starts (every thread inherits the mask), the signals arrive
 * through a signalfd only. */
static void set_up_process(void)
{
	struct rlimit rl;
	sigset_t mask;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
}

/* What a running kvcached is made of, in the order it is made. */
struct daemon {
	struct config cfg;
	struct loop *loop;
	struct store *st;
	struct server sv;
	struct prefault *prefault;
	struct disk *disk;
	struct shared *shared;
	struct node *node;
	struct exporter *exporter;
	struct warm_fds warm;        /* what a previous run left (a warm start) */
	struct handover handover;    /* a new kvcached taking this one over */
	bool fdstore;                /* systemd keeps the memory's fds across restarts */
	struct presum *presum;       /* ...then checksums are taken ahead, for a crash */
	bool bad_config; /* a failure the configuration caused: exit 2 */
};

static void presum_stats_of(void *data, void (*emit)(void *u, const char *name, uint64_t v),
			   void *u)
{
	presum_stats(data, emit, u);
}

/* A warm start's fds: from the running daemon (--take-over), or from
 * systemd's file-descriptor store.  -1 to go on, or the exit status. */
static int take_over(struct daemon *d)
{
	char err[256] = "";
	int r;

	if (!d->cfg.take_over) {
		handover_from_fdstore(&d->warm);
		return -1;
	}
	r = handover_ask(d->sv.socket_path, d->cfg.dram_size, d->cfg.device_size, &d->warm, err,
			 sizeof(err));
	if (r == 1) {
		log_notice("--take-over: no kvcached serves %s; starting empty", d->sv.socket_path);
		return -1;
	}
	if (r < 0) {
		log_error("--take-over: %s", err);
		return r == -EINVAL ? 2 : 1;
	}
	return -1;
}

static int start(struct daemon *d)
{
	char err[CONFIG_ERR_MAX] = "";
	int numa_node = -1;
	int r;

	d->sv.loop = d->loop;
	/* placement first: every thread started after it (the copier's, the
	 * data threads) and the tiers' pages are on that node */
	r = placement_resolve(&d->cfg, &numa_node, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		d->bad_config = true;
		return r;
	}
	if (d->warm.listen_fd >= 0) {
		d->sv.inherit_listen = true;
		d->sv.inherited_fd = d->warm.listen_fd;
		d->warm.listen_fd = -1;
	}
	r = store_new_warm(&d->cfg, d->loop, numa_node, d->warm.any ? &d->warm.store : NULL,
			   &d->st);
	if (r < 0) {
		if (d->sv.inherit_listen)
			close(d->sv.inherited_fd);
		return r;
	}
	d->sv.st = d->st;
	handover_init(&d->handover, d->loop);
	d->sv.handover = handover_hook;
	d->sv.handover_data = &d->handover;
	r = server_init(&d->sv);
	if (r == 0)
		r = channel_init(&d->sv);
	if (r == 0)
		r = prefault_start(d->st, &d->prefault);
	if (r == 0)
		r = disk_new(d->st, &d->disk);
	if (r == 0)
		r = shared_new(d->st, &d->shared);
	if (r < 0)
		return r;
	r = node_new(d->st, &d->cfg, &d->node, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		d->bad_config = r == -EINVAL;
		return r;
	}
	d->sv.admin = node_admin(d->node);
	r = export_new(&d->sv, &d->cfg, &d->exporter);
	if (r < 0)
		d->bad_config = r == -EINVAL;
	return r;
}

/* In the reverse order: sessions first (nothing waits on a remote fetch
 * after them); the disk waits for its I/O in flight, then every object is
 * freed without touching its record: records are what survives a
 * restart. */
static void stop(struct daemon *d)
{
	bool handing_over = d->handover.fd >= 0;
	int listen_fd = d->sv.listen_fd;

	export_free(d->exporter);
	d->sv.more_stats = NULL;
	presum_free(d->presum);
	/* handed over, or kept by systemd: the socket stays for the next run */
	d->sv.keep_listen = handing_over || d->fdstore;
	server_done(&d->sv);
	node_free(d->node);
	shared_free(d->shared);
	disk_free(d->disk);
	prefault_stop(d->prefault);
	if (handing_over)
		handover_answer(&d->handover, d->st, listen_fd);
	else if (d->fdstore && d->st)
		log_notice("memory kept for the next start: %llu objects hashed first",
			   (unsigned long long) store_seal(d->st, handover_hash));
	if (d->sv.keep_listen && listen_fd >= 0)
		close(listen_fd);
	store_free(d->st);
	loop_free(d->loop);
}

int main(int argc, char **argv)
{
	static struct daemon d;
	struct store_info info;
	int r;

	loop_tune_malloc();
	r = read_config(argc, argv, &d.cfg);
	if (r >= 0)
		return r;
	d.sv.cfg = &d.cfg;
	d.sv.listen_fd = d.sv.signal_fd = d.sv.lock_fd = -1;
	if (shm_socket_path(d.cfg.socket, d.sv.socket_path, sizeof(d.sv.socket_path)) < 0) {
		fprintf(stderr, "kvcached: socket path too long (at most %zu bytes)\n",
			sizeof(d.sv.socket_path) - 1);
		return 2;
	}
	d.sv.started = mono_us();
	if (d.cfg.config_path[0])
		log_info("configuration read from %s", d.cfg.config_path);
	set_up_process();
	r = loop_new(d.cfg.poll_us, &d.loop);
	if (r < 0) {
		log_error_errno(r, "Failed to set up the event loop");
		return 1;
	}
	d.handover.fd = -1;
	r = take_over(&d);
	if (r >= 0)
		return r;
	r = start(&d);
	if (r == 0) {
		store_info(d.st, &info);
		log_notice("kvcached %s listening on %s (dram %llu bytes, %s pages)", KVC_VERSION,
			   d.sv.socket_path, (unsigned long long) d.cfg.dram_size,
			   info.hugepages ? "2 MiB" : "4 KiB");
		export_serving(d.exporter, true);
		/* under systemd (Type=notify): ready now; a no-op elsewhere */
		sd_notifyf(0, "READY=1\nSTATUS=serving on %s\nMAINPID=%lu", d.sv.socket_path,
			   (unsigned long) getpid());
		d.fdstore = handover_to_fdstore(d.st, d.sv.listen_fd);
		/* a crash keeps what has a checksum: a node takes them ahead
		 * already, a lone daemon does from now on */
		if (d.fdstore && !d.node && presum_new(d.st, &d.cfg, PRESUM_MIN, &d.presum) < 0)
			log_warn("no thread to take checksums ahead: a crash keeps less");
		if (d.presum) {
			d.sv.more_stats = presum_stats_of;
			d.sv.more_stats_data = d.presum;
		}
		r = loop_run(d.loop);
		sd_notify(0, "STOPPING=1");
	}
	stop(&d);
	if (r == 0)
		log_notice("stopped");
	return d.bad_config ? 2 : r < 0 ? 1 : 0;
}
