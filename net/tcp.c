/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"

int net_addr_parse(const char *s, uint16_t default_port, struct net_addr *ret)
{
	struct net_addr a = { 0 };
	const char *colon, *host = s, *port = NULL;
	size_t hlen;

	if (!s || !*s)
		return -EINVAL;
	if (*s == '[') {
		const char *end = strchr(s, ']');

		if (!end || (end[1] && end[1] != ':'))
			return -EINVAL;
		host = s + 1;
		hlen = (size_t) (end - host);
		port = end[1] ? end + 2 : NULL;
	} else if ((colon = strrchr(s, ':')) && colon == strchr(s, ':')) {
		hlen = (size_t) (colon - s);
		port = colon + 1;
	} else if (strspn(s, "0123456789") == strlen(s)) {
		hlen = 0;
		port = s;
	} else if (strchr(s, ':')) {
		return -EINVAL; /* a bare IPv6 address needs brackets */
	} else
		hlen = strlen(s);
	if (hlen >= sizeof(a.host))
		return -EINVAL;
	memcpy(a.host, host, hlen);
	if (port) {
		char *end;
		unsigned long p;

		if (!*port || strspn(port, "0123456789") != strlen(port))
			return -EINVAL;
		errno = 0;
		p = strtoul(port, &end, 10);
		if (errno || p > 65535)
			return -EINVAL;
		a.port = (uint16_t) p;
	} else if (default_port)
		a.port = default_port;
	else
		return -EINVAL;
	*ret = a;
	return 0;
}

void net_addr_format(const struct net_addr *a, char *buf, size_t len)
{
	if (strchr(a->host, ':'))
		snprintf(buf, len, "[%s]:%u", a->host, a->port);
	else
		snprintf(buf, len, "%s:%u", a->host[0] ? a->host : "0.0.0.0", a->port);
}

bool net_addr_is_loopback(const struct net_addr *a)
{
	struct in_addr v4;
	struct in6_addr v6;

	if (!strcmp(a->host, "localhost"))
		return true;
	if (inet_pton(AF_INET, a->host, &v4) == 1)
		return (ntohl(v4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, a->host, &v6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&v6);
	return false;
}

static int resolve(const struct net_addr *a, bool passive, struct addrinfo **ret)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = passive ? AI_PASSIVE : 0 };
	char port[8];
	int r;

	snprintf(port, sizeof(port), "%u", a->port);
	r = getaddrinfo(a->host[0] ? a->host : NULL, port, &hints, ret);
	if (r == EAI_SYSTEM)
		return -errno;
	if (r != 0)
		return -EHOSTUNREACH;
	return 0;
}

int net_listen(const struct net_addr *a, int *ret_fd)
{
	struct addrinfo *ai, *p;
	int r, fd = -1, err = -EADDRNOTAVAIL, one = 1;

	r = resolve(a, true, &ai);
	if (r < 0)
		return r;
	for (p = ai; p; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 && listen(fd, 128) == 0)
			break;
		err = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return err;
	*ret_fd = fd;
	return 0;
}

int net_local_port(int fd, uint16_t *ret)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *) &ss, &len) < 0)
		return -errno;
	if (ss.ss_family == AF_INET)
		*ret = ntohs(((struct sockaddr_in *) &ss)->sin_port);
	else if (ss.ss_family == AF_INET6)
		*ret = ntohs(((struct sockaddr_in6 *) &ss)->sin6_port);
	else
		return -EAFNOSUPPORT;
	return 0;
}

int net_resolve(const struct net_addr *a, bool numeric_only, struct net_sockaddr *ret)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = numeric_only ? AI_NUMERICHOST : 0 };
	struct addrinfo *ai;
	char port[8];
	int r;

	snprintf(port, sizeof(port), "%u", a->port);
	r = getaddrinfo(a->host[0] ? a->host : NULL, port, &hints, &ai);
	if (r == EAI_NONAME && numeric_only)
		return -EAGAIN;
	if (r == EAI_SYSTEM)
		return -errno;
	if (r != 0)
		return -EHOSTUNREACH;
	if (ai->ai_addrlen > sizeof(ret->ss)) {
		freeaddrinfo(ai);
		return -EAFNOSUPPORT;
	}
	memcpy(&ret->ss, ai->ai_addr, ai->ai_addrlen);
	ret->len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

int net_connect_sa(const struct net_sockaddr *sa, int *ret_fd)
{
	int fd = socket(sa->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *) &sa->ss, sa->len) < 0 && errno != EINPROGRESS) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

int net_connect_start(const struct net_addr *a, int *ret_fd)
{
	struct net_sockaddr sa;
	int r = net_resolve(a, false, &sa);

	return r < 0 ? r : net_connect_sa(&sa, ret_fd);
}

int net_connect_result(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -errno;
	return -err;
}

void net_tune(int fd, int idle_s)
{
	int one = 1, idle = idle_s > 0 ? idle_s : 1, intvl = 1, cnt = 3;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* "auto" switches from BBR to cubic on paths shorter than this (us). */
#define AUTO_RTT_MAX_US 1000

/* The other end is on this host's loopback: a short path, whatever the
 * handshake took (on a busy host a loopback handshake took over 1 ms). */
static bool peer_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getpeername(fd, (struct sockaddr *) &ss, &len) < 0)
		return false;
	if (ss.ss_family == AF_INET)
		return (ntohl(((struct sockaddr_in *) &ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss.ss_family == AF_INET6) {
		const struct in6_addr *a = &((struct sockaddr_in6 *) &ss)->sin6_addr;

		return IN6_IS_ADDR_LOOPBACK(a) ||
		       (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return false;
}

int net_congestion(int fd, const char *name)
{
	char now[16] = "";
	socklen_t len = sizeof(now);

	if (!name || !*name || !strcmp(name, "system"))
		return 0;
	if (!strcmp(name, "auto")) {
		struct tcp_info ti;
		socklen_t tl = sizeof(ti);

		/* bbr, and its later versions by their names */
		if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, now, &len) < 0)
			return -errno;
		if (strncmp(now, "bbr", 3) != 0)
			return 0;
		/* a path as long as a millisecond (the handshake's round trip;
		 * 0 before one) keeps BBR, which copes with its losses where
		 * cubic stalls for whole timeouts */
		if (!peer_loopback(fd) && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
		    ti.tcpi_rtt >= AUTO_RTT_MAX_US)
			return 0;
		name = "cubic";
	}
	if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t) strlen(name)) < 0)
		return -errno;
	return 0;
}
