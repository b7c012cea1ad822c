/* SPDX-License-Identifier: MIT */
/*
 * kvcachectl upgrade: a warm restart of the kvcached serving the socket.
 * It starts the binary (the running daemon's own path by default, which
 * a package upgrade has replaced) with the running daemon's flags (or
 * those given after --) and --take-over, in the running daemon's working
 * directory, environment and log, then waits until the new one serves.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ctl.h"

#define UPGRADE_WAIT_S 300

/* A /proc file of NUL-separated strings, as a NULL-ended vector into
 * *ret_buf (both the caller's to free). */
static char **read_strings(const char *path, char **ret_buf)
{
	size_t cap = 4096, len = 0, n = 0;
	char *buf = malloc(cap), **v;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got;

	*ret_buf = NULL;
	if (fd < 0 || !buf) {
		if (fd >= 0)
			close(fd);
		free(buf);
		return NULL;
	}
	while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
		len += (size_t) got;
		if (len + 1 == cap) {
			char *nb = realloc(buf, cap * 2);

			if (!nb)
				break;
			buf = nb;
			cap *= 2;
		}
	}
	close(fd);
	buf[len] = '\0';
	for (size_t i = 0; i < len; i++)
		n += buf[i] == '\0';
	v = calloc(n + 2, sizeof(*v));
	if (!v) {
		free(buf);
		return NULL;
	}
	n = 0;
	for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
		v[n++] = buf + i;
	*ret_buf = buf;
	return v;
}

static bool has_env(char **env, const char *name)
{
	size_t n = strlen(name);

	for (; env && *env; env++)
		if (!strncmp(*env, name, n) && (*env)[n] == '=')
			return true;
	return false;
}

static uint64_t counter(struct kvc_counter *v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			return v[i].value;
	return 0;
}

/* The new daemon, detached, where the old one ran and logging where it
 * logged. */
static pid_t spawn(uint32_t old, const char *binary, char **argv, char **env)
{
	char path[64];
	pid_t pid = fork();
	int pidfd;

	if (pid != 0)
		return pid;
	setsid();
	snprintf(path, sizeof(path), "/proc/%u/cwd", old);
	if (chdir(path) < 0 && chdir("/") < 0)
		_exit(127);
	pidfd = (int) syscall(SYS_pidfd_open, (pid_t) old, 0);
	for (int fd = 0; fd < 3; fd++) {
		int nfd = -1;

		/* its very stdout and stderr (one file offset: their lines
		 * do not overwrite each other), else the same files again */
		if (fd && pidfd >= 0)
			nfd = (int) syscall(SYS_pidfd_getfd, pidfd, fd, 0);
		snprintf(path, sizeof(path), "/proc/%u/fd/%d", old, fd);
		if (fd && nfd < 0)
			nfd = open(path, O_WRONLY | O_APPEND);
		if (nfd < 0)
			nfd = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
		if (nfd >= 0 && nfd != fd) {
			dup2(nfd, fd);
			close(nfd);
		}
	}
	execve(binary, argv, env);
	fprintf(stderr, "kvcachectl upgrade: cannot run %s: %s\n", binary, strerror(errno));
	_exit(127);
}

