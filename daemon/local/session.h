/* SPDX-License-Identifier: MIT */
/*
 * A client connection and what it holds: its control socket (session.c),
 * its shared-memory channels (channel.c), its registered buffers
 * (buffer.c), and the listening socket that makes them (server.c).
 */
#pragma once

#include <sys/types.h>
#include <time.h>

#include "cluster-admin.h"
#include "holder.h"
#include "mapper.h"
#include "shm-layout.h"
#include "store.h"
#include "wire.h"

#define SESSION_MAX_CHANNELS 16

struct buffer;
struct channel;
struct copier;
struct copy_job;
struct parked;

/* What only the local transport counts (the store counts the rest). */
struct server_stats {
	uint64_t connections, protocol_errors;
	uint64_t refused_clients, refused_channels, refused_buffers; /* daemon-wide limits */
	uint64_t spill_waits;      /* puts that waited for a spill */
	uint64_t copies_offloaded; /* get_into/put_from copies done by the copier */
};

/* Service time of requests on the channels, one in OPHIST_SAMPLE timed
 * (two clock reads on every request would cost the fast path a few per
 * cent), by opcode; bucket i counts times <= ophist_bounds_ns[i], the
 * last one everything slower. */
#define OPHIST_SAMPLE 8
#define OPHIST_BUCKETS 14
extern const uint64_t ophist_bounds_ns[OPHIST_BUCKETS - 1];

struct ophist {
	uint64_t count, sum_ns;
	uint64_t bucket[OPHIST_BUCKETS];
};

/* What server_export() hands out: a counter only ever grows, a gauge is a
 * level; tier is the tier's name, or NULL. */
enum export_kind {
	EXPORT_COUNTER,
	EXPORT_GAUGE,
};

typedef void (*server_export_fn)(void *u, const char *name, const char *tier,
				 enum export_kind kind, uint64_t value);

/*
 * The local transport: the listening socket, its sessions and their
 * channels, and the daemon-wide limits on what clients may take.  It works
 * on the store through store.h only.
 */
struct server {
	struct store *st;
	const struct cluster_admin *admin; /* the cluster's, or NULL (no --master) */
	struct config *cfg;
	struct loop *loop;
	char socket_path[sizeof(((struct config *) 0)->socket)];
	char lock_path[sizeof(((struct config *) 0)->socket) + 8];
	int listen_fd, signal_fd, lock_fd;
	int spare_fd;               /* kept for accept_next() */
	uint64_t refused_logged_ms; /* clients refused at accept: logged once in 10 s */
	struct loop_source *listen_src, *signal_src;
	struct loop_source *channels_src, *space_timer, *put_wait_timer;
	struct timespec started;
	struct server_stats stats;

	struct parked *space_head, *space_tail; /* puts waiting for a spill (channel.c) */
	uint64_t space_seen;                    /* store's space_seq when last retried */
	/* lookups waiting for a put in flight, oldest (first to give up) first */
	struct parked *put_wait_head, *put_wait_tail;
	struct session *sessions; /* doubly linked through session->next/prev */
	struct channel *channels; /* every session's, for the poller */
	uint32_t n_sessions;
	uint32_t n_channels;       /* all sessions' */
	uint64_t registered_bytes; /* all sessions' registered buffers */
	uint64_t next_session_id;
	struct ophist ophist[SHM_OP_MAX];
	uint32_t ophist_tick;
	struct copier *copier;     /* copier.c */
	struct mapper *mapper;     /* maps and unmaps off the loop */
	struct buffer_maker *maker; /* buffers mapped by it (buffer.c) */
	struct chan_mem *spares_ready; /* channel memory the mapper made (handoff.h stack) */
	struct chan_mem *spares;   /* taken from it by the loop */
	uint32_t n_spares, spares_asked;
	struct holder copy_h;      /* the views and reservations of its copies */
	uint32_t copies_in_flight;
	uint64_t copied_inline;    /* by the loop since it last polled the channels */
};

struct session {
	struct loop_source *src;  /* its socket in the loop */
	struct session *next, *prev;
	struct server *sv;
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
	/* an acquire on the socket waiting for its object to come back from
	 * disk, or a buffer being mapped: the session reads nothing more
	 * until it is answered */
	struct {
		struct waiter w;        /* on the fetch */
		uint32_t op;            /* OP_ACQUIRE, OP_WHERE or OP_BUFFER_ALLOC */
		bool active;
		uint32_t seq;
		uint8_t key[WIRE_MAX_KEY];
		uint32_t key_len;
	} parked;
	uint64_t buffer_bytes;
	struct buffer_job *buffer_job; /* a buffer being mapped (buffer.c) */
	struct copy_job *copies;  /* its copies in flight (copier.c) */
};

