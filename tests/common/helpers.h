/* SPDX-License-Identifier: MIT */
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define EXIT_SKIP 77

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                               \
			abort();                                                      \
		}                                                                     \
	} while (0)

#define CHECK_EQ(a, b)                                                                   \
	do {                                                                             \
		long long _a = (long long) (a), _b = (long long) (b);                    \
		if (_a != _b) {                                                          \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, \
				__LINE__, #a, _a, #b, _b);                               \
			abort();                                                         \
		}                                                                        \
	} while (0)

/* A private kvcached on a socket in its own temporary directory. */
struct test_daemon {
	pid_t pid;
	char dir[64];
	char socket[100];
};

/* Start kvcached (from $KVCACHED) with the given extra arguments (NULL
 * terminated) and wait until it accepts connections. */
void test_daemon_start(struct test_daemon *td, ...);
/* Start with an explicit argv after the binary; returns the pid without
 * waiting for readiness. */
pid_t test_spawn(const char *bin, char *const argv[], const char *log);
/* SIGTERM, wait, check a clean exit and that the socket file is gone. */
void test_daemon_stop(struct test_daemon *td);
/* Wait for a process; returns its exit status, or 128 + signal. */
int test_wait(pid_t pid);
bool test_socket_ready(const char *path);

/* Deterministic bytes for (seed, offset): every byte checks the key it
 * belongs to. */
void test_fill(void *buf, size_t len, uint64_t seed);
bool test_verify(const void *buf, size_t len, uint64_t seed);
uint64_t test_rand(uint64_t *state);

/* Counter by name from kvc_stats_get(). */
struct kvc_client;
uint64_t test_counter(struct kvc_client *c, const char *name);
uint64_t test_tier_used(struct kvc_client *c, const char *tier);
/* Wait (up to 60 s) until the daemon has indexed its disk records. */
void test_wait_recovered(const char *socket);
