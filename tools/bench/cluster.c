/* SPDX-License-Identifier: MIT */
/*
 * kvcache-bench cluster: two hosts made of network namespaces joined by a
 * veth pair, a master and a node on host A, a node on host B.  Values put
 * on A are read on B (each get a remote fetch into B's dram, then the copy
 * to the client), and the rate is set against iperf3 between the same two
 * namespaces in the same run: on a small machine the veth link is bound by
 * CPU, so only the ratio means anything.  Needs root and iperf3.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>

#include "bench.h"
#include "blocking.h"
#include "checksum.h"
#include "net.h"

#define NET "10.231.0"
#define MASTER_PORT "50551"

static char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
static pid_t kids[4];
static unsigned n_kids;

static void sh(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	if (system(cmd) != 0)
		die(0, "failed: %s", cmd);
}

/* Stop every process started here (daemons_up(), iperf3); the hosts stay.
 * Newest first: the nodes go before their master, which they would
 * otherwise log as lost into the middle of what this prints. */
static void daemons_down(void)
{
	fflush(stdout);
	for (unsigned i = n_kids; i-- > 0;)
		if (kids[i] > 0) {
			kill(kids[i], SIGTERM);
			waitpid(kids[i], NULL, 0);
		}
	n_kids = 0;
}

static void teardown(void)
{
	char cmd[256];

	daemons_down();
	snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a,
		 ns_b);
	if (system(cmd) != 0) {
		/* already gone */
	}
}

static pid_t spawn(const char *const *argv)
{
	pid_t p = fork();

	if (p == 0) {
		int fd = open("/dev/null", O_WRONLY);

		if (fd >= 0)
			dup2(fd, 1);
		execvp(argv[0], (char *const *) argv);
		_exit(127);
	}
	if (p < 0)
		die(errno, "%s", "fork");
	kids[n_kids++] = p;
	return p;
}

/* A binary next to this one (build tree or install), else from $PATH. */
static const char *sibling(char *buf, size_t len, const char *dir, const char *name)
{
	char self[4096], *slash;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			snprintf(buf, len, "%s/../%s/%s", self, dir, name);
			if (access(buf, X_OK) == 0)
				return buf;
			snprintf(buf, len, "%s/%s", self, name);
			if (access(buf, X_OK) == 0)
				return buf;
		}
	}
	return name;
}

/* iperf3 from B to A: Gbit/s received, over `streams` streams. */
static double iperf(int streams)
{
	const char *srv[] = { "ip", "netns", "exec", ns_a, "iperf3", "-s", "-1", "-p", "5301", NULL };
	char cmd[256], line[512];
	double bps = 0;
	bool in_sum = false;
	pid_t p = spawn(srv);
	FILE *f;

	usleep(300000);
	snprintf(cmd, sizeof(cmd), "ip netns exec %s iperf3 -c " NET ".1 -p 5301 -t 3 -P %d -R -J", ns_b,
		 streams);
	f = popen(cmd, "r");
	if (!f)
		die(errno, "%s", "iperf3");
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, "\"sum_received\""))
			in_sum = true;
		if (in_sum && strstr(line, "\"bits_per_second\"")) {
			bps = strtod(strchr(line, ':') + 1, NULL);
			in_sum = false;
		}
	}
	pclose(f);
	waitpid(p, NULL, 0);
	kids[--n_kids] = 0;
	if (bps <= 0)
		die(0, "%s", "iperf3 gave no figure (is iperf3 installed?)");
	return bps / 8e9; /* GB/s */
}

/* This process, or a child of it, into a namespace made above. */
static void enter_ns(const char *ns)
{
	char path[128];
	int fd;

	snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0)
		die(errno, "entering %s", ns);
	close(fd);
}

static int full_io(int fd, void *buf, size_t len, bool out)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, MSG_WAITALL);

		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

/* With sum: the bytes in 256 KiB chunks, each hashed by the transfer's
 * checksum right after it went through the socket, and the checksum after
 * them, as a node sends and receives an object; the receiver checks it. */
#define SUM_CHUNK (256u << 10)

/* One value sent or received (send), with its checksum if sum; out: the
 * receiver also copies each chunk there right after hashing it, while it is
 * in cache (a node's copy to its client, at best). */
static int move_value(int c, uint8_t *buf, uint64_t size, bool sum, bool send, uint8_t *out)
{
	struct csum *h;
	uint64_t d, got;

	if (!sum)
		return full_io(c, buf, size, send);
	h = csum_new();
	if (!h)
		return -1;
	for (uint64_t off = 0; off < size; off += SUM_CHUNK) {
		size_t k = size - off < SUM_CHUNK ? (size_t) (size - off) : SUM_CHUNK;

		if (full_io(c, buf + off, k, send) < 0) {
			csum_free(h);
			return -1;
		}
		csum_update(h, buf + off, k);
		if (out)
			memcpy(out + off, buf + off, k);
	}
	d = csum_digest(h);
	csum_free(h);
	if (send)
		return full_io(c, &d, sizeof(d), true);
	return full_io(c, &got, sizeof(got), false) < 0 || got != d ? -1 : 0;
}

/* An ask's flag: send the checksum known before, not one taken as sent. */
#define ASK_KNOWN (UINT64_C(1) << 63)

/*
 * The same work as a remote get, in plain TCP: B asks A for `size` bytes
 * (an 8-byte request) and reads the answer with recv(MSG_WAITALL), one
 * value at a time over one connection with TCP_NODELAY; n values, GB/s.
 * No directory, no shared memory: what one request and one answer cost
 * between the same namespaces; with sum, and the checksum a node sends and
 * verifies (the limit of a fetch on a machine whose CPUs are the link); with
 * copy as well, the receiver copies each value once more, as a node copies
 * a fetched value to its client (the limit of get, get_into and
 * batch_get_into where the same CPUs carry both ends).  With ahead > 1, B
 * asks for that many values in one write and then reads their answers, as
 * a batch load does (its copies go to ahead places used again and again,
 * as a batch's registered buffer), and A sends each value's checksum
 * known before, as a node sends one taken ahead.
 */
/* The congestion control a new TCP socket gets here, and the one a node's
 * connections run (--peer-tcp-congestion auto; namespaces start with the
 * host's default). */
static char cc_system[16] = "?", cc_peers[16] = "?";

static void congestion_names(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	socklen_t len = sizeof(cc_system);

	if (fd < 0)
		return;
	if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc_system, &len) == 0 &&
	    net_congestion(fd, "auto") == 0) {
		len = sizeof(cc_peers);
		getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc_peers, &len);
	}
	close(fd);
}

