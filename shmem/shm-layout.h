/* SPDX-License-Identifier: MIT */
/*
 * Every structure that lives in shared memory.  Only fixed-width types, no
 * pointers: a segment is mapped at different addresses in every process, and
 * whatever a client writes here is untrusted input for the daemon.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define SHM_SEG_MAGIC UINT64_C(0x3147455343564b00) /* "\0KVCSEG1" */
#define SHM_LAYOUT_VERSION 1u
#define SHM_HEADER_SIZE 4096u /* data starts on the next 4 KiB page */
#define SHM_HUGEPAGE_SIZE (2u << 20)

enum shm_tier {
	SHM_TIER_DEVICE = 1,
	SHM_TIER_DRAM = 2,
	SHM_TIER_DISK = 3,
};

enum shm_seg_flags {
	SHM_SEG_HUGEPAGES = 1u << 0,
};

/* At offset 0 of every segment, written once by the daemon before the fd is
 * handed out.  Clients check magic, layout_version and size before use. */
struct shm_seg_header {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t header_size;  /* == SHM_HEADER_SIZE */
	uint64_t generation;   /* changes whenever the daemon restarts */
	uint64_t size;         /* bytes in the memfd */
	uint64_t data_offset;  /* first byte handed to the allocator */
	uint32_t tier;         /* enum shm_tier */
	uint32_t flags;        /* enum shm_seg_flags */
	uint32_t index;        /* the daemon's segment number */
	uint32_t daemon_pid;
	uint8_t reserved[72];
};
_Static_assert(sizeof(struct shm_seg_header) == 128, "segment header size");
_Static_assert(offsetof(struct shm_seg_header, generation) == 16, "header layout");
_Static_assert(offsetof(struct shm_seg_header, tier) == 40, "header layout");

/*
 * Progress words, in the rest of a memory segment's header page: the daemon
 * advances one as an object from another node lands in that segment, so a
 * client that asked with SHM_SQE_STREAM copies behind the bytes instead of
 * after them.  Written by the daemon only; a client reads them, never
 * trusts them beyond its own mapping.  A word:
 *   bit 63      set once the bytes start over (another holder, or again on
 *               a new connection): what was read so far is void
 *   bits 40-62  the landing's generation (the completion with SHM_CQE_MORE
 *               names it with the slot); any other: the slot moved on
 *   bits 0-39   bytes in, from the start of the landing
 */
#define SHM_SEG_PROGRESS_OFF 2048u
#define SHM_SEG_PROGRESS_SLOTS 256u
#define SHM_PROGRESS_RESTART (UINT64_C(1) << 63)
#define SHM_PROGRESS_GEN_SHIFT 40
#define SHM_PROGRESS_GEN_MAX ((UINT32_C(1) << 23) - 1)
#define SHM_PROGRESS_BYTES ((UINT64_C(1) << SHM_PROGRESS_GEN_SHIFT) - 1)
_Static_assert(SHM_SEG_PROGRESS_OFF >= sizeof(struct shm_seg_header) &&
		       SHM_SEG_PROGRESS_OFF + SHM_SEG_PROGRESS_SLOTS * 8 <= SHM_HEADER_SIZE,
	       "progress words in the header page");

/*
 * A channel: one client's submission ring (client -> daemon) and completion
 * ring (daemon -> client) of fixed-size descriptors, plus an arena where the
 * client puts keys, key lists and result arrays that descriptors point at by
 * offset.  One memfd per channel, mapped by the daemon and that client only.
 *
 *   [header 4 KiB][sq ring][cq ring][sqes][cqes][arena]
 *
 * Ownership of every field, and so who may trust it:
 *   sq.tail, sqes, arena      written by the client; the daemon copies and
 *                             checks each descriptor before use.
 *   sq.head, cq.tail, cqes    written by the daemon.
 *   cq.head                   written by the client.
 *   sq.need_wakeup            daemon: "I am going to sleep, ring the eventfd".
 *   cq.need_wakeup            client: "I am going to sleep on cq.futex".
 *   sq.cpu                    client: 1 + the CPU it last submitted from
 *                             (0: not said); a hint (see channel.c).
 * The daemon keeps its own copies of sq.head and cq.tail and never reads them
 * back, so a client scribbling over them only confuses itself.
 */

