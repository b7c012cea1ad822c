/* SPDX-License-Identifier: MIT */
/*
 * libkvcache — attach an inference engine to the node's kvcached.
 *
 * Objects are immutable byte strings (1 B .. 1 GiB) under keys of 1..511
 * bytes.  Values live in shared memory owned by the daemon; this library maps
 * it once at kvc_connect() and moves bytes with plain memory copies.
 *
 * Every function that can fail returns >= 0 on success and a negative errno
 * on failure; kvc_strerror() explains the codes.  Common to every call:
 *   -EINVAL       bad argument (NULL, key of 0 or > 511 bytes, length 0)
 *   -ECONNRESET   the daemon went away; the client must be reconnected
 *   -EPROTO       the daemon sent something this library does not understand
 * A struct kvc_client may be used from several threads at once.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_KEY_MAX 511u
#define KVC_VALUE_MAX (UINT64_C(1) << 30)

struct kvc_client;

enum kvc_put_flags {
	KVC_PUT_REPLACE = 1u << 0,  /* replace a committed object of the same key */
	KVC_PUT_SOFT_PIN = 1u << 1, /* evicted only after unpinned objects */
	KVC_PUT_HARD_PIN = 1u << 2, /* never evicted */
	/* batch puts (kvc_batch_put, kvc_batch_put_from): keys[i] names
	 * keys[i - 1] as its parent, keys[0] names parent_key -- the blocks
	 * of one prompt in one call */
	KVC_PUT_CHAIN = 1u << 3,
};

enum kvc_tier {
	KVC_TIER_DEFAULT = 0,
	KVC_TIER_DEVICE = 1,
	KVC_TIER_DRAM = 2,
	KVC_TIER_DISK = 3,
};

/* A zeroed struct means defaults. */
struct kvc_put_opts {
	uint32_t flags;         /* enum kvc_put_flags */
	const char *parent_key; /* previous block of the same prompt, or NULL */
	uint32_t pin_ttl_ms;    /* with KVC_PUT_SOFT_PIN; 0 = until unpinned */
	int tier;               /* enum kvc_tier */
	/* a node id: after the commit the object is also copied to that node
	 * of the cluster, in the background (kvc_push()) -- prefill pushes,
	 * decode finds its KV local; NULL: stays here */
	const char *push_to;
};

/* Space reserved for a put; fill data[0..len) then commit or abort. */
struct kvc_buf {
	void *data;
	size_t len;
	uint64_t handle; /* private */
};

/* A pinned, read-only view of a committed object. */
struct kvc_view {
	const void *data;
	size_t len;
	uint64_t handle; /* private */
};

/* Connect to the daemon at socket_path (NULL: $KVCACHE_SOCKET, then
 * $XDG_RUNTIME_DIR/kvcached.sock, then /tmp/kvcached-<uid>.sock) and map its
 * segments.  -ENOENT / -ECONNREFUSED: no daemon there; -EACCES: not allowed;
 * -EPROTONOSUPPORT: the daemon speaks another protocol major. */
int kvc_connect(const char *socket_path, struct kvc_client **ret);
void kvc_disconnect(struct kvc_client *c);

/* Copy val into a new object.  -EEXIST: key committed already (and no
 * KVC_PUT_REPLACE); -E2BIG: larger than the pool could ever hold; -ENOSPC:
 * no room even after eviction; -EBUSY (with REPLACE): the old object is in
 * use. */
int kvc_put(struct kvc_client *c, const char *key, const void *val, size_t len,
	    const struct kvc_put_opts *opts);

/* Copy an object into buf.  Returns its length; -ENOENT: miss; -ENOBUFS: cap
 * is smaller than the object (nothing copied). */
ssize_t kvc_get(struct kvc_client *c, const char *key, void *buf, size_t cap);

/* kvc_get into a buffer made once the object's length is known:
 * alloc(ctx, len) returns len writable bytes (NULL: the get fails with
 * -ENOMEM).  Across nodes it is called as the bytes start to arrive and the
 * copy runs behind them; should the object change under the get, it is
 * called again with the new length and the buffer it returned before is
 * left unused.  Returns the length, the buffer last returned in *ret_buf,
 * or -errno (-ENOENT: miss). */
typedef void *(*kvc_alloc_fn)(void *ctx, size_t len);
ssize_t kvc_get_alloc(struct kvc_client *c, const char *key, kvc_alloc_fn alloc, void *ctx,
		      void **ret_buf);

