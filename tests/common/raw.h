/* SPDX-License-Identifier: MIT */
/* A raw protocol client for tests that must send what libkvcache never would. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ring.h"
#include "wire.h"

int raw_connect(const char *socket_path);
void raw_send(int fd, uint16_t type, uint32_t len, const void *payload, size_t plen);
void raw_send_msg(int fd, uint16_t type, const ProtobufCMessage *m);
/* Read one frame: its type, or 0 on EOF.  Up to max_fds fds are stored in
 * fds (the rest closed); *ret_n_fds says how many. */
int raw_recv_fds(int fd, uint8_t **ret_payload, uint32_t *ret_len, int *fds, size_t max_fds,
		 size_t *ret_n_fds);
int raw_recv(int fd, uint8_t **ret_payload, uint32_t *ret_len);
/* Hello with this major; returns the Welcome's error (0 = accepted). */
int raw_hello(int fd, uint32_t major);

/* A channel opened by hand, to write into the rings what libkvcache never
 * would. */
struct raw_chan {
	int sock;
	uint8_t *base;
	struct ring_side sq, cq;
	uint8_t *arena;
	int efd;
};

void raw_chan_open(struct raw_chan *rc, const char *socket_path);
/* Submit one descriptor, ring, wait for its completion's result. */
int64_t raw_chan_call(struct raw_chan *rc, const struct shm_sqe *e);