/* Registered buffers (buffer.c): memory both the client and the daemon map. */
struct buffer {
	struct shm_segment seg;
	uint64_t size;
	uint32_t copies;  /* copier jobs using it (and its warming): unmapped after the last */
	bool released;    /* given back while copies were in flight */
	bool warm_stop;   /* atomic: given back, its warming may stop */
};
int buffer_create(struct session *s, uint64_t size, uint64_t *ret_handle, int *ret_fd, char *msg);
/* The same with the mapping made on the mapper: -EINPROGRESS, and
 * session_buffer_made() answers (0 with *ret_*: made here at once). */
int buffer_create_start(struct session *s, uint32_t seq, uint64_t size, uint64_t *ret_handle,
			int *ret_fd, char *msg);
void buffer_forget(struct session *s);
int buffer_init(struct server *sv);
void buffer_done(struct server *sv);
/* Bytes of registered buffers faulted in so far (--prefault). */
uint64_t buffer_warmed_bytes(struct server *sv);
void session_buffer_made(struct session *s, uint32_t seq, int r, uint64_t handle, int fd,
			 uint64_t size);
void buffer_free(struct session *s, struct buffer *b);
void buffer_unmap(struct server *sv, struct buffer *b);
/* The bytes [off, off + len) of the registered buffer `id`, or NULL; the
 * buffer in *ret_b when ret_b is not NULL. */
void *buffer_span(struct session *s, uint64_t id, uint64_t off, uint64_t len,
		  struct buffer **ret_b);

/* The copier (copier.c): large get_into/put_from copies off the loop. */
/* A copy goes to the copier when it is this large, or when the loop has
 * copied COPY_TURN_BUDGET bytes itself since it last polled the channels
 * and the copy is at least COPY_MIN: handing a copy over costs a thread
 * wake-up (tens of us here), which only pays for copies of milliseconds,
 * but a batch of many 1 MiB copies must not hold the loop either. */
#define COPY_OFFLOAD (UINT64_C(2) << 20)
#define COPY_TURN_BUDGET (UINT64_C(1) << 20)
#define COPY_MIN (UINT64_C(64) << 10)
struct copy_piece {
	uint8_t *p;
	uint64_t len;
	struct buffer *b;
};
struct copy_job {
	struct work work;               /* on the copier, then on the loop */
	struct server *sv;
	struct copy_job *snext, *sprev; /* its session's */
	struct session *s;              /* NULL once it went away */
	struct channel *ch;
	struct shm_sqe e;               /* the request, for its answer */
	bool put;                       /* buffer -> object (put_from) */
	uint64_t handle;                /* in sv->copy_h */
	uint8_t *obj;
	uint64_t len;
	uint32_t n;
	struct copy_piece pieces[];
};
/* Between obj and the pieces, in order (to_obj: pieces -> obj). */
void copy_pieces(const struct copy_piece *pieces, uint32_t n, uint8_t *obj, bool to_obj);
int copier_init(struct server *sv);
void copier_done(struct server *sv);
void copier_submit(struct server *sv, struct copy_job *j);
void copier_forget(struct session *s);
void copier_settle(struct server *sv);
/* channel.c: a copy ended; r is the request's result. */
void channel_copy_done(struct channel *ch, const struct shm_sqe *e, int64_t r, const char *msg);

/* Channels (channel.c). */
int channel_open(struct session *s, int *ret_fds, char *msg);
void channel_close(struct channel *ch);
void channel_spares_free(struct server *sv);
/* Run what every channel has queued; returns how many requests it handled. */
unsigned channel_poll_all(struct server *sv);
/* Register the channels' poller (and their timer) with the loop. */
int channel_init(struct server *sv);
/* Going to sleep (true) or awake (false): tells clients whether to ring. */
void channel_set_sleeping(struct server *sv, bool sleeping);

/* Sessions (session.c). */
int session_new(struct server *sv, int fd);
/* Every figure of kvcachectl stats, each once, with its kind: the store's,
 * each tier's (tier set), the server's and the backends'. */
void server_export(struct server *sv, server_export_fn fn, void *u);
void session_free(struct session *s);
void session_event(struct session *s, uint32_t events);

/* The listening socket and the signals (server.c). */
int server_init(struct server *sv);
void server_done(struct server *sv);

/* Copy key to the node named node in the background (kvc_push(), a put's
 * push_to): 0, or -ENOTCONN (no cluster), -EHOSTUNREACH, -EINVAL (this
 * node), -ENOENT, with msg saying why. */
int server_push(struct server *sv, const char *key, size_t len, const char *node, char *msg);
