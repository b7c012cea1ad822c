/* SPDX-License-Identifier: MIT */
/*
 * Warm restarts (docs/warm-restart.rst): a new kvcached takes the memory
 * tiers, their catalog and the listening socket over from the running one
 * (kvcached --take-over, kvcachectl upgrade), or from systemd's
 * file-descriptor store after a restart or a crash.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "server.h"
#include "store.h"

/* What a warm start was given: the store's fds, and the listening
 * socket's (-1: none). */
struct warm_fds {
	struct store_warm store;
	int listen_fd;
	bool any;
};

/* The checksum objects are kept by (XXH3-64, as between nodes), of many
 * objects at once, on every CPU. */
void handover_hash(struct store_hash_job *jobs, size_t n);

/* New daemon: ask the kvcached serving socket_path for everything (it
 * stops serving first).  0 with *ret filled; 1: nobody serves there
 * (start empty); -errno with err saying why. */
int handover_ask(const char *socket_path, uint64_t dram_size, uint64_t device_size,
		 struct warm_fds *ret, char *err, size_t err_len);
/* Under systemd: what the file-descriptor store gave back (LISTEN_FDS,
 * named by FDNAME); *ret->any false when nothing. */
void handover_from_fdstore(struct warm_fds *ret);
/* Under systemd: put this run's fds in the store (FDSTORE=1); true when
 * the service manager took them (then a stop seals the catalog, so the
 * next start keeps the memory). */
bool handover_to_fdstore(const struct store *st, int listen_fd);

/* Old daemon: the server's hook for OP_HANDOVER (data: a struct
 * handover).  One asker at a time: it stops the loop. */
struct handover {
	struct loop *loop;
	int fd;        /* the asker's connection; -1: nobody asked */
	uint32_t seq;
};
void handover_init(struct handover *h, struct loop *loop);
int handover_hook(void *data, int fd, uint32_t seq, char *msg, size_t msg_len);
/* After every part but the store stopped: seal the store and send its
 * fds and the listening socket's to the asker. */
void handover_answer(struct handover *h, struct store *st, int listen_fd);
