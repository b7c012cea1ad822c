/* SPDX-License-Identifier: MIT */
/*
 * The local transport: the listening socket and the signals (server.c),
 * the daemon-wide figures and limits its clients share, and what every
 * part of local/ reaches through struct server.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cluster-admin.h"
#include "holder.h"
#include "mapper.h"
#include "shm-layout.h"
#include "store.h"

#define SESSION_MAX_CHANNELS 16

struct buffer;
struct buffer_job;
struct channel;
struct chan_mem;
struct copier;
struct copy_job;
struct parked;
struct session;

/* What only the local transport counts (the store counts the rest). */
struct server_stats {
	uint64_t connections, protocol_errors;
	uint64_t refused_clients, refused_channels, refused_buffers; /* daemon-wide limits */
	uint64_t spill_waits;      /* puts that waited for a spill */
	uint64_t copies_offloaded; /* get_into/put_from copies done by the copier */
	uint64_t gets_streamed;    /* acquires told where their object lands (SHM_SQE_STREAM) */
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
	usec_t refused_logged; /* clients refused at accept: logged once in 10 s */
	struct loop_source *listen_src, *signal_src;
	struct loop_source *channels_src, *space_timer, *put_wait_timer;
	usec_t started;       /* mono_us() */
	struct server_stats stats;

	struct parked *space_head, *space_tail; /* puts waiting for a spill (channel.c) */
	bool space_freed;                       /* a copy below ended since the last retry */
	struct store_listener space_listener;   /* ...which the store tells */
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
	/* kvcached --take-over asks for the memory (OP_HANDOVER): the
	 * daemon's hook takes the asker's connection (fd, dup'd) and answers
	 * it once it has stopped; 0, or -errno with msg */
	int (*handover)(void *data, int fd, uint32_t seq, char *msg, size_t msg_len);
	void *handover_data;
	bool keep_listen;          /* handed over: server_done() leaves socket and lock file */
	/* figures of the daemon's other parts (a lone daemon's checksums
	 * taken ahead), exported with the tier below's */
	void (*more_stats)(void *data, void (*emit)(void *u, const char *name, uint64_t v),
			   void *u);
	void *more_stats_data;
	bool inherit_listen;       /* server_init() serves inherited_fd, a previous run's */
	int inherited_fd;
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

/* The listening socket and the signals (server.c). */
int server_init(struct server *sv);
void server_done(struct server *sv);

/* Copy key to the node named node in the background (kvc_push(), a put's
 * push_to): 0, or -ENOTCONN (no cluster), -EHOSTUNREACH, -EINVAL (this
 * node), -ENOENT, with msg saying why. */
int server_push(struct server *sv, const char *key, size_t len, const char *node, char *msg);
/* Every figure of kvcachectl stats, each once, with its kind: the store's,
 * each tier's (tier set), the server's and the backends'. */
void server_export(struct server *sv, server_export_fn fn, void *u);