#define SHM_CHAN_MAGIC UINT64_C(0x314e414843564b00) /* "\0KVCHAN1" */
#define SHM_CHAN_VERSION 1u
#define SHM_CHAN_ENTRIES 256u          /* power of two */
#define SHM_CHAN_ARENA_SLOT 8192u      /* arena bytes per in-flight request */
#define SHM_CHAN_HEADER_SIZE 4096u

struct shm_ring {
	_Alignas(64) uint32_t head; /* consumer's position */
	uint8_t pad0[60];
	_Alignas(64) uint32_t tail; /* producer's position */
	uint8_t pad1[60];
	_Alignas(64) uint32_t need_wakeup;
	uint32_t futex;             /* bumped and woken by the producer (cq only) */
	uint32_t cpu;               /* sq only: see above */
	/* cq only: how many of the channel's requests wait on another node,
	 * as the daemon last counted (the client spins less while any do) */
	uint32_t far;
	uint8_t pad2[48];
};
_Static_assert(sizeof(struct shm_ring) == 192, "ring size");
_Static_assert(offsetof(struct shm_ring, tail) == 64, "ring layout");
_Static_assert(offsetof(struct shm_ring, need_wakeup) == 128, "ring layout");
_Static_assert(offsetof(struct shm_ring, cpu) == 136, "ring layout");
_Static_assert(offsetof(struct shm_ring, far) == 140, "ring layout");

enum shm_op {
	SHM_OP_NOP = 0,
	SHM_OP_EXISTS = 1,        /* key -> res 1/0 */
	SHM_OP_ACQUIRE = 2,       /* key -> extent */
	SHM_OP_RELEASE = 3,       /* arg = handle */
	SHM_OP_RESERVE = 4,       /* key, arg = len, put_flags, key2 = parent, tier, pin_ttl */
	SHM_OP_COMMIT = 5,        /* arg = handle */
	SHM_OP_ABORT = 6,         /* arg = handle */
	SHM_OP_REMOVE = 7,        /* key; arg: enum wire_remove_flags */
	SHM_OP_BATCH_EXISTS = 8,  /* count key refs at list_off -> count bytes at out_off */
	SHM_OP_PREFIX_LOOKUP = 9, /* count key refs at list_off -> res = leading hits */
	SHM_OP_GET_INTO = 10,     /* key, count iovs at list_off; res = length */
	SHM_OP_PUT_FROM = 11,     /* key, count iovs at list_off, put args; res = 0 */
	SHM_OP_MAX,
};

enum shm_sqe_flags {
	SHM_SQE_NO_CQE = 1u << 0,   /* post no completion unless it fails */
	SHM_SQE_WANT_MSG = 1u << 1, /* on failure, write a message at msg_off */
	SHM_SQE_LOCAL_ONLY = 1u << 2, /* lookups and gets: this node alone (KVC_LOCAL_ONLY) */
	/* COMMIT, PUT_FROM: once stored, copy it to the node whose id is at
	 * push_off/push_len (kvc_put_opts.push_to); the result is then the
	 * push's (the put stands either way).  With SHM_CHAN_FEAT_PUSH. */
	SHM_SQE_PUSH = 1u << 3,
	SHM_SQE_PEEK = 1u << 4, /* lookups: no lease, no use (KVC_PEEK) */
	/* ACQUIRE (with SHM_CHAN_FEAT_STREAM): when the object comes from
	 * another node, a completion with SHM_CQE_MORE says where it lands
	 * and which progress word counts its bytes in; the final completion
	 * (the acquire's own) follows as always */
	SHM_SQE_STREAM = 1u << 5,
};

#define SHM_MSG_MAX 256u /* bytes at msg_off, NUL-terminated */

