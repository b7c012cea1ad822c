/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvcache/kvcache.h>

#include "helpers.h"

bool test_socket_ready(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

pid_t test_spawn(const char *bin, char *const argv[], const char *log)
{
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		/* a test that aborts takes its daemon with it, instead of leaving
		 * it holding the test runner's pipes */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (log) {
			int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

			if (fd >= 0) {
				dup2(fd, 2);
				close(fd);
			}
		}
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

static const char *daemon_bin(void)
{
	const char *b = getenv("KVCACHED");

	if (!b) {
		fprintf(stderr, "KVCACHED is not set (run through meson test)\n");
		exit(1);
	}
	return b;
}

void test_daemon_start(struct test_daemon *td, ...)
{
	char *argv[32];
	int n = 0;
	va_list ap;

	snprintf(td->dir, sizeof(td->dir), "/tmp/kvc-test-XXXXXX");
	CHECK(mkdtemp(td->dir));
	snprintf(td->socket, sizeof(td->socket), "%s/kvcached.sock", td->dir);
	argv[n++] = (char *) "kvcached";
	argv[n++] = (char *) "--socket";
	argv[n++] = td->socket;
	va_start(ap, td);
	for (char *a; (a = va_arg(ap, char *)) && n < 30;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	td->pid = test_spawn(daemon_bin(), argv, NULL);
	for (int i = 0; i < 1000; i++) {
		int st;

		if (test_socket_ready(td->socket))
			return;
		CHECK(waitpid(td->pid, &st, WNOHANG) == 0); /* died during start */
		usleep(10000);
	}
	fprintf(stderr, "kvcached did not come up on %s\n", td->socket);
	abort();
}

int test_wait(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		CHECK(errno == EINTR);
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

void test_daemon_stop(struct test_daemon *td)
{
	struct stat st;

	CHECK(kill(td->pid, SIGTERM) == 0);
	CHECK_EQ(test_wait(td->pid), 0);
	CHECK(lstat(td->socket, &st) < 0 && errno == ENOENT);
	rmdir(td->dir);
}

uint64_t test_rand(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

void test_fill(void *buf, size_t len, uint64_t seed)
{
	uint8_t *p = buf;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v = seed * UINT64_C(0x9e3779b97f4a7c15) ^ (i * UINT64_C(0xff51afd7ed558ccd));

		memcpy(p + i, &v, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t) (seed ^ i);
}

bool test_verify(const void *buf, size_t len, uint64_t seed)
{
	const uint8_t *p = buf;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v = seed * UINT64_C(0x9e3779b97f4a7c15) ^ (i * UINT64_C(0xff51afd7ed558ccd));

		if (memcmp(p + i, &v, 8) != 0)
			return false;
	}
	for (; i < len; i++)
		if (p[i] != (uint8_t) (seed ^ i))
			return false;
	return true;
}

uint64_t test_counter(struct kvc_client *c, const char *name)
{
	struct kvc_counter *v;
	uint64_t val = UINT64_MAX;
	size_t n;

	CHECK_EQ(kvc_stats_get(c, &v, &n), 0);
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].name, name) == 0)
			val = v[i].value;
	kvc_stats_free(v);
	CHECK(val != UINT64_MAX);
	return val;
}

uint64_t test_tier_used(struct kvc_client *c, const char *tier)
{
	char name[64];

	snprintf(name, sizeof(name), "%s.used", tier);
	return test_counter(c, name);
}

void test_wait_recovered(const char *socket)
{
	struct kvc_client *c;

	CHECK_EQ(kvc_connect(socket, &c), 0);
	for (int i = 0;; i++) {
		struct kvc_status *s;
		bool done;

		CHECK_EQ(kvc_status_get(c, &s), 0);
		done = !s->recovering;
		kvc_status_free(s);
		if (done)
			break;
		CHECK(i < 6000);
		usleep(10000);
	}
	kvc_disconnect(c);
}
