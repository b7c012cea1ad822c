/* SPDX-License-Identifier: MIT */
/*
 * Frame layer between daemons and masters (docs/cluster.rst).
 *
 * Unlike the local socket these frames cross machines: the 16-byte header
 * is little-endian whatever the host, carries no file descriptors, and
 * answers are matched to requests by seq, not by order.  Everything a peer
 * sends is untrusted: peer_hdr_decode() and the unpack helpers check every
 * length and count before anyone uses them.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "peer.pb-c.h"

#define PEER_MAGIC 0x504bu /* "KP" */
#define PEER_MAJOR 1
#define PEER_MINOR 2
/* The major this process speaks and takes: PEER_MAJOR (a test makes an
 * incompatible peer with KVCACHE_TEST_PEER_MAJOR).  Peers of another major
 * are refused at their first frame, loudly (-EPROTONOSUPPORT); minors
 * work together through feature bits. */
extern uint8_t peer_major;
#define PEER_HDR_SIZE 16u
#define PEER_MAX_PAYLOAD (4u << 20)  /* one control frame */
#define PEER_MAX_KEY 511u
#define PEER_MAX_BATCH 4096u         /* keys in one publish, withdraw or lookup */
#define PEER_MAX_MEMBERS 4096u
#define PEER_MAX_ID 255u             /* node ids, addresses, messages */
#define PEER_NONCE_SIZE 16u
#define PEER_PROOF_SIZE 32u
#define PEER_MAX_OBJECT (UINT64_C(1) << 40) /* one value on the wire */

enum peer_type {
	PEER_HELLO = 1,
	PEER_HELLO_ACK = 2,
	PEER_JOIN = 3,
	PEER_MEMBERS = 4,    /* answers Join and Heartbeat */
	PEER_HEARTBEAT = 5,
	PEER_PUBLISH = 6,    /* no answer */
	PEER_WITHDRAW = 7,   /* no answer */
	PEER_LOOKUP = 8,
	PEER_LOOKUP_RESP = 9,
	PEER_FETCH = 10,     /* node to node */
	PEER_FETCH_RESP = 11, /* followed by FetchResp.len raw bytes */
	PEER_AUTH = 12,      /* the Hello side's proof of the secret */
	PEER_PUSH = 13,      /* node to node */
	PEER_PUSH_READY = 14, /* PushReply: send the bytes (or not) */
	PEER_PUSH_DONE = 15, /* PushReply: stored (or not) */
	PEER_FETCH_DONE = 16, /* FetchDone: an object read by RDMA may go */
	PEER_RDMA_INFO = 17, /* RdmaInfo: after authentication, with PEER_FEAT_RDMA */
	PEER_REMOVE = 18,    /* node to master, no answer (PEER_FEAT_VERSIONS) */
	PEER_DROP = 19,      /* master to node, no answer (PEER_FEAT_VERSIONS) */
	PEER_TYPE_MAX = 19,
};

enum peer_role {
	PEER_ROLE_NODE = 1,
	PEER_ROLE_MASTER = 2,
	PEER_ROLE_TOOL = 3,
};

enum peer_state {
	PEER_STATE_UP = 1,
	PEER_STATE_SUSPECT = 2, /* silent for more than a third of the TTL */
	PEER_STATE_DOWN = 3,
};

#define PEER_FEAT_TCP (1u << 0)
#define PEER_FEAT_RDMA (1u << 1)  /* one-sided reads of the pool (UCX) */
#define PEER_FEAT_EAGER_PUSH (1u << 2) /* Push.eager (Join/Member only) */
#define PEER_FEAT_PENDING (1u << 3) /* Entry.pending, Location.pending (Hello/HelloAck) */
#define PEER_FEAT_VERSIONS (1u << 4) /* Entry/FetchResp/Push.version, Remove, Drop (Hello/HelloAck) */
#define PEER_FEAT_KNOWN (PEER_FEAT_TCP | PEER_FEAT_RDMA | PEER_FEAT_PENDING | PEER_FEAT_VERSIONS)
#define PEER_EAGER_PUSH_MAX (4u << 20)
#define PEER_MAX_REGIONS 8u
#define PEER_MAX_RDMA_BLOB 4096u  /* a worker address or a packed rkey */

struct peer_hdr {
	uint8_t version; /* PEER_MAJOR */
	uint8_t type;    /* enum peer_type */
	uint32_t len;    /* payload bytes after the header */
	uint32_t seq;    /* echoed in the answer */
	uint32_t flags;  /* 0 in version 1 */
};

/* The 16 header bytes, little-endian: magic, version, type, len, seq, flags. */
void peer_hdr_encode(const struct peer_hdr *h, uint8_t out[PEER_HDR_SIZE]);
/* -EPROTO: bad magic, type or flags; -EPROTONOSUPPORT: a frame of another
 * major (ret->version says which); -EMSGSIZE: len > max_payload. */
int peer_hdr_decode(const uint8_t in[PEER_HDR_SIZE], size_t max_payload, struct peer_hdr *ret);

/* Header plus packed msg in one new buffer. */
int peer_frame_pack(uint8_t type, uint32_t seq, const ProtobufCMessage *msg, uint8_t **ret_buf,
		    size_t *ret_len);

/* Unpack the payload of a frame of type `type` and check it against the
 * limits above (keys 1..PEER_MAX_KEY bytes, counts, string lengths).
 * -EPROTO when it does not decode, -EINVAL when it breaks a limit.  The
 * message is freed with protobuf_c_message_free_unpacked(). */
int peer_msg_decode(uint8_t type, const uint8_t *payload, size_t len, ProtobufCMessage **ret);

/*
 * One frame's message decoded into an arena: what protobuf-c allocates for
 * it (a lookup's answer is half a dozen pieces a key) comes off one block,
 * and peer_arena_reset() gives it all back at once; the message is not
 * freed on its own.  The block grows to what the largest frame needed.
 */
struct peer_arena {
	ProtobufCAllocator alloc;
	uint8_t *block;
	size_t cap, used;
	struct peer_arena_more *more; /* beyond the block, until the reset */
	size_t more_bytes;
};

void peer_arena_init(struct peer_arena *ar);
void peer_arena_reset(struct peer_arena *ar);
void peer_arena_done(struct peer_arena *ar);
int peer_msg_decode_in(struct peer_arena *ar, uint8_t type, const uint8_t *payload, size_t len,
		       ProtobufCMessage **ret);

/* A key from the wire: 1..PEER_MAX_KEY bytes, no NUL inside. */
int peer_key_check(const ProtobufCBinaryData *key);