/* 1 present, 0 absent, or -errno. */
int kvc_exists(struct kvc_client *c, const char *key);

/* 0, -ENOENT, or -EBUSY while a view or a lease (granted by a hit for
 * --default-kv-lease-ttl ms) holds the object.  In a cluster every other
 * node's copy goes too, whether this node held one or not (the answer is
 * this node's), unless the client is set KVC_LOCAL_ONLY. */
int kvc_remove(struct kvc_client *c, const char *key);

/* Mooncake's remove(key, force=True): a lease does not refuse it; a view
 * still does (-EBUSY), and a reservation is never touched.  0, -ENOENT,
 * -EBUSY. */
int kvc_remove_force(struct kvc_client *c, const char *key);

enum kvc_remove_flags {
	KVC_REMOVE_FORCE = 1u << 0, /* leased objects go too (never viewed ones) */
};

/* Remove every committed object whose key starts with prefix (NULL or ""
 * = all; Mooncake's remove_all, and remove_by_regex for the common case of
 * a prefix).  Returns how many were removed, or -errno; *ret_skipped (may
 * be NULL) counts those kept because a view (or, without
 * KVC_REMOVE_FORCE, a lease) holds them.  Objects stored while it runs may
 * survive. */
int64_t kvc_remove_prefix(struct kvc_client *c, const char *prefix, uint32_t flags,
			  uint64_t *ret_skipped);
int64_t kvc_remove_all(struct kvc_client *c, uint32_t flags, uint64_t *ret_skipped);

/* Zero-copy write: the object becomes visible at commit.  Same errors as
 * kvc_put at reserve; commit fails with -EEXIST if another client committed
 * the key meanwhile (the space is released either way). */
int kvc_reserve(struct kvc_client *c, const char *key, size_t len,
		const struct kvc_put_opts *opts, struct kvc_buf *ret);
int kvc_commit(struct kvc_client *c, struct kvc_buf *b);
int kvc_abort(struct kvc_client *c, struct kvc_buf *b);

/* Zero-copy read: the view pins the object until kvc_release().  -ENOENT on
 * a miss. */
int kvc_acquire(struct kvc_client *c, const char *key, struct kvc_view *ret);
int kvc_release(struct kvc_client *c, struct kvc_view *v);

/* ret_present[i] = 1 if keys[i] is present; returns how many are. */
int kvc_batch_exists(struct kvc_client *c, const char *const *keys, size_t n,
		     uint8_t *ret_present);

/* How many of keys[0..n) are present before the first miss. */
int kvc_prefix_lookup(struct kvc_client *c, const char *const *keys, size_t n);

/* ---- scatter-gather and batches over the caller's own memory ----
 *
 * One object is stored from (or loaded into) a list of pieces, e.g. one
 * buffer per layer.  The library does the copies; the whole batch costs two
 * round trips to the daemon (reserve all, commit all) for puts and one for
 * gets, however many keys. */

struct kvc_iovec {
	void *base;
	size_t len;
};

/* Store keys[i] from the n_iov[i] pieces iov[i].  ret_results[i] is 0 or
 * -errno (as kvc_put); returns how many were stored, or -errno when the
 * batch could not be attempted at all. */
int kvc_batch_put(struct kvc_client *c, size_t n, const char *const *keys,
		  const struct kvc_iovec *const *iov, const size_t *n_iov,
		  const struct kvc_put_opts *opts, int *ret_results);

/* Load keys[i] into its pieces, filled in order.  ret_results[i] is the
 * object's length, -ENOENT, or -ENOBUFS when the pieces are too small;
 * returns how many were loaded. */
int kvc_batch_get(struct kvc_client *c, size_t n, const char *const *keys,
		  const struct kvc_iovec *const *iov, const size_t *n_iov, ssize_t *ret_results);

/* ---- registered buffers: the daemon copies, the caller's thread is free ----
 *
 * Memory that both the client and the daemon map (Mooncake's
 * register_buffer).  kvc_get_into() and kvc_put_from() move bytes between a
 * stored object and a registered buffer with the copy done by the daemon. */

struct kvc_buffer {
	void *data;
	size_t len;
	uint64_t handle; /* private */
};

/* -E2BIG past the per-client limit (64 GiB). */
int kvc_buffer_alloc(struct kvc_client *c, size_t len, struct kvc_buffer *ret);
int kvc_buffer_free(struct kvc_client *c, struct kvc_buffer *b);

