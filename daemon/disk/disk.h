/* SPDX-License-Identifier: MIT */
/*
 * The disk tier: record files below memory, registered with the store as
 * its backend (fetch.h) and with the loop as a poller.  main.c starts and
 * stops it; everything else reaches it through st->below.
 */
#pragma once

#include "store.h"

/* Set up the tier in --disk-dir and start recovering what it holds; 0
 * without --disk-dir. */
int disk_setup(struct store *st);
void disk_teardown(struct store *st);
