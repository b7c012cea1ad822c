/* SPDX-License-Identifier: MIT */
/*
 * One peer connection's bytes: frames in, frames out, over a non-blocking
 * socket.  The caller's loop watches the fd and calls pconn_read() when it
 * is readable and pconn_flush() when it is writable (pconn_wants_write()).
 * Nothing here blocks, logs or interprets a message.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "peer-wire.h"

struct pconn {
	int fd;
	uint8_t *in;
	size_t in_len, in_cap, in_off;
	uint8_t *out;
	size_t out_len, out_off, out_cap;
	size_t max_out;     /* queued bytes beyond this: -ENOBUFS */
	size_t max_in;      /* the largest frame payload taken (PEER_MAX_PAYLOAD) */
	uint8_t their_major; /* after -EPROTONOSUPPORT: the major its frame had */
};

void pconn_init(struct pconn *c, int fd, size_t max_out);
/* Frames in of at most max payload bytes (a larger header: -EMSGSIZE),
 * and so at most twice that read ahead of what is taken: a connection
 * whose frames are small reads little of raw bytes that may follow one. */
void pconn_limit_in(struct pconn *c, size_t max);
/* Frees the buffers and closes the fd. */
void pconn_done(struct pconn *c);
/* Read what the socket has: 0, -ECONNRESET at end of stream, or -errno. */
int pconn_read(struct pconn *c);
/* The next whole frame read: 1 with *ret_hdr and *ret_payload (valid until
 * the next pconn_read()), 0 when none is complete, or -EPROTO/-EMSGSIZE
 * from the header (the connection is then beyond repair). */
int pconn_next(struct pconn *c, struct peer_hdr *ret_hdr, const uint8_t **ret_payload);
/* Queue one frame and try to send it. */
int pconn_send(struct pconn *c, uint8_t type, uint32_t seq, const ProtobufCMessage *msg);
/* Queue one frame only: pconn_flush() sends what is queued, several
 * frames in one system call. */
int pconn_queue(struct pconn *c, uint8_t type, uint32_t seq, const ProtobufCMessage *msg);
/* After -EPROTONOSUPPORT: tell the other side, in this side's major, why
 * it is refused (a HelloAck with the error), as far as the socket takes it
 * now; the caller closes. */
void pconn_refuse_version(struct pconn *c);
/* Send what is queued: 0 (all sent or the socket is full) or -errno. */
int pconn_flush(struct pconn *c);
bool pconn_wants_write(const struct pconn *c);

/*
 * Connections yet to prove themselves (no Hello yet, or no proof of the
 * secret) are budgeted by where they come from: at most HS_PER_SOURCE from
 * one address, so a flood from one host closes its own oldest, never a
 * real peer's, whose Hello comes at once.  The address (IPv4 as
 * v4-mapped IPv6; all zero when it cannot be had) is taken at accept.
 */
#define HS_PER_SOURCE 16

struct hs_source {
	uint8_t a[16];
};

void hs_source_of(int fd, struct hs_source *ret);
bool hs_source_eq(const struct hs_source *x, const struct hs_source *y);