/* A piece of a registered buffer. */
struct kvc_iov {
	const struct kvc_buffer *buf;
	uint64_t offset;
	uint64_t len;
};

/* Copy the object into buf[offset, offset + cap): returns its length,
 * -ENOENT, -ENOBUFS. */
ssize_t kvc_get_into(struct kvc_client *c, const char *key, const struct kvc_buffer *buf,
		     uint64_t offset, size_t cap);
/* Store buf[offset, offset + len) as a new object. */
int kvc_put_from(struct kvc_client *c, const char *key, const struct kvc_buffer *buf,
		 uint64_t offset, size_t len, const struct kvc_put_opts *opts);

/* Batch forms (Mooncake's batch_get_into_multi_buffers and
 * batch_put_from_multi_buffers): keys[i] into, or from, its n_iov[i] pieces
 * iov[i] of registered buffers, up to 128 keys in flight at once, the copies
 * done by the daemon.  ret_results[i] is the length (get) or 0 (put), or
 * -errno; returns how many succeeded.  They do not touch the completions of
 * kvc_submit(). */
int kvc_batch_get_into(struct kvc_client *c, size_t n, const char *const *keys,
		       const struct kvc_iov *const *iov, const size_t *n_iov, ssize_t *ret_results);
int kvc_batch_put_from(struct kvc_client *c, size_t n, const char *const *keys,
		       const struct kvc_iov *const *iov, const size_t *n_iov,
		       const struct kvc_put_opts *opts, int *ret_results);

/* ---- asynchronous operations ----
 *
 * Submit now, reap later, as with io_uring: e.g. load the next layer's KV
 * while this one computes.  At most 256 operations per client are in flight
 * or unreaped; kvc_submit() queues as many as fit and returns how many. */

enum kvc_opcode {
	KVC_OP_GET_INTO = 1, /* res: length, -ENOENT, -ENOBUFS */
	KVC_OP_PUT_FROM = 2, /* res: 0, -EEXIST, -ENOSPC, ... */
	KVC_OP_EXISTS = 3,   /* res: 1 or 0 */
	KVC_OP_REMOVE = 4,   /* res: 0, -ENOENT, -EBUSY */
};

struct kvc_op {
	int opcode;                      /* enum kvc_opcode */
	const char *key;
	/* GET_INTO / PUT_FROM: one piece, or n_iov pieces (up to 64) */
	const struct kvc_buffer *buf;
	uint64_t offset;
	uint64_t len;                    /* put: length; get: capacity */
	const struct kvc_iov *iov;
	size_t n_iov;
	const struct kvc_put_opts *opts; /* PUT_FROM */
	uint64_t user_data;              /* echoed in the completion */
};

struct kvc_completion {
	uint64_t user_data;
	int64_t res;
};

/* Returns how many of ops were queued (0 < r <= n), -EAGAIN when none could
 * be (too many in flight: reap first), -EINVAL when ops[0] is malformed. */
int kvc_submit(struct kvc_client *c, const struct kvc_op *ops, size_t n);
/* Completions ready now, without waiting: returns how many (0..max). */
int kvc_poll(struct kvc_client *c, struct kvc_completion *ret, size_t max);
/* Wait until at least min (<= max) completions are ready or timeout_ms
 * passes (-1 = forever); returns how many, or -ETIMEDOUT with none. */
int kvc_wait(struct kvc_client *c, struct kvc_completion *ret, size_t min, size_t max,
	     int timeout_ms);

/* A file descriptor that is readable while completions of kvc_submit()
 * wait to be reaped, for poll(), epoll or an event loop (asyncio's
 * add_reader).  Reaping them all with kvc_poll() or kvc_wait() makes it
 * unreadable again; reading it is never needed.  It is readable too when
 * the daemon went away (the next call says -ECONNRESET).  The same fd on
 * every call; kvc_disconnect() closes it.  The first call starts a helper
 * thread that watches the completion ring. */
int kvc_completion_fd(struct kvc_client *c);

const char *kvc_strerror(int err);

/* The daemon's explanation of the last error this thread got from it, or
 * "" when it gave none. */
const char *kvc_last_error_msg(void);

/* ---- administration (kvcachectl is written against these) ---- */

struct kvc_tier_status {
	const char *name; /* "device", "dram", "disk" */
	uint64_t capacity, used, objects;
	uint64_t high_watermark; /* bytes; above it the evictor frees space */
};

