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
	struct {
		uint64_t remote_hits, remote_misses, remote_errors, remote_corrupt;
		uint64_t fetch_waited;  /* fetches that waited for a place in flight */
		uint64_t fetch_ahead;   /* asked before the one ahead was answered (atomic) */
		uint64_t sick_skips;    /* fetches not sent to a holder known sick */
	} c;
};
