/* SPDX-License-Identifier: MIT */
/* kvcachectl's commands that live in files of their own (ctl-*.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kvcache/kvcache.h>

/* "1.5 GiB" */
void human(uint64_t v, char *buf, size_t len);

/* kvcachectl top: refreshes (<= 0: until 'q' or a signal); 0 or -errno. */
int ctl_top(struct kvc_client *c, long refreshes);

/* kvcachectl upgrade: start binary (NULL: the running daemon's own) with
 * the running daemon's flags (or flags[0..n_flags) when flags is set),
 * --socket socket_path and --take-over; wait until it serves.  An exit
 * status. */
int ctl_upgrade(struct kvc_client *c, const char *socket_path, const char *binary,
		char **flags, int n_flags, bool json);
