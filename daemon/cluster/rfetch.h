/* SPDX-License-Identifier: MIT */
/*
 * Fetching from other nodes (rfetch.c): the fetches in flight and those
 * waiting for a place.  The remote backend's calls it answers are declared
 * in node-private.h.
 */
#pragma once


struct rfetch;
struct lgroup;
struct loop_source;

#define RF_MASTERS 8 /* (link.h's MAX_MASTERS) */
#define RF_PROGRESS 256 /* (shm-layout.h's SHM_SEG_PROGRESS_SLOTS) */

/* The node's fetches (its fetches; only rfetch.c touches it). */
struct rfetcher {
	struct rfetch *rfetches;   /* in flight */
	unsigned n_rfetches;
	struct rfetch *backlog, *backlog_tail; /* waiting for a place in flight */
	unsigned n_backlog;
	/* Lookups of the fetches begun in one turn, one frame per master:
	 * the one being filled for each master, and those asked of each,
	 * oldest first (a master answers in the order asked: an answer is
	 * the first one's); flush: the poller that asks at the turn's end */
	struct lgroup *filling[RF_MASTERS];
	struct lgroup *asked[RF_MASTERS], *asked_tail[RF_MASTERS];
	struct loop_source *flush;
	/* progress words for the landings in flight: the free slots, in the
	 * order freed (a word stays as its fetch left it while 255 others
	 * are handed out), and each slot's generation */
	uint16_t pfree[RF_PROGRESS];
	unsigned pfree_head, n_pfree;
	uint32_t pgen[RF_PROGRESS];
	struct {
		uint64_t remote_hits, remote_misses, remote_errors, remote_corrupt;
		uint64_t fetch_waited;  /* fetches that waited for a place in flight */
		uint64_t fetch_ahead;   /* asked before the one ahead was answered (atomic) */
		uint64_t sick_skips;    /* fetches not sent to a holder known sick */
		uint64_t lookups, lookup_keys; /* Lookup frames the fetches sent, keys in them */
		uint64_t restarts;      /* landings whose bytes started over (atomic) */
		/* fetches that landed, and the time they spent in each phase
		 * (us, summed): rfetch.c, fetch_timed() */
		uint64_t timed, locate_us, queue_us, answer_us, bytes_us, end_us;
	} c;
};
