/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>

#include "config.h"
#include "store.h"

/* Resolve --numa-node into st->numa_bound/numa_node and bind the calling
 * thread (and so every thread it starts later) there.  Before tier_setup.
 * -EINVAL with err for a node that does not exist. */
int placement_setup(const struct config *cfg, struct store *st, char *err, size_t err_len);
