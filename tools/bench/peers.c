/* SPDX-License-Identifier: MIT */
/* kvcache-bench: memcached (meta protocol) and Redis over Unix sockets, the same workload. */
#include "bench.h"

/* ---- peers: memcached (meta protocol) and Redis, over Unix sockets ---- */


static int unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

bool peer_start(struct peer *p, char *const argv[])
{
	p->pid = fork();
	if (p->pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		dup2(devnull, 1);
		dup2(devnull, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	for (int i = 0; i < 300; i++) {
		int st;

		p->fd = unix_connect(p->sock);
		if (p->fd >= 0)
			break;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return false;
		}
		usleep(10000);
	}
	if (p->fd < 0)
		return false;
	p->rcap = (32u << 20) + 4096;
	p->rbuf = malloc(p->rcap);
	return p->rbuf != NULL;
}

void peer_stop(struct peer *p)
{
	if (p->fd >= 0)
		close(p->fd);
	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, NULL, 0);
	}
	free(p->rbuf);
}

static void send_all(struct peer *p, struct iovec *iov, int n)
{
	while (n > 0) {
		ssize_t w = writev(p->fd, iov, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			die(0, "%s: write failed", p->name);
		}
		while (n > 0 && (size_t) w >= iov->iov_len) {
			w -= (ssize_t) iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (uint8_t *) iov->iov_base + w;
			iov->iov_len -= (size_t) w;
		}
	}
}

/* Make at least `need` buffered bytes available from roff. */
static void fill(struct peer *p, size_t need)
{
	if (p->roff && p->rlen - p->roff < need) {
		memmove(p->rbuf, p->rbuf + p->roff, p->rlen - p->roff);
		p->rlen -= p->roff;
		p->roff = 0;
	}
	while (p->rlen - p->roff < need) {
		ssize_t n = read(p->fd, p->rbuf + p->rlen, p->rcap - p->rlen);

		if (n <= 0)
			die(0, "%s: connection lost", p->name);
		p->rlen += (size_t) n;
	}
}

/* A CRLF-terminated line, returned NUL-terminated (without CRLF). */
static char *read_line(struct peer *p)
{
	for (size_t scan = 0;; ) {
		char *e;

		fill(p, scan + 1);
		e = memchr(p->rbuf + p->roff + scan, '\n', p->rlen - p->roff - scan);
		if (e) {
			char *line = (char *) p->rbuf + p->roff;

			*e = '\0';
			if (e > line && e[-1] == '\r')
				e[-1] = '\0';
			p->roff = (size_t) ((uint8_t *) e - p->rbuf) + 1;
			return line;
		}
		scan = p->rlen - p->roff;
	}
}

static void read_data(struct peer *p, void *dst, size_t len)
{
	fill(p, len + 2);
	memcpy(dst, p->rbuf + p->roff, len);
	p->roff += len + 2;
	if (p->roff == p->rlen)
		p->roff = p->rlen = 0;
}


void mc_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len,
		  void *dst)
{
	char hdr[256];
	struct iovec iov[3];
	char *l;
	int n;

	if (op == P_PUT) {
		n = snprintf(hdr, sizeof(hdr), "ms %s %zu T0\r\n", key, len);
		iov[0] = (struct iovec) { hdr, (size_t) n };
		iov[1] = (struct iovec) { (void *) val, len };
		iov[2] = (struct iovec) { (void *) "\r\n", 2 };
		send_all(p, iov, 3);
		l = read_line(p);
		if (strncmp(l, "HD", 2) != 0)
			die(0, "memcached: ms answered %s", l);
		return;
	}
	n = snprintf(hdr, sizeof(hdr), "mg %s%s\r\n", key, op == P_GET ? " v" : "");
	iov[0] = (struct iovec) { hdr, (size_t) n };
	send_all(p, iov, 1);
	l = read_line(p);
	if (op == P_EXISTS) {
		if (strncmp(l, "HD", 2) != 0)
			die(0, "memcached: mg answered %s", l);
		return;
	}
	if (strncmp(l, "VA ", 3) != 0 || (size_t) atol(l + 3) != len)
		die(0, "memcached: mg answered %s", l);
	read_data(p, dst, len);
}

void redis_op(struct peer *p, enum peer_op op, const char *key, const void *val, size_t len,
		     void *dst)
{
	char hdr[512];
	struct iovec iov[3];
	size_t kl = strlen(key);
	char *l;
	int n;

	if (op == P_PUT) {
		n = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", kl, key, len);
		iov[0] = (struct iovec) { hdr, (size_t) n };
		iov[1] = (struct iovec) { (void *) val, len };
		iov[2] = (struct iovec) { (void *) "\r\n", 2 };
		send_all(p, iov, 3);
		l = read_line(p);
		if (strcmp(l, "+OK") != 0)
			die(0, "redis: SET answered %s", l);
		return;
	}
	n = snprintf(hdr, sizeof(hdr), "*2\r\n$%s\r\n%s\r\n$%zu\r\n%s\r\n", op == P_GET ? "3" : "6",
		     op == P_GET ? "GET" : "EXISTS", kl, key);
	iov[0] = (struct iovec) { hdr, (size_t) n };
	send_all(p, iov, 1);
	l = read_line(p);
	if (op == P_EXISTS) {
		if (strcmp(l, ":1") != 0)
			die(0, "redis: EXISTS answered %s", l);
		return;
	}
	if (l[0] != '$' || (size_t) atol(l + 1) != len)
		die(0, "redis: GET answered %s", l);
	read_data(p, dst, len);
}


void bench_peer(struct peer *p, peer_fn fn, enum peer_op op, uint64_t size, uint8_t *src,
		       uint8_t *dst, struct counters *k, struct result *r)
{
	char key[128];
	uint64_t n_keys = 64;

	*r = (struct result) { .op = op == P_PUT ? "put" : op == P_GET ? "get" : "exists",
			       .size = op == P_EXISTS ? 0 : size };
	for (uint64_t i = 0; i < n_keys; i++) {
		make_key(key, sizeof(key), "peer", size, i);
		fn(p, P_PUT, key, src, op == P_EXISTS ? 1 : size, NULL);
	}
	if (op == P_PUT)
		TIMED_LOOP(r, k, {
			make_key(key, sizeof(key), "peer", size, i % n_keys);
			fn(p, P_PUT, key, src, size, NULL);
		});
	else
		TIMED_LOOP(r, k, {
			make_key(key, sizeof(key), "peer", size, i % n_keys);
			fn(p, op, key, NULL, op == P_EXISTS ? 1 : size, dst);
		});
}