static double plain_tcp(uint64_t size, uint64_t n, bool sum, bool copy, unsigned ahead)
{
	/* each value has a place of its own on both sides, as in a node's
	 * memory (one buffer again and again would stay in cache) */
	size_t room = (size_t) (size * (n + 1));
	int one = 1, ready[2], res[2];
	pid_t server, client;
	double gbs = 0;

	if (pipe(ready) < 0 || pipe(res) < 0)
		die(errno, "%s", "pipe");
	server = fork();
	if (server == 0) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(5302) };
		uint8_t *buf = malloc(room);
		int l, c;
		uint64_t want, i = 0, known = 0;

		enter_ns(ns_a);
		inet_pton(AF_INET, NET ".1", &sa.sin_addr);
		l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (!buf || bind(l, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(l, 1) < 0)
			_exit(1);
		memset(buf, 0x5a, room);
		if (write(ready[1], "r", 1) != 1)
			_exit(1);
		c = accept(l, NULL, NULL);
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		net_congestion(c, "auto"); /* as a node's */
		while (full_io(c, &want, sizeof(want), false) == 0 && (want & ~ASK_KNOWN) <= size) {
			uint8_t *v = buf + size * (i++ % (n + 1));

			if (want & ASK_KNOWN) {
				/* its checksum taken before, as a node's (every
				 * place holds the same bytes) */
				want &= ~ASK_KNOWN;
				if ((!known && blk_sum(v, want, &known) < 0) ||
				    full_io(c, v, want, true) < 0 ||
				    full_io(c, &known, sizeof(known), true) < 0)
					break;
			} else if (move_value(c, v, want, sum, true, NULL) < 0) {
				break;
			}
		}
		_exit(0);
	}
	if (server < 0)
		die(errno, "%s", "fork");
	char r;

	if (read(ready[0], &r, 1) != 1)
		die(0, "%s", "the plain TCP server did not start");
	client = fork();
	if (client == 0) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(5302) };
		uint8_t *buf = malloc(room), *out = copy ? malloc(size * ahead) : NULL;
		uint64_t *asks = calloc(ahead, sizeof(*asks));
		int c;
		uint64_t t0;
		double g;

		enter_ns(ns_b);
		inet_pton(AF_INET, NET ".1", &sa.sin_addr);
		c = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		net_congestion(c, "auto");
		if (!buf || !asks || (copy && !out) ||
		    connect(c, (struct sockaddr *) &sa, sizeof(sa)) < 0)
			_exit(1);
		/* (not 0: a compiler may make malloc and a zero fill one calloc,
		 * and leave the pages untouched) */
		memset(buf, 1, room);
		if (out)
			memset(out, 1, size * ahead);
		for (unsigned k = 0; k < ahead; k++)
			asks[k] = size | (ahead > 1 ? ASK_KNOWN : 0);
		/* a warm-up value: a fresh connection starts with a small window */
		if (full_io(c, &size, sizeof(size), true) < 0 ||
		    move_value(c, buf, size, sum, false, out) < 0)
			_exit(1);
		t0 = now_ns();
		for (uint64_t i = 0; i < n;) {
			uint64_t k = n - i < ahead ? n - i : ahead;

			if (full_io(c, asks, k * sizeof(*asks), true) < 0)
				_exit(1);
			for (uint64_t j = 0; j < k; j++, i++)
				if (move_value(c, buf + size * (i + 1), size, sum, false,
					       out ? out + size * j : NULL) < 0)
					_exit(1);
		}
		g = (double) (n * size) / (double) (now_ns() - t0);
		if (write(res[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		_exit(0);
	}
	if (client < 0)
		die(errno, "%s", "fork");
	if (read(res[0], &gbs, sizeof(gbs)) != sizeof(gbs))
		gbs = 0;
	waitpid(client, NULL, 0);
	kill(server, SIGTERM);
	waitpid(server, NULL, 0);
	close(ready[0]);
	close(ready[1]);
	close(res[0]);
	close(res[1]);
	if (gbs <= 0)
		die(0, "plain TCP transfer of %" PRIu64 " bytes failed", size);
	return gbs;
}

/* Until the node at sock is joined and sees `nodes` members up (a push
 * names its target by the member list). */
static void wait_joined(const char *sock, size_t nodes)
{
	for (int i = 0; i < 1000; i++) {
		struct kvc_client *c;
		struct kvc_cluster *v;
		bool up = false;

		if (kvc_connect(sock, &c) == 0) {
			if (kvc_cluster_get(c, &v) == 0) {
				size_t n_up = 0;

				for (size_t k = 0; k < v->n_nodes; k++)
					n_up += !strcmp(v->nodes[k].state, "up");
				up = v->masters_up == 1 && n_up >= nodes;
				kvc_cluster_free(v);
			}
			kvc_disconnect(c);
		}
		if (up)
			return;
		usleep(20000);
	}
	die(0, "%s never joined the cluster", sock);
}

/* One reader: its client (connected before the clock starts) reads values
 * from..to of prefix. */
struct reader {
	const char *prefix;
	uint64_t size, from, to;
	uint8_t *buf;
	bool view;
	struct kvc_client *c;
};

static void *read_range(void *arg)
{
	struct reader *r = arg;
	struct kvc_client *c;
	char key[64];

	c = r->c;
	for (uint64_t i = r->from; i < r->to; i++) {
		int64_t got;

		snprintf(key, sizeof(key), "%s/%" PRIu64, r->prefix, i);
		if (r->view) {
			/* the fetch into B's dram alone: a view, no copy out */
			struct kvc_view v;
			int e = kvc_acquire(c, key, &v);

			if (e < 0)
				die(e, "remote acquire %s (%s)", key, kvc_last_error_msg());
			if (v.len != r->size || memcmp(v.data, &i, sizeof(i)) != 0)
				die(0, "%s: wrong bytes", key);
			kvc_release(c, &v);
			continue;
		}
		got = kvc_get(c, key, r->buf, r->size);
		if (got != (int64_t) r->size)
			die((int) (got < 0 ? got : 0), "remote get %s (%s)", key, kvc_last_error_msg());
		if (memcmp(r->buf, &i, sizeof(i)) != 0)
			die(0, "%s: wrong bytes", key);
	}
	kvc_disconnect(c);
	return NULL;
}

/* Put n values of `size` on A under prefix, each starting with its number. */
static void put_values(const char *sa, const char *prefix, uint64_t size, uint64_t n)
{
	struct kvc_client *a;
	uint8_t *v = malloc(size);
	char key[64];

	if (!v)
		die(ENOMEM, "%s", "buffer");
	memset(v, 0x5a, size);
	check(kvc_connect(sa, &a), "connect A");
	for (uint64_t i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s/%" PRIu64, prefix, i);
		memcpy(v, &i, sizeof(i));
		check(kvc_put(a, key, v, size, NULL), "put on A");
	}
	kvc_disconnect(a);
	free(v);
	usleep(500000); /* the directory hears of commits in batches */
}

static void wait_warm(struct kvc_client *c);

/* Put n values of `size` on A under prefix, then read them on B with
 * `threads` clients (warm: each waits first until the library has touched
 * its mappings, as a long-lived engine's are); GB/s. */
static double remote_gets(const char *sa, const char *sb, const char *prefix, uint64_t size,
			  uint64_t n, unsigned threads, bool view, bool warm)
{
	struct reader rd[8];
	pthread_t th[8];
	uint64_t t0, t1;

	put_values(sa, prefix, size, n);
	for (unsigned t = 0; t < threads; t++) {
		rd[t] = (struct reader) { prefix, size, n * t / threads, n * (t + 1) / threads,
					  malloc(size), view };
		if (!rd[t].buf)
			die(ENOMEM, "%s", "buffer");
		/* the reader's own buffer is memory it has used before, as an
		 * engine's is: its first touch is not the pool's to pay */
		memset(rd[t].buf, 0, size);
		check(kvc_connect(sb, &rd[t].c), "connect B");
		if (warm)
			wait_warm(rd[t].c);
	}
	t0 = now_ns();
	for (unsigned t = 0; t < threads; t++)
		pthread_create(&th[t], NULL, read_range, &rd[t]);
	for (unsigned t = 0; t < threads; t++)
		pthread_join(th[t], NULL);
	t1 = now_ns();
	for (unsigned t = 0; t < threads; t++)
		free(rd[t].buf);
	return (double) (n * size) / ((double) (t1 - t0));
}

/* The values a remote_gets() with one client fetched, fetched again after
 * B dropped its replicas: A knows their checksums now (taken ahead in the
 * background, or as it sent them) whatever it knew the first time; GB/s. */
static double remote_again(const char *sb, const char *prefix, uint64_t size, uint64_t n)
{
	struct reader rd = { prefix, size, 0, n, NULL, true };
	struct kvc_client *b;
	char p[64];
	uint64_t t0;

	check(kvc_connect(sb, &b), "connect B");
	snprintf(p, sizeof(p), "%s/", prefix);
	kvc_set_get_flags(b, KVC_LOCAL_ONLY); /* B's copies alone, not A's */
	if (kvc_remove_prefix(b, p, KVC_REMOVE_FORCE, NULL) < 0)
		die(0, "%s", "dropping B's replicas");
	kvc_disconnect(b);
	usleep(500000); /* the directory hears of withdrawals in batches */
	check(kvc_connect(sb, &rd.c), "connect B");
	t0 = now_ns();
	read_range(&rd);
	return (double) (n * size) / ((double) (now_ns() - t0));
}

/* The values remote_gets() put under prefix, read on B in batches of
 * `batch` keys with kvc_batch_get_into (an engine loading a request's
 * blocks): every fetch of a batch is in flight at once; GB/s. */
/* Keys a batch load asks for at once: an engine's load of one layer's
 * blocks of a 1024-token prompt at 64 KiB (per-layer objects); 16 MiB a
 * call above that, at least 4 keys. */
static unsigned batch_keys(uint64_t size)
{
	uint64_t k = size <= (64u << 10) ? 64 : (16u << 20) / size;

	return k < 4 ? 4 : k > 64 ? 64 : (unsigned) k;
}

static double remote_batches(const char *sb, const char *prefix, uint64_t size, uint64_t n,
			     unsigned batch)
{
	struct kvc_client *b;
	struct kvc_buffer buf;
	char names[64][64];
	const char *keys[64];
	struct kvc_iov iov[64];
	const struct kvc_iov *iovs[64];
	size_t n_iov[64];
	ssize_t res[64];
	uint64_t t0, t1;

	if (batch > 64)
		batch = 64;
	check(kvc_connect(sb, &b), "connect B");
	check(kvc_buffer_alloc(b, size * batch, &buf), "registered buffer on B");
	memset(buf.data, 0, size * batch); /* not the fetch's page faults */
	t0 = now_ns();
	for (uint64_t i = 0; i < n; i += batch) {
		unsigned k = (unsigned) (n - i < batch ? n - i : batch);

		for (unsigned j = 0; j < k; j++) {
			snprintf(names[j], sizeof(names[j]), "%s/%" PRIu64, prefix, i + j);
			keys[j] = names[j];
			iov[j] = (struct kvc_iov) { &buf, (uint64_t) j * size, size };
			iovs[j] = &iov[j];
			n_iov[j] = 1;
		}
		if (kvc_batch_get_into(b, k, keys, iovs, n_iov, res) != (int) k)
			for (unsigned j = 0; j < k; j++)
				if (res[j] != (ssize_t) size)
					die((int) (res[j] < 0 ? res[j] : 0), "remote batch get %s (%s)",
					    keys[j], kvc_last_error_msg());
		for (unsigned j = 0; j < k; j++) {
			uint64_t want = i + j;

			if (memcmp((uint8_t *) buf.data + (uint64_t) j * size, &want, sizeof(want)))
				die(0, "%s: wrong bytes", keys[j]);
		}
	}
	t1 = now_ns();
	kvc_buffer_free(b, &buf);
	kvc_disconnect(b);
	return (double) (n * size) / ((double) (t1 - t0));
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

	return x < y ? -1 : x > y;
}

/* Remove everything from both nodes. */
static void clear_nodes(const char *sa, const char *sb)
{
	const char *socks[2] = { sa, sb };

	for (int i = 0; i < 2; i++) {
		struct kvc_client *c;
		uint64_t skipped;

		check(kvc_connect(socks[i], &c), "connect");
		kvc_remove_all(c, KVC_REMOVE_FORCE, &skipped);
		kvc_disconnect(c);
	}
}

/* Remote lookups on B of keys only A holds, each key asked once (no answer
 * remembered yet): p50 of one exists, and of one prefix_lookup over 64 keys
 * (one question to the master for all of them). */
static void remote_lookups(const char *sa, const char *sb)
{
	enum { N_EXISTS = 400, N_PREFIX = 50, K = 64 };
	static uint64_t ex[N_EXISTS], px[N_PREFIX];
	static char names[N_PREFIX * K][32];
	const char *keys[K];
	struct kvc_client *a, *b;
	uint8_t x = 1;

	check(kvc_connect(sa, &a), "connect A");
	for (int i = 0; i < N_EXISTS; i++) {
		char key[32];

		snprintf(key, sizeof(key), "lk-e/%d", i);
		check(kvc_put(a, key, &x, 1, NULL), "put on A");
	}
	for (int i = 0; i < N_PREFIX * K; i++) {
		snprintf(names[i], sizeof(names[i]), "lk-p/%d", i);
		check(kvc_put(a, names[i], &x, 1, NULL), "put on A");
	}
	kvc_disconnect(a);
	check(kvc_connect(sb, &b), "connect B");
	/* the directory hears of commits in batches, in order: wait for the
	 * last of each set (kvc_where asks the master, and remembers nothing) */
	for (int i = 0;; i++) {
		const char *last[2] = { "lk-e/399", names[N_PREFIX * K - 1] };
		int found = 0;

		for (int k = 0; k < 2; k++) {
			char **nodes;
			size_t nn;

			if (kvc_where(b, last[k], &nodes, &nn) == 0) {
				found++;
				kvc_where_free(nodes);
			}
		}
		if (found == 2)
			break;
		if (i > 2000)
			die(0, "%s", "the directory never heard of A's keys");
		usleep(10000);
	}
	for (int i = 0; i < N_EXISTS; i++) {
		char key[32];
		uint64_t t0;

		snprintf(key, sizeof(key), "lk-e/%d", i);
		t0 = now_ns();
		if (kvc_exists(b, key) != 1)
			die(0, "%s: not found from B", key);
		ex[i] = now_ns() - t0;
	}
	for (int i = 0; i < N_PREFIX; i++) {
		uint64_t t0;

		for (int k = 0; k < K; k++)
			keys[k] = names[i * K + k];
		t0 = now_ns();
		int got = kvc_prefix_lookup(b, keys, K);

		if (got != K)
			die(got < 0 ? got : 0, "prefix_lookup of %s.. from B: %d of %d", keys[0], got, K);
		px[i] = now_ns() - t0;
	}
	kvc_disconnect(b);
	qsort(ex, N_EXISTS, sizeof(ex[0]), cmp_u64);
	qsort(px, N_PREFIX, sizeof(px[0]), cmp_u64);
	printf("remote lookups on B of keys A holds (each asked once): exists p50 %.1f us, "
	       "prefix_lookup of %d keys p50 %.1f us (%.2f us a key)\n",
	       (double) ex[N_EXISTS / 2] / 1e3, K, (double) px[N_PREFIX / 2] / 1e3,
	       (double) px[N_PREFIX / 2] / 1e3 / K);
}

/* Until the library's thread has touched all of c's mappings of dram (at
 * most 30 s): the client is warm, as a long-lived engine's is. */
static void wait_warm(struct kvc_client *c)
{
	struct kvc_status *st;
	uint64_t dram = 0;

	check(kvc_status_get(c, &st), "status");
	for (size_t i = 0; i < st->n_tiers; i++)
		if (!strcmp(st->tiers[i].name, "dram"))
			dram = st->tiers[i].capacity;
	kvc_status_free(st);
	for (int i = 0; i < 30000 && kvc_warmed_bytes(c) < dram; i++)
		usleep(1000);
}

static double push_rate_as(const char *sa, const char *sb, uint64_t size, uint64_t n,
			   bool warm, unsigned batch);

/* Puts on A that push each object to B (kvc_put_opts.push_to): GB/s from
 * the first put to B holding them all; a fresh client. */
#define PUSH_BATCH 64

static double push_rate(const char *sa, const char *sb, uint64_t size, uint64_t n)
{
	return push_rate_as(sa, sb, size, n, false, 1);
}

/* warm: the client's mappings are touched first (a long-lived prefill);
 * batch > 1: kvc_batch_put of that many keys at a time (a prefill storing
 * a layer's blocks). */
static double push_rate_as(const char *sa, const char *sb, uint64_t size, uint64_t n,
			   bool warm, unsigned batch)
{
	struct kvc_put_opts o = { .push_to = "B" };
	struct kvc_client *a, *b;
	uint8_t *v = malloc(size);
	uint64_t t0, t1, start, now;
	char key[64], keys[PUSH_BATCH][64];
	const char *kp[PUSH_BATCH];
	struct kvc_iovec iov = { 0 };
	const struct kvc_iovec *iovp[PUSH_BATCH];
	size_t n_iov[PUSH_BATCH];
	int res[PUSH_BATCH];

	if (!v)
		die(ENOMEM, "%s", "buffer");
	memset(v, 0x3c, size);
	check(kvc_connect(sa, &a), "connect A");
	check(kvc_connect(sb, &b), "connect B");
	if (warm)
		wait_warm(a);
	iov = (struct kvc_iovec) { v, size };
	for (unsigned j = 0; j < PUSH_BATCH; j++) {
		kp[j] = keys[j];
		iovp[j] = &iov;
		n_iov[j] = 1;
	}
	start = counter(b, "pushes_received");
	t0 = now_ns();
	for (uint64_t i = 0; i < n && batch > 1; i += batch) {
		size_t m = n - i < batch ? n - i : batch;

		for (size_t j = 0; j < m; j++)
			snprintf(keys[j], sizeof(keys[j]), "push-%" PRIu64 "/%" PRIu64, size, i + j);
		if (kvc_batch_put(a, m, kp, iovp, n_iov, &o, res) != (int) m)
			die(res[0], "%s", "batch put with push_to on A");
	}
	for (uint64_t i = 0; i < n && batch <= 1; i++) {
		snprintf(key, sizeof(key), "push-%" PRIu64 "/%" PRIu64, size, i);
		check(kvc_put(a, key, v, size, &o), "put with push_to on A");
	}
	for (;;) {
		now = counter(b, "pushes_received");
		if (now - start >= n)
			break;
		if (now_ns() - t0 > UINT64_C(60000000000))
			die(0, "only %" PRIu64 " of %" PRIu64 " pushes arrived", now - start, n);
		usleep(200);
	}
	t1 = now_ns();
	kvc_disconnect(a);
	kvc_disconnect(b);
	free(v);
	return (double) (n * size) / (double) (t1 - t0);
}

/* p50 and p99 in microseconds of exists and of a 4 KiB get, one local
 * client. */
struct lat {
	double ex, ex99, get, get99;
};

static void local_latency(const char *sock, struct lat *ret)
{
	enum { N = 20000 };
	static uint64_t samples[N];
	static uint8_t v[4096], out[4096];
	struct kvc_client *c;

	check(kvc_connect(sock, &c), "connect B");
	{
		int r = kvc_put(c, "local/small", v, sizeof(v), NULL);

		if (r < 0 && r != -EEXIST)
			die(r, "%s", "put on B");
	}
	for (int i = 0; i < N; i++) {
		uint64_t t = now_ns();

		if (kvc_exists(c, "local/small") != 1)
			die(0, "%s", "local exists missed");
		samples[i] = now_ns() - t;
	}
	qsort(samples, N, sizeof(samples[0]), cmp_u64);
	ret->ex = (double) samples[N / 2] / 1e3;
	ret->ex99 = (double) samples[N * 99 / 100] / 1e3;
	for (int i = 0; i < N; i++) {
		uint64_t t = now_ns();

		if (kvc_get(c, "local/small", out, sizeof(out)) != (int64_t) sizeof(out))
			die(0, "%s", "local get missed");
		samples[i] = now_ns() - t;
	}
	qsort(samples, N, sizeof(samples[0]), cmp_u64);
	ret->get = (double) samples[N / 2] / 1e3;
	ret->get99 = (double) samples[N * 99 / 100] / 1e3;
	kvc_disconnect(c);
}

struct churner {
	uint64_t failed;
	const char *sb;
	unsigned n;
	volatile bool stop;
	uint64_t bytes;
};

/* Fetch busy/0..n-1 from A over and over (dropping B's replicas after each
 * pass), until told to stop. */
static void *churn_remote(void *arg)
{
	struct churner *ch = arg;
	struct kvc_client *c;
	char key[64];

	check(kvc_connect(ch->sb, &c), "connect B");
	while (!ch->stop) {
		for (unsigned i = 0; i < ch->n && !ch->stop; i++) {
			struct kvc_view v;

			snprintf(key, sizeof(key), "busy/%u", i);
			int e = kvc_acquire(c, key, &v);

			if (e == 0) {
				ch->bytes += v.len;
				kvc_release(c, &v);
			} else if (!ch->failed++) {
				fprintf(stderr, "kvcache-bench: remote acquire %s from B: %s (%s)\n", key,
					kvc_strerror(e), kvc_last_error_msg());
			}
		}
		kvc_set_get_flags(c, KVC_LOCAL_ONLY); /* B's replicas alone */
		kvc_remove_prefix(c, "busy/", KVC_REMOVE_FORCE, NULL);
		kvc_set_get_flags(c, 0);
	}
	kvc_disconnect(c);
	return NULL;
}

static void local_while_remote(const char *sa, const char *sb)
{
	struct churner ch = { .sb = sb, .n = 16 };
	struct lat l0, l1;
	struct kvc_client *a;
	uint8_t *v = calloc(1, 16 << 20);
	uint64_t t0;
	pthread_t th;
	char key[64];

	if (!v)
		die(ENOMEM, "%s", "buffer");
	check(kvc_connect(sa, &a), "connect A");
	for (unsigned i = 0; i < ch.n; i++) {
		snprintf(key, sizeof(key), "busy/%u", i);
		int r = kvc_put(a, key, v, 16 << 20, NULL);

		if (r < 0 && r != -EEXIST) /* (put by the phase before) */
			die(r, "%s", "put on A");
	}
	kvc_disconnect(a);
	free(v);
	usleep(500000);
	local_latency(sb, &l0);
	pthread_create(&th, NULL, churn_remote, &ch);
	usleep(300000);
	t0 = now_ns();
	local_latency(sb, &l1);
	ch.stop = true;
	pthread_join(th, NULL);
	printf("local on B, idle / while B fetches 16 MiB values from A (%.2f GB/s meanwhile):\n"
	       "  exists p50 %.2f / %.2f us (%.2fx), p99 %.1f / %.1f us; "
	       "4 KiB get p50 %.2f / %.2f us (%.2fx), p99 %.1f / %.1f us\n",
	       (double) ch.bytes / (double) (now_ns() - t0 + 300000000), l0.ex, l1.ex, l1.ex / l0.ex,
	       l0.ex99, l1.ex99, l0.get, l1.get, l1.get / l0.get, l0.get99, l1.get99);
}

static uint64_t daemons_up_ns; /* when both nodes had joined */

/* Where B's fetches spent their time, phase by phase (its counters
 * remote_fetch_*_us, summed over remote_fetches_timed fetches). */
static const char *const phase_names[] = { "locate", "queue", "answer", "bytes", "end" };
#define N_PHASES (sizeof(phase_names) / sizeof(phase_names[0]))

struct phases {
	uint64_t timed, us[N_PHASES];
	uint64_t values;  /* the client's, and its wall time for them */
	double wall_us;
};

static struct phases phases_of(const char *sock)
{
	struct phases p = { 0 };
	struct kvc_client *c;
	char name[64];

	check(kvc_connect(sock, &c), "connect");
	p.timed = counter(c, "remote_fetches_timed");
	for (size_t i = 0; i < N_PHASES; i++) {
		snprintf(name, sizeof(name), "remote_fetch_%s_us", phase_names[i]);
		p.us[i] = counter(c, name);
	}
	kvc_disconnect(c);
	return p;
}

/* *sum += what B's counters gained since `before`. */
static void phases_add(struct phases *sum, const struct phases *before, const char *sock)
{
	struct phases now = phases_of(sock);

	sum->timed += now.timed - before->timed;
	for (size_t i = 0; i < N_PHASES; i++)
		sum->us[i] += now.us[i] - before->us[i];
}

/* How long each daemon's loop went without serving anyone during the run,
 * and how long it spun for local clients. */
static void loop_figures(const char *name, const char *sock)
{
	struct kvc_client *c;

	check(kvc_connect(sock, &c), "connect");
	printf("node %s: longest loop turn %.2f ms (longest unpreempted %.2f ms), the loop slept "
	       "while working %" PRIu64 " time(s), spun for clients %.2f s of %.1f s, moved off "
	       "its clients' CPU %" PRIu64 " time(s), %" PRIu64 " lost master link(s)\n", name,
	       (double) counter(c, "loop_longest_turn_us") / 1e3,
	       (double) counter(c, "loop_longest_busy_us") / 1e3, counter(c, "loop_blocked"),
	       (double) counter(c, "loop_spin_us") / 1e6,
	       (double) (now_ns() - daemons_up_ns) / 1e9, counter(c, "loop_steps_aside"),
	       counter(c, "master_drops"));
	printf("  served %" PRIu64 " object(s), %" PRIu64 " with a checksum known before (%" PRIu64
	       " taken ahead in the background); %" PRIu64 " fetch(es) asked for before the one "
	       "ahead was answered\n", counter(c, "remote_served"),
	       counter(c, "remote_served_summed"), counter(c, "sums_ahead"),
	       counter(c, "remote_fetched_ahead"));
	kvc_disconnect(c);
}

/* The two hosts: namespaces joined by a veth pair. */
static void hosts_up(void)
{
	if (geteuid() != 0)
		die(0, "%s", "the cluster cases make network namespaces: run them as root");
	bench_setup();
	snprintf(ns_a, sizeof(ns_a), "kvcb-a-%d", (int) getpid());
	snprintf(ns_b, sizeof(ns_b), "kvcb-b-%d", (int) getpid());
	snprintf(veth_a, sizeof(veth_a), "kvcba%d", (int) getpid() % 100000);
	snprintf(veth_b, sizeof(veth_b), "kvcbb%d", (int) getpid() % 100000);
	atexit(teardown);
	sh("ip netns add %s && ip netns add %s", ns_a, ns_b);
	sh("ip link add %s type veth peer name %s", veth_a, veth_b);
	sh("ip link set %s netns %s && ip link set %s netns %s", veth_a, ns_a, veth_b, ns_b);
	sh("ip -n %s addr add " NET ".1/24 dev %s && ip -n %s link set %s up && "
	   "ip -n %s link set lo up", ns_a, veth_a, ns_a, veth_a, ns_a);
	sh("ip -n %s addr add " NET ".2/24 dev %s && ip -n %s link set %s up && "
	   "ip -n %s link set lo up", ns_b, veth_b, ns_b, veth_b, ns_b);
}

/*
 * A master and node A on host A, node B on host B, their sockets in sa and
 * sb (256 bytes each).  With rdma, both nodes move data by the RDMA path
 * on UCX's tcp transport (KVCACHE_TEST_RDMA_OVER_TCP: no verbs device
 * here).  Both daemons run with their defaults: a loop spins only for local
 * clients (loop_client_turn()), never for peers, so two nodes on a small
 * machine leave its CPUs to the data threads.
 */
static const char *node_dram = "2GiB";
static double prefault_s; /* waited for the daemons' --prefault */
static bool node_huge; /* their dram on 2 MiB pages */

static void daemons_up(char *sa, char *sb, bool rdma)
{
	static char master[4200], kvcached[4200];
	char la[64], lb[64];

	if (sibling(master, sizeof(master), "daemon", "kvcache-master") != master)
		snprintf(master, sizeof(master), "kvcache-master");
	if (arg_kvcached)
		snprintf(kvcached, sizeof(kvcached), "%s", arg_kvcached);
	else if (sibling(kvcached, sizeof(kvcached), "daemon", "kvcached") != kvcached)
		snprintf(kvcached, sizeof(kvcached), "kvcached");
	snprintf(sa, 256, "%s/a.sock", tmpdir);
	snprintf(sb, 256, "%s/b.sock", tmpdir);
	snprintf(la, sizeof(la), NET ".1:0");
	snprintf(lb, sizeof(lb), NET ".2:0");
	if (rdma)
		setenv("KVCACHE_TEST_RDMA_OVER_TCP", "1", 1);
	{
		const char *m[] = { "ip", "netns", "exec", ns_a, master, "--rpc_address", NET ".1",
				    "--port", MASTER_PORT, "--log-level", "warn", NULL };
		const char *a[] = { "ip", "netns", "exec", ns_a, kvcached, "--socket", sa,
				    "--dram-size", node_dram, "--master", NET ".1:" MASTER_PORT,
				    "--listen", la, "--insecure", "--node-id", "A", "--log-level",
				    "warn", NULL };
		const char *b[] = { "ip", "netns", "exec", ns_b, kvcached, "--socket", sb,
				    "--dram-size", node_dram, "--master", NET ".1:" MASTER_PORT,
				    "--listen", lb, "--insecure", "--node-id", "B", "--log-level",
				    "warn", NULL };

		spawn(m);
		usleep(200000);
		spawn(a);
		spawn(b);
		wait_joined(sa, 2);
		wait_joined(sb, 2);
		/* daemons that have run a while: their tiers faulted in */
		prefault_s = wait_prefault(sa);
		prefault_s += wait_prefault(sb);
		{
			struct kvc_client *c;
			struct kvc_status *st;

			check(kvc_connect(sa, &c), "connect A");
			check(kvc_status_get(c, &st), "status");
			node_huge = st->hugepages;
			kvc_status_free(st);
			kvc_disconnect(c);
		}
		daemons_up_ns = now_ns();
	}
	unsetenv("KVCACHE_TEST_RDMA_OVER_TCP");
}

void cluster_up(char *sa, char *sb, double *ret_link, const char *dram)
{
	hosts_up();
	*ret_link = iperf(1);
	node_dram = dram;
	daemons_up(sa, sb, false);
}

/* One figure over the rounds of a run. */
struct fig {
	double v[MAX_ROUNDS];
	unsigned n;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static double fig_med(const struct fig *f)
{
	double v[MAX_ROUNDS];

	memcpy(v, f->v, f->n * sizeof(v[0]));
	qsort(v, f->n, sizeof(v[0]), cmp_double);
	return f->n % 2 ? v[f->n / 2] : (v[f->n / 2 - 1] + v[f->n / 2]) / 2;
}

static double fig_min(const struct fig *f)
{
	double m = f->v[0];

	for (unsigned i = 1; i < f->n; i++)
		m = f->v[i] < m ? f->v[i] : m;
	return m;
}

static double fig_max(const struct fig *f)
{
	double m = f->v[0];

	for (unsigned i = 1; i < f->n; i++)
		m = f->v[i] > m ? f->v[i] : m;
	return m;
}

static void fig_range(const char *what, const struct fig *f)
{
	printf(" %s %.2f-%.2f", what, fig_min(f), fig_max(f));
}

int run_cluster(void)
{
	static const uint64_t dflt[] = { 64 << 10, 1 << 20, 16 << 20 };
	bool given = !(n_sizes == 5 && arg_sizes[0] == 4096);
	const uint64_t *sizes = given ? arg_sizes : dflt;
	size_t ns = given ? n_sizes : 3;
	char sa[256], sb[256];
	static struct plot chart;
	/* rat_*: a round's figure over the same round's plain TCP, taken
	 * moments apart (the machine's speed moves between rounds) */
	static struct fig rat_at[MAX_SIZES], rat_as[MAX_SIZES], rat_gt[MAX_SIZES];
	/* tcc: plain TCP with the checksum and a copy out; rat_*c: get and
	 * batch over it, round by round */
	static struct fig tcc[MAX_SIZES], rat_gc[MAX_SIZES], rat_bc[MAX_SIZES];
	/* tst: the same asked for a batch at a time; rat_bs: batch over it */
	static struct fig tst[MAX_SIZES], rat_bs[MAX_SIZES];
	static struct fig g5[MAX_SIZES]; /* fetched again: sums known */
	static struct phases ph1[MAX_SIZES]; /* B's fetch phases under acquire, 1 client */
	static struct fig tcp[MAX_SIZES], tcs[MAX_SIZES], g1[MAX_SIZES], g2[MAX_SIZES], g3[MAX_SIZES],
		g4[MAX_SIZES], g6[MAX_SIZES], push[MAX_SIZES], pushw[MAX_SIZES], pushb[MAX_SIZES];
	double p1, p2, p1b, p2b;

	hosts_up();
	if (arg_local_only) {
		daemons_up(sa, sb, false);
		for (unsigned r = 0; r < arg_rounds; r++)
			local_while_remote(sa, sb);
		loop_figures("B", sb);
		return 0;
	}
	congestion_names();
	p1 = iperf(1);
	p2 = iperf(2);
	daemons_up(sa, sb, false);
	/* rounds outside, sizes inside: a slow spell of the machine spreads
	 * over every size instead of sinking one */
	for (unsigned r = 0; r < arg_rounds; r++)
		for (size_t i = 0; i < ns; i++) {
			uint64_t size = sizes[i], n = (UINT64_C(384) << 20) / size;
			char name[16], p[48];
			struct phases ph0;

			if (n > 4096)
				n = 4096;
			if (n < 8)
				n = 8;
			size_name(name, sizeof(name), size);
			tcp[i].v[tcp[i].n++] = plain_tcp(size, n, false, false, 1);
			tcs[i].v[tcs[i].n++] = plain_tcp(size, n, true, false, 1);
			tcc[i].v[tcc[i].n++] = plain_tcp(size, n, true, true, 1);
			tst[i].v[tst[i].n++] =
				plain_tcp(size, n, true, true, batch_keys(size));
			snprintf(p, sizeof(p), "one-%s-%u", name, r);
			ph0 = phases_of(sb);
			g1[i].v[g1[i].n++] = remote_gets(sa, sb, p, size, n, 1, true, false);
			phases_add(&ph1[i], &ph0, sb);
			ph1[i].values += n;
			ph1[i].wall_us += (double) (n * size) / g1[i].v[r] / 1e3; /* (bytes/ns) */
			snprintf(p, sizeof(p), "two-%s-%u", name, r);
			g2[i].v[g2[i].n++] = remote_gets(sa, sb, p, size, n, 2, true, false);
			snprintf(p, sizeof(p), "get-%s-%u", name, r);
			g3[i].v[g3[i].n++] = remote_gets(sa, sb, p, size, n, 1, false, false);
			snprintf(p, sizeof(p), "wget-%s-%u", name, r);
			g6[i].v[g6[i].n++] = remote_gets(sa, sb, p, size, n, 1, false, true);
			rat_at[i].v[rat_at[i].n++] = g1[i].v[r] / tcp[i].v[r];
			rat_as[i].v[rat_as[i].n++] = g1[i].v[r] / tcs[i].v[r];
			rat_gt[i].v[rat_gt[i].n++] = g3[i].v[r] / tcp[i].v[r];
			snprintf(p, sizeof(p), "one-%s-%u", name, r);
			g5[i].v[g5[i].n++] = remote_again(sb, p, size, n);
			snprintf(p, sizeof(p), "bat-%s-%u", name, r);
			put_values(sa, p, size, n);
			g4[i].v[g4[i].n++] =
				remote_batches(sb, p, size, n, batch_keys(size));
			rat_gc[i].v[rat_gc[i].n++] = g3[i].v[r] / tcc[i].v[r];
			rat_bc[i].v[rat_bc[i].n++] = g4[i].v[r] / tcc[i].v[r];
			rat_bs[i].v[rat_bs[i].n++] = g4[i].v[r] / tst[i].v[r];
			clear_nodes(sa, sb); /* room for the next on both nodes */
		}
	p1b = iperf(1);
	p2b = iperf(2);
	printf("kvcache-bench cluster: hosts %s and %s over a veth pair; iperf3 A->B %.2f / %.2f GB/s "
	       "(1 stream, before / after), %.2f / %.2f GB/s (2 streams); ratios are to the "
	       "higher\n", ns_a, ns_b, p1, p1b, p2, p2b);
	p1 = p1b > p1 ? p1b : p1;
	p2 = p2b > p2 ? p2b : p2;
	printf("remote fetches into B's dram (acquire: a view of the replica), then gets (the same\n"
	       "plus the copy to the client); each value is fetched once; daemons run their defaults\n"
	       "(%s pages; their tiers faulted in first, which took %.1f s);\n"
	       "tcp: the same values asked for and sent one at a time over a plain TCP connection\n"
	       "(each value in a place of its own on both sides, as in a node's memory);\n"
	       "tcp+sum: the same with the transfer checksum (%s) hashed and checked as a node does;\n"
	       "tcp+sum+copy: and the receiver copying each value once more (below);\n"
	       "batch: kvc_batch_get_into of 64 keys a call at 64 KiB (one layer's blocks of a\n"
	       "1024-token prompt), 16 MiB a call above (at least 4 keys);\n"
	       "TCP congestion control: the system's is %s; nodes and plain TCP run %s\n"
	       "(--peer-tcp-congestion auto);\n"
	       "medians of %u rounds (ranges below); /tcp and /t+s: medians of each round's ratio\n",
	       node_huge ? "2 MiB" : "4 KiB", prefault_s, csum_impl(), cc_system, cc_peers, arg_rounds);
	printf("%-6s %6s %10s %10s %10s %7s %5s %5s %10s %5s %10s %7s %5s %10s %7s\n", "size",
	       "values", "tcp", "tcp+sum", "acquire", "/iperf3", "/tcp", "/t+s", "2 clients", "/-P2",
	       "get", "/iperf3", "/tcp", "batch", "/iperf3");
	for (size_t i = 0; i < ns; i++) {
		uint64_t size = sizes[i], n = (UINT64_C(384) << 20) / size;
		double t = fig_med(&tcp[i]), ts = fig_med(&tcs[i]), a = fig_med(&g1[i]),
		       b = fig_med(&g2[i]), c = fig_med(&g3[i]), d = fig_med(&g4[i]);
		char name[16];

		if (n > 4096)
			n = 4096;
		if (n < 8)
			n = 8;
		size_name(name, sizeof(name), size);
		printf("%-6s %6" PRIu64 " %5.2f GB/s %5.2f GB/s %5.2f GB/s %6.0f%% %4.0f%% %4.0f%% "
		       "%5.2f GB/s %4.0f%% %5.2f GB/s %6.0f%% %4.0f%% %5.2f GB/s %6.0f%%\n", name, n,
		       t, ts, a, 100 * a / p1, 100 * fig_med(&rat_at[i]), 100 * fig_med(&rat_as[i]),
		       b, 100 * b / p2, c, 100 * c / p1, 100 * fig_med(&rat_gt[i]), d, 100 * d / p1);
		plot_add(&chart, "remote fetch", "GB/s", false, "acquire, 1 client", false,
			 (double) size, a);
		plot_add(&chart, "remote fetch", "GB/s", false, "acquire, 2 clients", false,
			 (double) size, b);
		plot_add(&chart, "remote fetch", "GB/s", false, "get, 1 client", false, (double) size,
			 c);
		plot_add(&chart, "remote fetch", "GB/s", false, "batch_get_into, 1 client", false,
			 (double) size, d);
		plot_add(&chart, "remote fetch", "GB/s", false, "plain TCP, one at a time (this run)",
			 true, (double) size, t);
		plot_add(&chart, "remote fetch", "GB/s", false,
			 "plain TCP with the checksum (this run)", true, (double) size, ts);
		plot_add(&chart, "remote fetch", "GB/s", false, "iperf3 (this run)", true,
			 (double) size, p1);
		plot_add(&chart, "remote fetch", "GB/s", false, "iperf3 -P2 (this run)", true,
			 (double) size, p2);
	}
	for (size_t i = 0; i < ns; i++) {
		char name[16];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s GB/s:", name);
		fig_range("tcp", &tcp[i]);
		fig_range("tcp+sum", &tcs[i]);
		fig_range("tcp+sum+copy", &tcc[i]);
		fig_range("stream", &tst[i]);
		fig_range("acquire", &g1[i]);
		fig_range("2 clients", &g2[i]);
		fig_range("get", &g3[i]);
		fig_range("batch", &g4[i]);
		printf("\n");
	}
	printf("against tcp+sum+copy (plain TCP with the checksum, the receiver copying each value\n"
	       "once more, as a node copies to its client: where one host's CPUs carry both ends,\n"
	       "the most a get or a batch load can reach; medians of each round's ratio):\n");
	for (size_t i = 0; i < ns; i++) {
		char name[16];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s tcp+sum+copy %5.2f GB/s (%.0f%% of iperf3): get %.0f%%, batch %.0f%%\n",
		       name, fig_med(&tcc[i]), 100 * fig_med(&tcc[i]) / p1,
		       100 * fig_med(&rat_gc[i]), 100 * fig_med(&rat_bc[i]));
	}
	printf("against stream (the same, but the values asked for as batch asks them, %u at\n"
	       "64 KiB, in one write, and A sending checksums known before: a batch load's work with\n"
	       "no node between; iperf3 sends one buffer again and again, which stays in cache,\n"
	       "where these place each value in memory of its own, as a node does):\n",
	       batch_keys(64u << 10));
	for (size_t i = 0; i < ns; i++) {
		char name[16];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s stream %5.2f GB/s (%.0f%% of iperf3), %u a write: batch %.0f%%\n", name,
		       fig_med(&tst[i]), 100 * fig_med(&tst[i]) / p1, batch_keys(sizes[i]),
		       100 * fig_med(&rat_bs[i]));
	}
	printf("where a single client's acquires went, per value (us): B's fetch phase by phase\n"
	       "(kvcachectl stats, remote_fetch_*_us: finding the holder and a place, waiting for a\n"
	       "data thread, the holder's answer, the bytes until checked, B's loop taking it in),\n"
	       "and the client's wall time per value:\n");
	for (size_t i = 0; i < ns; i++) {
		char name[16];
		const struct phases *ph = &ph1[i];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s", name);
		for (size_t k = 0; k < N_PHASES; k++)
			printf(" %s %.0f", phase_names[k],
			       ph->timed ? (double) ph->us[k] / (double) ph->timed : 0.0);
		printf("; wall %.0f (%" PRIu64 " of %" PRIu64 " timed)\n",
		       ph->values ? ph->wall_us / (double) ph->values : 0.0, ph->timed, ph->values);
	}
	printf("acquired again after B dropped its replicas (A knows every checksum now; the first "
	       "time, those not yet taken ahead were hashed as they were sent):\n");
	for (size_t i = 0; i < ns; i++) {
		char name[16];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s %5.2f GB/s (%.0f%% of the first acquire, %.0f%% of tcp+sum; %.2f-%.2f)\n",
		       name, fig_med(&g5[i]), 100 * fig_med(&g5[i]) / fig_med(&g1[i]),
		       100 * fig_med(&g5[i]) / fig_med(&tcs[i]), fig_min(&g5[i]), fig_max(&g5[i]));
	}
	printf("gets by a client whose mappings the library warmed first (a long-lived engine; "
	       "the get above is a fresh one's):\n");
	for (size_t i = 0; i < ns; i++) {
		char name[16];

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s %5.2f GB/s (%.0f%% of iperf3, %.0f%% of acquire; %.2f-%.2f)\n", name,
		       fig_med(&g6[i]), 100 * fig_med(&g6[i]) / p1,
		       100 * fig_med(&g6[i]) / fig_med(&g1[i]), fig_min(&g6[i]), fig_max(&g6[i]));
	}
	plot_finish(&chart, "kvcache-bench cluster");
	remote_lookups(sa, sb);
	printf("pushes A->B (puts on A with push_to B, until B holds them all), medians of %u "
	       "rounds;\n  a fresh client, then one whose mappings the library warmed first (a "
	       "long-lived prefill),\n  then a fresh client storing %d keys a call "
	       "(kvc_batch_put: a prefill storing a layer's blocks):\n", arg_rounds, PUSH_BATCH);
	for (unsigned r = 0; r < arg_rounds; r++)
		for (size_t i = 0; i < ns; i++) {
			uint64_t n = (UINT64_C(256) << 20) / sizes[i];

			if (n > 2048)
				n = 2048;
			if (n < 8)
				n = 8;
			push[i].v[push[i].n++] = push_rate(sa, sb, sizes[i], n);
			clear_nodes(sa, sb);
			pushw[i].v[pushw[i].n++] = push_rate_as(sa, sb, sizes[i], n, true, 1);
			clear_nodes(sa, sb);
			pushb[i].v[pushb[i].n++] = push_rate_as(sa, sb, sizes[i], n, false,
								PUSH_BATCH);
			clear_nodes(sa, sb);
		}
	for (size_t i = 0; i < ns; i++) {
		uint64_t n = (UINT64_C(256) << 20) / sizes[i];
		double g = fig_med(&push[i]), w = fig_med(&pushw[i]), bt = fig_med(&pushb[i]);
		char name[16];

		if (n > 2048)
			n = 2048;
		if (n < 8)
			n = 8;
		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s %7" PRIu64 " %6.2f GB/s %6.0f%% of iperf3 (%.2f-%.2f); warm %.2f GB/s "
		       "%3.0f%% (%.2f-%.2f); batches %.2f GB/s %3.0f%% (%.2f-%.2f)\n", name, n, g,
		       100 * g / p1, fig_min(&push[i]), fig_max(&push[i]), w, 100 * w / p1,
		       fig_min(&pushw[i]), fig_max(&pushw[i]), bt, 100 * bt / p1, fig_min(&pushb[i]),
		       fig_max(&pushb[i]));
		/* a push also copies each byte once more (the put into A's
		 * memory) on the same CPUs */
		printf("%-6s         of tcp+sum+copy: %.0f%% fresh, %.0f%% warm, %.0f%% batches\n",
		       name, 100 * g / fig_med(&tcc[i]), 100 * w / fig_med(&tcc[i]),
		       100 * bt / fig_med(&tcc[i]));
	}
	local_while_remote(sa, sb);
	loop_figures("A", sa);
	loop_figures("B", sb);
	teardown();
	rmdir(tmpdir);
	return 0;
}

