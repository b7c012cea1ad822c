/* SPDX-License-Identifier: MIT */
/*
 * Frame layer of the control socket.
 *
 * A frame is a fixed 16-byte header followed by `len` bytes of protobuf
 * payload.  File descriptors travel as SCM_RIGHTS ancillary data attached to
 * the first byte of the frame; the header says how many to expect so that a
 * receiver can tell a missing fd from a truncated control message.
 * Integers are in host byte order: the socket never leaves the machine.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvcache.pb-c.h"
#include "values.h"

#define KVC_PROTO_MAJOR 1
#define KVC_PROTO_MINOR 4 /* 1: SegmentInfo layout, StatusResp recovery, OP_REMOVE_PREFIX;
                           2: OP_CLUSTER, OP_WHERE, OP_PREFETCH,
                           OP_PUSH; 3: OP_ANNOUNCE; 4: OP_HANDOVER */

#define WIRE_MAGIC 0x4b56u /* "KV" */
#define WIRE_HDR_SIZE 16u
#define WIRE_MAX_PAYLOAD (4u << 20)
#define WIRE_MAX_FDS 16u
#define WIRE_MAX_KEY 511u /* bytes, excluding the terminating NUL */
#define WIRE_MAX_NODE 255u /* a node id, as PEER_MAX_ID */
#define WIRE_MAX_BATCH 4096u

enum wire_type {
	WIRE_HELLO = 1,
	WIRE_WELCOME = 2,
	WIRE_REQUEST = 3,
	WIRE_RESPONSE = 4,
};

struct wire_hdr {
	uint16_t magic;
	uint16_t type;
	uint32_t len;   /* payload bytes after the header */
	uint32_t seq;   /* echoed in the response */
	uint16_t n_fds; /* SCM_RIGHTS fds attached to this frame */
	uint16_t flags; /* must be 0 in protocol 1 */
};
_Static_assert(sizeof(struct wire_hdr) == WIRE_HDR_SIZE, "wire header size");

/* Check a received header: -EPROTO on bad magic/flags/fd count, -EMSGSIZE
 * when the payload is longer than max_payload. */
int wire_hdr_check(const struct wire_hdr *h, size_t max_payload);

/* Serialize `msg` behind a header into a newly allocated buffer. */
int wire_frame_pack(uint16_t type, uint32_t seq, uint16_t n_fds,
		    const ProtobufCMessage *msg, uint8_t **ret_buf, size_t *ret_len);

/* Parse one whole frame held in buf[0..len): header check, then payload
 * bounds.  On success *ret_payload points into buf. */
int wire_frame_parse(const uint8_t *buf, size_t len, struct wire_hdr *ret_hdr,
		     const uint8_t **ret_payload);

/* A key as it crosses the wire: 1..WIRE_MAX_KEY bytes, no NUL inside. */
int wire_key_check(const ProtobufCBinaryData *key);

/* Unpack and validate a Request payload: the op is known, the body matches
 * the op, every key and count is in bounds.  -EPROTO when the payload does not
 * decode, -EINVAL (with *ret_why set to a static string) when it decodes but
 * breaks a rule, -EOPNOTSUPP for an unknown op. */
int wire_request_decode(const uint8_t *payload, size_t len, Kvc__Request **ret,
			const char **ret_why);

/* Blocking helpers (client side and tools).  wire_send_all() sends the whole
 * buffer, attaching fds to the first sendmsg.  wire_recv_some() receives up
 * to len bytes and any fds; MSG_CTRUNC closes what arrived and fails with
 * -EPROTO. */
int wire_send_all(int fd, const void *buf, size_t len, const int *fds, size_t n_fds);
ssize_t wire_recv_some(int fd, void *buf, size_t len, int *fds, size_t max_fds,
		       size_t *ret_n_fds, int flags);
/* Exactly len bytes (-ECONNRESET at an end before them); the fds that come
 * with them are appended to fds[*n_fds..max_fds) (fds NULL: none
 * wanted). */
int wire_recv_exact(int fd, void *buf, size_t len, int *fds, size_t max_fds, size_t *n_fds);
