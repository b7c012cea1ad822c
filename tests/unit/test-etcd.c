/* SPDX-License-Identifier: MIT */
/* The etcd client (net/etcd.h) against a real etcd of its own (Debian
 * etcd-server; skipped where there is none): leases granted, renewed and
 * revoked, compare-and-create won once and then refused with the winner's
 * revision, gets and lists, a key bound to a lease gone with it, watches
 * that see a deletion or a change and watches that time out, an endpoint
 * that refuses before one that answers, and endpoints that do not parse. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcd.h"
#include "helpers.h"

/* n distinct free ports below the kernel's ephemeral range (etcd cannot
 * listen on port 0, and a port chosen there could go to any outgoing
 * connection before etcd binds it; the etcd tests do not run beside each
 * other, tests/meson.build). */
static void free_ports(unsigned *ports, int n)
{
	unsigned lo = 32768;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

	if (f) {
		if (fscanf(f, "%u", &lo) != 1)
			lo = 32768;
		fclose(f);
	}
	if (lo <= 21000)
		lo = 21000;
	srand((unsigned) getpid());
	for (int i = 0; i < n;) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		unsigned p = 20000 + (unsigned) rand() % (lo - 20000);
		int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

		CHECK(fd >= 0);
		a.sin_port = htons((uint16_t) p);
		ok = bind(fd, (struct sockaddr *) &a, sizeof(a)) == 0;
		close(fd);
		for (int k = 0; ok && k < i; k++)
			ok = ports[k] != p;
		if (ok)
			ports[i++] = p;
	}
}

struct seen {
	unsigned n;
	char keys[8][64], values[8][64];
};

static void collect(void *u, const char *key, const char *value)
{
	struct seen *s = u;

	if (s->n < 8) {
		snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s", key);
		snprintf(s->values[s->n], sizeof(s->values[0]), "%s", value);
	}
	s->n++;
}

