/* SPDX-License-Identifier: MIT */
/*
 * Fetching from other nodes (rfetch.c): the fetches in flight and those
 * waiting for a place.  The remote backend's calls it answers are declared
 * in node-private.h.
 */
#pragma once


struct rfetch;

/* The node's fetches (its fetches; only rfetch.c touches it). */
struct rfetcher {
	struct rfetch *rfetches;   /* in flight */
	unsigned n_rfetches;
	struct rfetch *backlog, *backlog_tail; /* waiting for a place in flight */
	unsigned n_backlog;
};
