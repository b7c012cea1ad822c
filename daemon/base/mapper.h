/* SPDX-License-Identifier: MIT */
/*
 * The mapper: a helper thread that maps and unmaps memory for the loop.
 *
 * mmap() and munmap() take the address space's lock for writing, so they
 * wait for every page fault in flight in any of the daemon's threads
 * (clearing a 2 MiB hugepage takes 0.2-0.5 ms on a two-core machine), and
 * tearing a mapping down costs time in proportion to its pages: the last
 * reference to a memfd frees them all, 20-130 ms for 1 GiB of 4 KiB pages.
 * Neither may happen on the loop.  So the loop hands mappings it is done
 * with to this thread, and has it prepare the ones it will need (a
 * client's channel) ahead of time.  It unmaps in steps, holding the lock
 * for a bounded time each.
 */
#ifndef KVC_MAPPER_H
#define KVC_MAPPER_H

#include <stddef.h>

#include "worker.h"

struct loop;
struct mapper;

/* Its thread (a worker of one), handing work back to loop (NULL: no
 * mapper_submit()). */
int mapper_start(struct loop *loop, struct mapper **ret);
/* Runs what is still queued, then joins the thread. */
void mapper_stop(struct mapper *m);

/* Unmap [base, base + len) (base may be NULL: nothing mapped) and close fd
 * (-1: none) later, off the calling thread.  Never blocks; with no mapper,
 * or no memory for the request, it is done here and now. */
void unmap_later(struct mapper *m, void *base, size_t len, int fd);

/* Run fn(arg) on the thread, in order with the unmaps: 0, or -ENOMEM (or
 * -ENODEV with no mapper) and fn is not run. */
int mapper_call(struct mapper *m, void (*fn)(void *arg), void *arg);
/* Run w on the thread, in order with the unmaps, and its done() on the
 * loop: 0, or -ENODEV (no mapper). */
int mapper_submit(struct mapper *m, struct work *w);

/* Requests queued and not yet done (tests). */
size_t mapper_pending(struct mapper *m);

#endif
