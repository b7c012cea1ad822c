/* SPDX-License-Identifier: MIT */
/*
 * A client connection and what it holds.  The object operations here are
 * shared by both transports: the control socket (session.c) and the
 * shared-memory channels (channel.c).
 */
#pragma once

#include "daemon.h"
#include "holder.h"

#define SESSION_MAX_CHANNELS 16
#define OPS_MSG_MAX 256

struct buffer;
struct channel;

struct session {
	struct loop_source *src;  /* its socket in the loop */
	struct session *next, *prev;
	struct daemon *d;
	int fd;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[32];
	bool welcomed, refused, closing;
	uint32_t events;

	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off;
	int out_fds[WIRE_MAX_FDS]; /* not yet sent with the first out byte */
	size_t n_out_fds;

	struct holder h;          /* its reservations, views and buffers */

	struct channel *channels[SESSION_MAX_CHANNELS];
	unsigned n_channels;
	struct fetch *pending;  /* set with -EINPROGRESS: what the request waits for */
	/* an acquire on the socket waiting for its object to come back from
	 * disk: the session reads nothing more until it is answered */
	struct {
		struct waiter w;        /* on the fetch */
		bool active;
		uint32_t seq;
		uint8_t key[WIRE_MAX_KEY];
		uint32_t key_len;
	} parked;
	uint64_t buffer_bytes;
};

/* Where an object's bytes are, as a client sees them. */
struct extent {
	uint64_t handle;
	uint32_t segment;
	uint64_t offset;
	uint64_t len;
};

struct put_args {
	const void *key;
	size_t key_len;
	uint64_t len;
	uint32_t flags;
	const void *parent;   /* may be NULL */
	size_t parent_len;
	uint32_t pin_ttl_ms;
	int tier;
};

/* Each returns 0 or -errno; msg (OPS_MSG_MAX bytes) may explain an error.
 * What a holder takes (reservations, views) is its until given back or
 * holder_done().  ops_acquire() returns -EINPROGRESS for an object being
 * brought back from below memory, with *ret_fetch the fetch to wait on: run
 * the request again once it is done. */
int ops_reserve(struct holder *h, const struct put_args *a, struct extent *ret, char *msg);
int ops_commit(struct holder *h, uint64_t handle, char *msg);
int ops_abort(struct holder *h, uint64_t handle, char *msg);
int ops_acquire(struct holder *h, const void *key, size_t key_len, struct extent *ret,
		struct fetch **ret_fetch, char *msg);
int ops_release(struct holder *h, uint64_t handle, char *msg);
/* force: a lease does not refuse it (a view still does). */
int ops_remove(struct daemon *d, const void *key, size_t key_len, bool force, char *msg);
/* Remove committed objects whose key starts with prefix, in a bounded
 * slice of the index from cursor; returns the next cursor, UINT64_MAX when
 * the walk is done.  Viewed objects, and leased ones without force, are
 * counted in *ret_skipped. */
uint64_t ops_remove_prefix(struct daemon *d, const void *prefix, size_t len, bool force,
			   uint64_t cursor, uint64_t *ret_removed, uint64_t *ret_skipped);
int ops_pin(struct daemon *d, const void *key, size_t key_len, bool hard, uint32_t ttl_ms,
	    char *msg);
int ops_unpin(struct daemon *d, const void *key, size_t key_len, char *msg);
/* Present or not; a hit counts as a use for LRU and grants a lease. */
bool ops_exists(struct daemon *d, const void *key, size_t key_len, bool prefetch);

/* Registered buffers (buffer.c): memory both the client and the daemon map. */
struct buffer {
	struct shm_segment seg;
	uint64_t size;
};
int buffer_create(struct session *s, uint64_t size, uint64_t *ret_handle, int *ret_fd, char *msg);
void buffer_free(struct session *s, struct buffer *b);
/* The bytes [off, off + len) of the registered buffer `id`, or NULL. */
void *buffer_span(struct session *s, uint64_t id, uint64_t off, uint64_t len);

/* Channels (channel.c). */
int channel_open(struct session *s, int *ret_fds, char *msg);
void channel_close(struct channel *ch);
/* Run what every channel has queued; returns how many requests it handled. */
unsigned channel_poll_all(struct daemon *d);
/* Register the channels' poller (and their timer) with the loop. */
int channel_setup(struct daemon *d);
/* Going to sleep (true) or awake (false): tells clients whether to ring. */
void channel_set_sleeping(struct daemon *d, bool sleeping);