int ctl_upgrade(struct kvc_client *c, const char *socket_path, const char *binary,
		char **flags, int n_flags, bool json)
{
	char *cmd_buf = NULL, *env_buf = NULL, **cmd = NULL, **env = NULL, **argv = NULL;
	char path[64], exe[PATH_MAX + 64];
	struct kvc_status *s = NULL;
	struct kvc_counter *cv = NULL;
	size_t n_cv = 0, n = 0;
	usec_t t0 = mono_us();
	int r = 4, status;
	uint32_t old;
	pid_t pid;

	if (kvc_status_get(c, &s) < 0) {
		fprintf(stderr, "kvcachectl upgrade: no status from the daemon\n");
		return 3;
	}
	old = s->pid;
	kvc_status_free(s);
	s = NULL;
	snprintf(path, sizeof(path), "/proc/%u/cmdline", old);
	cmd = read_strings(path, &cmd_buf);
	snprintf(path, sizeof(path), "/proc/%u/environ", old);
	env = read_strings(path, &env_buf);
	if (!cmd || !cmd[0] || !env) {
		fprintf(stderr, "kvcachectl upgrade: cannot read kvcached's command line and "
			"environment (pid %u): run this as its user or root\n", old);
		goto out;
	}
	if (has_env(env, "NOTIFY_SOCKET")) {
		fprintf(stderr, "kvcachectl upgrade: kvcached (pid %u) runs under a service "
			"manager: restart it there (systemctl restart kvcached keeps the memory)\n",
			old);
		r = 2;
		goto out;
	}
	if (!binary) {
		binary = cmd[0];
		if (binary[0] != '/' && strchr(binary, '/')) {
			ssize_t l;

			/* relative to where it started */
			snprintf(path, sizeof(path), "/proc/%u/cwd", old);
			l = readlink(path, exe, PATH_MAX);
			if (l > 0) {
				snprintf(exe + l, sizeof(exe) - (size_t) l, "/%s", cmd[0]);
				binary = exe;
			}
		}
	}
	if (!strchr(binary, '/')) {
		fprintf(stderr, "kvcachectl upgrade: kvcached was started as '%s' (no path): "
			"say which binary with --binary PATH\n", binary);
		r = 2;
		goto out;
	}
	while (cmd[n])
		n++;
	argv = calloc(n + (size_t) n_flags + 8, sizeof(*argv));
	n = 0;
	if (!argv) {
		fprintf(stderr, "kvcachectl upgrade: out of memory\n");
		goto out;
	}
	argv[n++] = (char *) binary;
	if (flags) {
		for (int i = 0; i < n_flags; i++)
			argv[n++] = flags[i];
	} else {
		for (char **a = cmd + 1; *a; a++)
			if (strcmp(*a, "--take-over"))
				argv[n++] = *a;
	}
	argv[n++] = (char *) "--socket";
	argv[n++] = (char *) socket_path;
	argv[n++] = (char *) "--take-over";
	argv[n] = NULL;
	fflush(stdout);
	pid = spawn(old, binary, argv, env);
	if (pid < 0) {
		fprintf(stderr, "kvcachectl upgrade: fork: %s\n", strerror(errno));
		goto out;
	}
	for (;;) {
		struct kvc_client *nc;

		if (waitpid(pid, &status, WNOHANG) == pid) {
			fprintf(stderr, "kvcachectl upgrade: the new kvcached (%s) exited with "
				"status %d before serving; see its log (kvcached's own)\n", binary,
				WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
			goto out;
		}
		if (mono_us() - t0 > UPGRADE_WAIT_S * USEC_PER_SEC) {
			fprintf(stderr, "kvcachectl upgrade: the new kvcached (pid %d) does not "
				"serve after %d s\n", (int) pid, UPGRADE_WAIT_S);
			goto out;
		}
		if (kvc_connect(socket_path, &nc) == 0) {
			bool done = kvc_status_get(nc, &s) == 0 && s->pid == (uint32_t) pid;

			if (done)
				kvc_stats_get(nc, &cv, &n_cv);
			if (s)
				kvc_status_free(s);
			s = NULL;
			kvc_disconnect(nc);
			if (done)
				break;
		}
		usleep(20000);
	}
	{
		char kept[32];
		uint64_t ms = (mono_us() - t0) / USEC_PER_MSEC;

		human(counter(cv, n_cv, "warm_kept_bytes"), kept, sizeof(kept));
		if (json)
			printf("{\"old_pid\": %u, \"pid\": %d, \"kept_objects\": %" PRIu64
			       ", \"kept_bytes\": %" PRIu64 ", \"dropped_objects\": %" PRIu64
			       ", \"warm_start_ms\": %" PRIu64 ", \"serving_after_ms\": %" PRIu64 "}\n",
			       old, (int) pid, counter(cv, n_cv, "warm_kept_objects"),
			       counter(cv, n_cv, "warm_kept_bytes"),
			       counter(cv, n_cv, "warm_dropped_objects"),
			       counter(cv, n_cv, "warm_start_ms"), ms);
		else
			printf("kvcached upgraded: pid %u -> %d; kept %" PRIu64 " objects (%s), "
			       "dropped %" PRIu64 "; serving again %" PRIu64 " ms after the request\n",
			       old, (int) pid, counter(cv, n_cv, "warm_kept_objects"), kept,
			       counter(cv, n_cv, "warm_dropped_objects"), ms);
	}
	r = 0;
out:
	kvc_stats_free(cv);
	free(argv);
	free(cmd);
	free(cmd_buf);
	free(env);
	free(env_buf);
	return r;
}