/*
 * kvcache-bench rdma: the same remote fetches (acquire, one client, each
 * value once) and pushes between the two hosts, first over the TCP
 * transport, then over the RDMA path with UCX on its tcp transport (no
 * verbs device here: this measures the path's overhead, not RDMA), in one
 * run; and what one transfer costs on each.
 */
int run_rdma(void)
{
	static const uint64_t dflt[] = { 64 << 10, 1 << 20, 16 << 20 };
	bool given = !(n_sizes == 5 && arg_sizes[0] == 4096);
	const uint64_t *sizes = given ? arg_sizes : dflt;
	size_t ns = given ? n_sizes : 3;
	double fetch[2][MAX_SIZES], push[2][MAX_SIZES];
	uint64_t count[MAX_SIZES];
	char sa[256], sb[256];

	hosts_up();
	for (int t = 0; t < 2; t++) {
		struct kvc_client *b;

		daemons_up(sa, sb, t == 1);
		for (size_t i = 0; i < ns; i++) {
			uint64_t n = (UINT64_C(256) << 20) / sizes[i];
			char name[16], p[32];

			n = n > 2048 ? 2048 : n < 8 ? 8 : n;
			count[i] = n;
			size_name(name, sizeof(name), sizes[i]);
			snprintf(p, sizeof(p), "%s-%s", t ? "rdma" : "tcp", name);
			fetch[t][i] = remote_gets(sa, sb, p, sizes[i], n, 1, true, false);
			push[t][i] = push_rate(sa, sb, sizes[i], n > 512 ? 512 : n);
			clear_nodes(sa, sb);
		}
		check(kvc_connect(sb, &b), "connect B");
		if (t == 1 && counter(b, "rdma_gets") == 0)
			die(0, "%s", "B fetched nothing by RDMA: is this kvcached built with UCX?");
		if (t == 0 && counter(b, "rdma_gets") != 0)
			die(0, "%s", "B used RDMA in the tcp run");
		kvc_disconnect(b);
		daemons_down();
	}
	printf("kvcache-bench rdma: hosts %s and %s over a veth pair; the RDMA path runs on UCX's\n"
	       "tcp transport here (no verbs device), so this is its overhead, not RDMA's speed\n",
	       ns_a, ns_b);
	printf("%-6s %6s %11s %11s %6s %12s %12s %9s %11s %11s %6s\n", "size", "values", "fetch tcp",
	       "fetch ucx", "ucx/tcp", "us/fetch tcp", "us/fetch ucx", "overhead", "push tcp",
	       "push ucx", "ucx/tcp");
	for (size_t i = 0; i < ns; i++) {
		char name[16];
		double us_tcp = (double) sizes[i] / fetch[0][i] / 1e3;
		double us_ucx = (double) sizes[i] / fetch[1][i] / 1e3;

		size_name(name, sizeof(name), sizes[i]);
		printf("%-6s %6" PRIu64 " %6.2f GB/s %6.2f GB/s %6.2f %12.1f %12.1f %6.1f us "
		       "%6.2f GB/s %6.2f GB/s %6.2f\n", name, count[i], fetch[0][i], fetch[1][i],
		       fetch[1][i] / fetch[0][i], us_tcp, us_ucx, us_ucx - us_tcp, push[0][i],
		       push[1][i], push[1][i] / push[0][i]);
	}
	teardown();
	rmdir(tmpdir);
	return 0;
}