struct kvc_status {
	const char *version;
	const char *socket;
	uint64_t uptime_s;
	uint64_t objects;
	uint32_t pid;
	uint32_t clients;
	bool hugepages;
	uint32_t protocol_major, protocol_minor, layout_version;
	size_t n_tiers;
	struct kvc_tier_status *tiers;
	/* the disk tier's records are still being indexed (those not yet
	 * indexed are misses): recovered of recovery_total so far */
	bool recovering;
	uint64_t recovered, recovery_total;
	/* --numa-node: memory and threads bound to this node; -1: not bound */
	int numa_node;
};

int kvc_status_get(struct kvc_client *c, struct kvc_status **ret);
void kvc_status_free(struct kvc_status *s);

struct kvc_counter {
	const char *name;
	uint64_t value;
};

/* The cluster as the daemon sees it (kvcachectl cluster).  A single node,
 * not started with --master, has self == "" and no nodes. */
struct kvc_node {
	const char *id;
	const char *address;
	const char *state;     /* "up", "suspect" (silent a while), "down" */
	const char *transport; /* "tcp", "rdma", or "local" for the daemon itself */
	uint64_t capacity, used, objects;
};

struct kvc_cluster {
	const char *self;      /* this daemon's node id */
	size_t n_masters;
	const char *const *masters;
	size_t masters_up;     /* masters it is joined to now */
	size_t n_nodes;
	struct kvc_node *nodes;
	/* n_nodes: each node's kvcached version, "" when not known (after
	 * nodes, so a program built against an older header still works) */
	const char *const *versions;
};

int kvc_cluster_get(struct kvc_client *c, struct kvc_cluster **ret);
void kvc_cluster_free(struct kvc_cluster *v);

/* Copy a committed object to the node named node_id, in the background:
 * 0 once the copy is started.  -EHOSTUNREACH: no such node is up;
 * -ENOTCONN: this daemon is not in a cluster; -ENOENT: no such key here.
 * The target keeps what it has already (the copy is then dropped). */
int kvc_push(struct kvc_client *c, const char *key, const char *node_id);

/* Start bringing keys into this node's memory, from its disk tier or from
 * another node of the cluster, and return at once: the number of fetches
 * started or joined (keys already in memory start none; a key held nowhere
 * costs one directory question and then nothing). */
int kvc_prefetch(struct kvc_client *c, const char *const *keys, size_t n);

/* These keys will be stored soon, by this client or another: until they are
 * (or the daemon's --lookup-wait-ms passes), a lookup of one of them on this
 * node waits for its put instead of missing, as for a put in progress.  A
 * prefill announces the blocks it is about to store when it answers, and the
 * decode's lookup that follows finds them.  Returns how many are announced
 * (keys stored already count; with --lookup-wait-ms 0 it does nothing), or
 * -errno (-ENOSPC: too many announced and not yet stored). */
int kvc_announce(struct kvc_client *c, const char *const *keys, size_t n);

/* The nodes holding key: node ids, this daemon's own first when it holds it,
 * then what the cluster's directory says now.  -ENOENT: none.  Free the
 * NULL-terminated array with kvc_where_free(). */
int kvc_where(struct kvc_client *c, const char *key, char ***ret_nodes, size_t *ret_n);
void kvc_where_free(char **nodes);

/* Counters by name ("puts", "gets", "hits", "misses", "bytes_in", ...). */
int kvc_stats_get(struct kvc_client *c, struct kvc_counter **ret, size_t *ret_n);
void kvc_stats_free(struct kvc_counter *v);

enum kvc_key_state {
	KVC_STATE_RESERVED = 1,
	KVC_STATE_COMMITTED = 2,
};

struct kvc_key_info {
	const char *key;
	uint64_t size;
	int state; /* enum kvc_key_state */
	int tier;  /* enum kvc_tier: where its bytes are served from */
	bool on_disk; /* a complete record of it is on disk */
};

/* Keys starting with prefix (NULL or "" = all), at most limit (0 = 1000) of
 * them; *ret_total says how many matched in all. */
int kvc_list(struct kvc_client *c, const char *prefix, size_t limit,
	     struct kvc_key_info **ret, size_t *ret_n, uint64_t *ret_total);
/* The one key named, as kvc_list() describes it: *ret_n is 1 (held here)
 * or 0.  The daemon finds it in its index, without walking the keys (a
 * prefix listing walks them all). */
