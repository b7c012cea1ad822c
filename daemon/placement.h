/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>

#include "config.h"
#include "store.h"

/* Resolve --numa-node into the node the memory tiers come from (*ret_node,
 * -1: placement left alone) and bind the calling thread (and so every
 * thread it starts later) there.  Before store_new().  -EINVAL with err
 * for a node that does not exist. */
int placement_resolve(const struct config *cfg, int *ret_node, char *err, size_t err_len);
