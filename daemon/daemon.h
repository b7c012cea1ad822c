/* SPDX-License-Identifier: MIT */
/*
 * The daemon's private state.  Nothing here is visible to clients: they see
 * only segment bytes and (segment, offset, length, handle) tuples.
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "config.h"
#include "shmem.h"
#include "wire.h"

#define DAEMON_MAX_TIERS 3

struct tier {
	const char *name;     /* "device", "dram", "disk" */
	uint32_t kind;        /* enum shm_tier */
	uint32_t segment;     /* index in the Welcome's segment list */
	struct shm_segment seg;
	struct shm_alloc alloc;
	uint64_t objects;     /* committed objects living here */
};

enum object_flags {
	OBJ_COMMITTED = 1u << 0,
	OBJ_DEAD = 1u << 1,      /* unlinked; freed when the last view goes */
	OBJ_SOFT_PIN = 1u << 2,
	OBJ_HARD_PIN = 1u << 3,
};

struct object {
	struct object *hnext;             /* hash chain */
	struct object *lru_prev, *lru_next;
	uint64_t hash;
	uint64_t len;
	struct tier *tier;
	struct shm_block *block;
	uint32_t views;
	uint32_t flags;
	uint32_t key_len;
	char key[];                       /* NUL-terminated */
};

/* Hash table + LRU list of committed objects. */
struct index {
	struct object **buckets;
	size_t n_buckets;
	size_t n_objects;
	uint64_t bytes;
	struct object *lru_head, *lru_tail; /* most / least recently used */
};

int index_init(struct index *idx);
void index_done(struct index *idx);
uint64_t index_hash(const void *key, size_t len);
struct object *index_find(struct index *idx, const void *key, size_t len, uint64_t hash);
int index_insert(struct index *idx, struct object *o);
void index_unlink(struct index *idx, struct object *o);
void index_touch(struct index *idx, struct object *o);

struct stats {
	uint64_t puts, gets, hits, misses, exists;
	uint64_t bytes_in, bytes_out;
	uint64_t errors, protocol_errors;
	uint64_t removes, evictions, evicted_bytes;
	uint64_t reserves, aborts, put_conflicts;
	uint64_t connections, reclaimed_reservations, reclaimed_views;
};

struct session;
struct channel;

/* First member of everything registered with epoll. */
enum loop_kind {
	LOOP_CONTROL, /* the control set (ctl_epfd) inside the main set */
	LOOP_LISTEN,
	LOOP_SIGNAL,
	LOOP_SESSION,
	LOOP_CHANNEL,
};

struct loop_source {
	enum loop_kind kind;
};

struct daemon {
	struct config *cfg;
	char socket_path[sizeof(((struct config *) 0)->socket)];
	char lock_path[sizeof(((struct config *) 0)->socket) + 8];
	int epfd;     /* what the loop sleeps on: channel doorbells + ctl_epfd */
	int ctl_epfd; /* control: listening socket, client sockets, signals */
	int listen_fd, signal_fd, lock_fd;
	uint32_t ctl_ready; /* set by the watcher thread, cleared by the loop */
	pthread_t watcher;
	bool watcher_running;
	uint64_t generation;
	struct timespec started;
	bool quit;
	bool hugepages;

	struct tier tiers[DAEMON_MAX_TIERS];
	unsigned n_tiers;
	struct index index;
	struct stats stats;

	struct loop_source listen_src, signal_src, ctl_src;
	struct session *sessions; /* doubly linked through session->next/prev */
	struct channel *channels; /* every session's, for the poller */
	uint32_t poll_window_us;  /* current adaptive spin window */
	uint32_t n_sessions;
	uint64_t next_session_id;
};

/* Memory tiers (tier.c). */
int tier_setup(struct daemon *d);
void tier_teardown(struct daemon *d);
struct tier *tier_for(struct daemon *d, int requested);
struct object *object_new(const void *key, size_t key_len);
/* Free the object's space and the object itself. */
void object_free(struct daemon *d, struct object *o);
/* Unlink a committed object; freed now, or when its last view goes. */
void object_drop(struct daemon *d, struct object *o);
/* Allocate len bytes in t, evicting unused objects when it is full. */
int tier_alloc(struct daemon *d, struct tier *t, uint64_t len, struct shm_block **ret);
/* Evict from t (NULL = every tier) least recently used first. */
void tier_evict(struct daemon *d, struct tier *t, uint64_t bytes, bool all,
		uint64_t *ret_bytes, uint64_t *ret_objects);

/* Sessions (session.c). */
int session_new(struct daemon *d, int fd);
void session_free(struct session *s);
void session_event(struct session *s, uint32_t events);

/* Event loop (loop.c). */
int loop_setup(struct daemon *d);
int loop_run(struct daemon *d);
void loop_teardown(struct daemon *d);
/* Control fds (sockets, signals). */
int loop_watch(struct daemon *d, int fd, uint32_t events, struct loop_source *src, bool modify);
/* Channel doorbells: only wake the loop when it sleeps. */
int loop_watch_doorbell(struct daemon *d, int fd, struct loop_source *src);

