/* SPDX-License-Identifier: MIT */
/* A client's shared-memory channels (channel.c): its rings of descriptors
 * and completions, checked and run on the loop. */
#pragma once

#include "session.h"

int channel_open(struct session *s, int *ret_fds, char *msg);
void channel_close(struct channel *ch);
void channel_spares_free(struct server *sv);
/* Run what every channel has queued; returns how many requests it handled. */
unsigned channel_poll_all(struct server *sv);
/* Register the channels' poller (and their timer) with the loop. */
int channel_init(struct server *sv);
/* Going to sleep (true) or awake (false): tells clients whether to ring. */
void channel_set_sleeping(struct server *sv, bool sleeping);
