/* SPDX-License-Identifier: MIT */
/* kvcachectl's commands that live in files of their own (ctl-*.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <kvcache/kvcache.h>

/* "1.5 GiB" */
void human(uint64_t v, char *buf, size_t len);

/* kvcachectl top: refreshes (<= 0: until 'q' or a signal); 0 or -errno. */
int ctl_top(struct kvc_client *c, long refreshes);