int kvc_list_key(struct kvc_client *c, const char *key, struct kvc_key_info **ret,
		 size_t *ret_n);
void kvc_list_free(struct kvc_key_info *v);

enum kvc_pin_flags {
	KVC_PIN_HARD = 1u << 0, /* never evicted; without it: soft (evicted last) */
};

/* Pin a stored object: soft (evicted only after unpinned objects; ttl_ms 0 =
 * until unpinned) or hard (never evicted).  -ENOENT if absent. */
int kvc_pin(struct kvc_client *c, const char *key, uint32_t flags, uint32_t ttl_ms);
int kvc_unpin(struct kvc_client *c, const char *key);

enum kvc_evict_flags {
	KVC_EVICT_ALL = 1u << 0,
};

/* Drop up to `bytes` of unused objects (least recently used first, leaves of
 * prefix chains before their ancestors, unpinned before soft-pinned) from
 * `tier` (KVC_TIER_DEFAULT = all), or every unused one with KVC_EVICT_ALL.
 * Objects held by a view or a lease, and hard-pinned ones, are never
 * evicted. */
int kvc_evict(struct kvc_client *c, int tier, uint64_t bytes, uint32_t flags,
	      uint64_t *ret_bytes, uint64_t *ret_objects);

/* Write every object held only in memory to the disk tier, for a planned
 * restart; waits until done or timeout_ms passes (-1 = forever).  Returns
 * 0, -ETIMEDOUT, -EOPNOTSUPP without a disk tier, or the error that kept
 * objects from being written (-EROFS, -EACCES, -ENOSPC, -EIO, ...; the
 * count is in kvc_last_error_msg()). */
int kvc_flush(struct kvc_client *c, int timeout_ms);

/* Where this client's lookups and gets look. */
enum kvc_get_flags {
	/* This node alone: a key held only by another node of the cluster is
	 * a miss, answered at local speed, with no question to a master and
	 * no transfer.  Applies to kvc_exists, kvc_batch_exists,
	 * kvc_prefix_lookup, kvc_get, kvc_acquire, the batch gets and
	 * kvc_get_into, and to async GET_INTO and EXISTS operations; and
	 * kvc_remove, kvc_remove_force and kvc_remove_prefix remove this
	 * node's copies alone (without it, a removal reaches every node's). */
	KVC_LOCAL_ONLY = 1u << 0,
	/* kvc_exists, kvc_batch_exists, kvc_prefix_lookup and async EXISTS
	 * only look: a hit grants no lease and counts as no use (a router
	 * or a scan that looks at every cached block keeps nothing in the
	 * pool that way) */
	KVC_PEEK = 1u << 1,
};

/* Set the flags of every lookup and get this client makes from now on
 * (enum kvc_get_flags; 0: the whole cluster, the default).  Returns the
 * previous flags.  A program that wants both kinds of answer keeps two
 * clients. */
uint32_t kvc_set_get_flags(struct kvc_client *c, uint32_t flags);

/* The daemon's shared-memory segments this client maps: every view and
 * reservation points into one of them.  An engine that copies to and from
 * a GPU pins them once (cudaHostRegister) so those copies are DMA.  Fills
 * up to max entries and returns how many segments there are. */
struct kvc_segment {
	void *base;
	size_t len;
};

int kvc_segments(struct kvc_client *c, struct kvc_segment *ret, size_t max);

/* After connecting, a library thread at idle priority touches every page of
 * those segments once, so that this process's first copies to and from
 * them do not pay for mapping each page (KVCACHE_WARM=0: it does not run).
 * How many bytes of them it has touched so far. */
uint64_t kvc_warmed_bytes(struct kvc_client *c);

/* Is the connection to the daemon gone (the daemon stopped, or was taken
 * over by a new one: kvcachectl upgrade)?  Every call then fails with
 * -ECONNRESET; kvc_disconnect() this client and kvc_connect() again (the
 * Python Client does so by itself). */
bool kvc_connection_lost(const struct kvc_client *c);

/* The socket path kvc_connect() would use for socket_path. */
int kvc_socket_path(const char *socket_path, char *buf, size_t len);

/* Parse "4096", "512MB", "1GiB", "1.5 GB" (powers of 1024). */
int kvc_parse_size(const char *s, uint64_t *ret);

#ifdef __cplusplus
}
#endif
