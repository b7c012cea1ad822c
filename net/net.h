/* SPDX-License-Identifier: MIT */
/*
 * TCP plumbing for daemons and masters: addresses, listening, connecting
 * without blocking.  A library: returns -errno, never logs, owns no loop;
 * callers register the fds with their own.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NET_HOST_MAX 256

struct net_addr {
	char host[NET_HOST_MAX]; /* a name or a numeric address; "" = any */
	uint16_t port;
};

/* "HOST:PORT", "PORT", ":PORT" or "[V6]:PORT"; default_port where none is
 * given (0: a port is required).  -EINVAL with nothing changed on a bad one. */
int net_addr_parse(const char *s, uint16_t default_port, struct net_addr *ret);
/* "HOST:PORT" (brackets around IPv6). */
void net_addr_format(const struct net_addr *a, char *buf, size_t len);
/* True when a is a loopback address (127.0.0.0/8, ::1, "localhost"). */
bool net_addr_is_loopback(const struct net_addr *a);

/* An address resolved (the first getaddrinfo() gives). */
struct net_sockaddr {
	struct sockaddr_storage ss;
	socklen_t len;
};

/* a's address: with numeric_only, only from a numeric host (never a name
 * lookup: -EAGAIN for a name), else by getaddrinfo(), which may wait for
 * DNS for seconds: never on a loop thread. */
int net_resolve(const struct net_addr *a, bool numeric_only, struct net_sockaddr *ret);
/* net_connect_start() to an address resolved already. */
int net_connect_sa(const struct net_sockaddr *sa, int *ret_fd);

/* A non-blocking listening socket (SO_REUSEADDR, close-on-exec). */
int net_listen(const struct net_addr *a, int *ret_fd);
/* The port a listening socket got (for port 0). */
int net_local_port(int fd, uint16_t *ret);
/* Start a non-blocking connect: 0 with *ret_fd (connecting or connected:
 * wait for writability, then net_connect_result()), or -errno. */
int net_connect_start(const struct net_addr *a, int *ret_fd);
/* 0 once connected, -errno if it failed. */
int net_connect_result(int fd);
/* TCP_NODELAY and keepalive probes after idle_s seconds. */
void net_tune(int fd, int idle_s);
/* A connected fd's congestion control: name; "auto": cubic where the
 * system's is BBR and the handshake's round trip was under 1 ms (why:
 * docs/cluster.rst), else the system's; "system" or "": the system's.  0
 * or -errno (-ENOENT: not available, -EPERM: not allowed). */
int net_congestion(int fd, const char *name);