/* 64 bytes, one cache line. */
struct shm_sqe {
	uint8_t opcode;     /* enum shm_op */
	uint8_t flags;      /* enum shm_sqe_flags */
	int8_t tier;
	uint8_t pad;
	uint16_t key_len;
	uint16_t key2_len;
	uint32_t key_off;   /* arena offsets */
	uint32_t key2_off;
	uint32_t count;
	uint32_t list_off;
	uint32_t out_off;
	uint32_t put_flags;
	uint64_t user_data; /* echoed in the completion */
	uint64_t arg;       /* handle or length */
	uint32_t pin_ttl_ms;
	uint32_t msg_off;   /* arena offset for an error message */
	uint32_t push_off;  /* with SHM_SQE_PUSH: a node id in the arena */
	uint32_t push_len;
};
_Static_assert(sizeof(struct shm_sqe) == 64, "sqe size");

/* Keys in a batch: arena offsets. */
struct shm_key_ref {
	uint32_t off;
	uint32_t len;
};
_Static_assert(sizeof(struct shm_key_ref) == 8, "key ref size");

/* A piece of a registered buffer. */
struct shm_iov {
	uint64_t buffer;    /* handle from buffer registration */
	uint64_t off;
	uint64_t len;
};
_Static_assert(sizeof(struct shm_iov) == 24, "iov size");

/* SHM_OP_REMOVE's arg: enum wire_remove_flags (proto/values.h). */

/* 64 bytes. */
struct shm_cqe {
	uint64_t user_data;
	int64_t res;        /* >= 0 result, or -errno */
	uint64_t handle;    /* acquire/reserve */
	uint64_t offset;
	uint64_t len;
	uint32_t segment;
	uint32_t flags;     /* enum shm_cqe_flags */
	uint64_t reserved[2]; /* SHM_CQE_MORE: progress slot, its word's starting value */
};
_Static_assert(sizeof(struct shm_cqe) == 64, "cqe size");

enum shm_cqe_flags {
	/* not the request's answer but news of it (SHM_SQE_STREAM): where
	 * the object lands (segment, offset, len) and its progress word
	 * (reserved[0]: the slot; reserved[1]: the word's value with no
	 * bytes in, i.e. its generation).  Another may follow (the object
	 * is landing again elsewhere): it replaces this one. */
	SHM_CQE_MORE = 1u << 0,
};

/* What the daemon takes beyond version 1 (0 from older daemons). */
#define SHM_CHAN_FEAT_PUSH (1u << 0) /* SHM_SQE_PUSH */
#define SHM_CHAN_FEAT_STREAM (1u << 1) /* SHM_SQE_STREAM */

struct shm_chan_header {
	uint64_t magic;
	uint32_t version;
	uint32_t entries;
	uint32_t arena_slot;
	uint32_t features;  /* SHM_CHAN_FEAT_* */
	uint64_t size;
	uint64_t sq_off, cq_off, sqes_off, cqes_off, arena_off, arena_size;
};
_Static_assert(sizeof(struct shm_chan_header) <= SHM_CHAN_HEADER_SIZE, "channel header size");

#define SHM_CHAN_SQ_OFF SHM_CHAN_HEADER_SIZE
#define SHM_CHAN_CQ_OFF (SHM_CHAN_SQ_OFF + sizeof(struct shm_ring))
#define SHM_CHAN_SQES_OFF (SHM_CHAN_HEADER_SIZE + 4096u)
#define SHM_CHAN_CQES_OFF (SHM_CHAN_SQES_OFF + SHM_CHAN_ENTRIES * sizeof(struct shm_sqe))
#define SHM_CHAN_ARENA_OFF (SHM_CHAN_CQES_OFF + SHM_CHAN_ENTRIES * sizeof(struct shm_cqe))
#define SHM_CHAN_ARENA_SIZE (SHM_CHAN_ENTRIES * SHM_CHAN_ARENA_SLOT)
#define SHM_CHAN_SIZE (SHM_CHAN_ARENA_OFF + SHM_CHAN_ARENA_SIZE)