int main(void)
{
	char dir[] = "/tmp/kvc-etcd-XXXXXX", eps[128], url[64], peer[64], buf[64];
	unsigned ports[2], cp, pp;
	/* nothing listens on port 1: a member that refuses */
	const unsigned dead = 1;
	struct etcd *e = NULL, *bad;
	int64_t lease, lease2, rev, rev2, ttl;
	struct seen s = { 0 };
	pid_t pid;
	int r;

	if (system("command -v etcd >/dev/null") != 0) {
		printf("no etcd (Debian etcd-server)\n");
		return EXIT_SKIP;
	}
	CHECK(mkdtemp(dir));
	free_ports(ports, 2);
	cp = ports[0];
	pp = ports[1];
	snprintf(url, sizeof(url), "http://127.0.0.1:%u", cp);
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", pp);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char cluster[96], data[96], log[96];

		snprintf(cluster, sizeof(cluster), "t=%s", peer);
		snprintf(data, sizeof(data), "%s/data", dir);
		snprintf(log, sizeof(log), "%s/etcd.log", dir);
		/* it goes with the test, however the test ends, and holds
		 * none of the test's output open */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (!freopen(log, "w", stderr) || !freopen(log, "a", stdout))
			_exit(1);
		execlp("etcd", "etcd", "--name", "t", "--data-dir", data, "--listen-client-urls", url,
		       "--advertise-client-urls", url, "--listen-peer-urls", peer,
		       "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
		       (char *) NULL);
		_exit(127);
	}
	/* a member that refuses first: the client moves on to the next */
	snprintf(eps, sizeof(eps), "127.0.0.1:%u;http://127.0.0.1:%u/", dead, cp);
	CHECK_EQ(etcd_new(eps, 1000 * USEC_PER_MSEC, &e), 0);
	{
		usec_t give_up = mono_us() + 30 * USEC_PER_SEC; /* etcd's start, at most */

		while ((r = etcd_get(e, "/t/none", buf, sizeof(buf), NULL)) != -ENOENT &&
		       mono_us() < give_up)
			usleep(50000);
	}
	if (r != -ENOENT) {
		snprintf(buf, sizeof(buf), "cat %s/etcd.log >&2", dir);
		CHECK(system(buf) >= 0);
	}
	CHECK_EQ(r, -ENOENT);
	snprintf(buf, sizeof(buf), "127.0.0.1:%u", cp);
	CHECK(!strcmp(etcd_endpoint(e), buf));
	/* the member that answered hangs for a call, then answers again: the
	 * next call still finds it, past the one that refuses */
	{
		struct etcd *e2;
		char b2[64];

		CHECK_EQ(etcd_new(eps, 300 * USEC_PER_MSEC, &e2), 0);
		CHECK_EQ(etcd_get(e2, "/t/none", b2, sizeof(b2), NULL), -ENOENT);
		kill(pid, SIGSTOP);
		r = etcd_get(e2, "/t/none", b2, sizeof(b2), NULL);
		if (r != -ETIMEDOUT && r != -ECONNREFUSED)
			fprintf(stderr, "a stopped member's call ended %d (%s)\n", r, strerror(-r));
		CHECK(r == -ETIMEDOUT || r == -ECONNREFUSED);
		kill(pid, SIGCONT);
		CHECK_EQ(etcd_get(e2, "/t/none", b2, sizeof(b2), NULL), -ENOENT);
		CHECK_EQ(etcd_get(e2, "/t/none", b2, sizeof(b2), NULL), -ENOENT);
		etcd_free(e2);
	}

	/* compare-and-create: once, then refused with the winner's revision */
	CHECK_EQ(etcd_lease_grant(e, 5, &lease), 0);
	CHECK_EQ(etcd_create(e, "/t/view", "a:1", lease, &rev), 0);
	CHECK(rev > 0);
	CHECK_EQ(etcd_create(e, "/t/view", "b:2", 0, &rev2), -EEXIST);
	CHECK_EQ(rev2, rev);
	CHECK_EQ(etcd_get(e, "/t/view", buf, sizeof(buf), &rev2), 0);
	CHECK(!strcmp(buf, "a:1"));
	CHECK_EQ(rev2, rev);
	CHECK_EQ(etcd_get(e, "/t/view", buf, 3, NULL), -ENOSPC);
	CHECK_EQ(etcd_lease_keepalive(e, lease, &ttl), 0);
	CHECK(ttl > 0 && ttl <= 5);

	/* a watch for its deletion times out while it stays, sees it go
	 * when its lease is revoked */
	CHECK_EQ(etcd_wait_gone(e, "/t/view", 0, 300 * USEC_PER_MSEC), -ETIMEDOUT);
	CHECK_EQ(etcd_lease_revoke(e, lease), 0);
	CHECK_EQ(etcd_get(e, "/t/view", buf, sizeof(buf), NULL), -ENOENT);
	CHECK_EQ(etcd_wait_gone(e, "/t/view", 0, 300 * USEC_PER_MSEC), 0);
	CHECK_EQ(etcd_lease_keepalive(e, lease, &ttl), -ENOENT);

	/* a lease that ends on its own takes its key */
	CHECK_EQ(etcd_lease_grant(e, 1, &lease2), 0);
	CHECK_EQ(etcd_put(e, "/t/nodes/A", "{\"id\":\"A\"}", lease2), 0);
	CHECK_EQ(etcd_get(e, "/t/nodes/A", buf, sizeof(buf), &rev), 0);
	CHECK_EQ(etcd_wait_gone(e, "/t/nodes/A", 0, 5 * USEC_PER_SEC), 0);
	CHECK_EQ(etcd_get(e, "/t/nodes/A", buf, sizeof(buf), NULL), -ENOENT);

	/* a list of a prefix, in key order, and only it */
	CHECK_EQ(etcd_put(e, "/t/nodes/B", "b", 0), 0);
	CHECK_EQ(etcd_put(e, "/t/nodes/C", "c", 0), 0);
	CHECK_EQ(etcd_put(e, "/t/nodeset", "not under the prefix", 0), 0);
	CHECK_EQ(etcd_list(e, "/t/nodes/", 8, collect, &s, &rev), 2);
	CHECK(!strcmp(s.keys[0], "/t/nodes/B") && !strcmp(s.values[0], "b"));
	CHECK(!strcmp(s.keys[1], "/t/nodes/C") && !strcmp(s.values[1], "c"));
	/* a watch of the prefix: nothing after rev, then a change */
	CHECK_EQ(etcd_wait_change(e, "/t/nodes/", rev, 300 * USEC_PER_MSEC), -ETIMEDOUT);
	CHECK_EQ(etcd_delete(e, "/t/nodes/B"), 0);
	CHECK_EQ(etcd_wait_change(e, "/t/nodes/", rev, 300 * USEC_PER_MSEC), 0);
	s.n = 0;
	CHECK_EQ(etcd_list(e, "/t/nodes/", 8, collect, &s, NULL), 1);
	etcd_free(e);

	/* endpoints that do not parse; none that answers */
	CHECK_EQ(etcd_new("", USEC_PER_SEC, &bad), -EINVAL);
	CHECK_EQ(etcd_new("a b:1", USEC_PER_SEC, &bad), -EINVAL);
	CHECK_EQ(etcd_new("x:1", 0, &bad), -EINVAL);
	snprintf(eps, sizeof(eps), "127.0.0.1:%u", dead);
	CHECK_EQ(etcd_new(eps, 300 * USEC_PER_MSEC, &bad), 0);
	r = etcd_get(bad, "/t/x", buf, sizeof(buf), NULL);
	CHECK(r == -ECONNREFUSED || r == -ETIMEDOUT);
	etcd_free(bad);

	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	snprintf(buf, sizeof(buf), "rm -rf %s", dir);
	CHECK_EQ(system(buf), 0);
	printf("ok\n");
	return 0;
}
