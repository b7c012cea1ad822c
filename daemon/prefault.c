/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "log.h"
#include "loop.h"
#include "prefault.h"

#define LOG_TOPIC "tier"

/*
 * Faulting the tiers in.  The first write to a page of a fresh segment
 * makes the kernel clear it (2 MiB at a time with hugepages): paid inside
 * a put, or inside a fetch from another node, where it cost a fifth of a
 * 1 MiB transfer; with 4 KiB pages a put's first write to fresh memory ran
 * at a fiftieth of a copy.  A background thread faults every page in at
 * start, in steps, without changing a byte: clients and fetches may
 * already use the pages it has not reached, and the ones it has.  It
 * writes (an atomic add of 0 per 4 KiB page, which changes nothing even
 * under a client writing the page) rather than asking the kernel to
 * populate the range: in a VM, MADV_POPULATE_WRITE left the first copies
 * into a 4 KiB-page segment at a thirtieth of the speed a touched page
 * gives, the host's own mapping of each page being made on its first real
 * access.  On by default (--prefault auto): the tiers' memory is
 * committed at start (RSS = their size), a second or so of one low-
 * priority thread per GiB of 4 KiB pages.  At nice 19: as SCHED_BATCH it
 * kept a CPU until its slice ended while a client waited (a busy client
 * of a daemon just started had half its rate and 1 MiB gets at p99 3-5
 * ms meanwhile); as SCHED_IDLE it stopped where others kept the CPUs
 * busy, and clients met the untouched pages first (docs/performance.rst).
 */
/* A hugepage a step, then a pause: before Linux 6.4 each fault holds the
 * address space's lock for reading, and the mapper's mmap() waits for a
 * writer's turn. */
#define PREFAULT_STEP (2u << 20)

#define PREFAULT_MAX_TIERS 8
#define PREFAULT_MAX_REGIONS (PREFAULT_MAX_TIERS + 1) /* and the catalog */

struct prefault_mem {
	uint8_t *base;
	uint64_t size;
	const char *name;
	bool catalog;      /* progress: store_note_catalog_prefaulted() */
};

struct prefault {
	pthread_t th;
	struct store *st;
	bool stop; /* atomic */
	struct prefault_mem mem[PREFAULT_MAX_REGIONS];
	unsigned n;
};

static void *prefault_main(void *arg)
{
	struct prefault *pf = arg;
	uint64_t before = 0; /* the tiers done */

	loop_helper_thread("prefault", LOOP_HELPER_LOW);
	for (unsigned i = 0; i < pf->n; i++) {
		usec_t t0 = mono_us();
		uint64_t off, size = pf->mem[i].size;
		uint8_t *base = pf->mem[i].base;

		for (off = 0; off < size && !__atomic_load_n(&pf->stop, __ATOMIC_RELAXED);
		     off += PREFAULT_STEP) {
			uint64_t n = size - off < PREFAULT_STEP ? size - off : PREFAULT_STEP;

			for (uint64_t p = 0; p < n; p += 4096)
				__atomic_fetch_or(base + off + p, 0, __ATOMIC_RELAXED);
			if (pf->mem[i].catalog)
				store_note_catalog_prefaulted(pf->st, off + n);
			else
				store_note_prefaulted(pf->st, before + off + n);
			loop_mm_pause();
		}
		if (off >= size)
			log_info("%s%s: %llu MiB faulted in (%llu ms)", pf->mem[i].name,
				 pf->mem[i].catalog ? "" : " tier",
				 (unsigned long long) (size >> 20),
				 (unsigned long long) ((mono_us() - t0) / USEC_PER_MSEC));
		if (!pf->mem[i].catalog)
			before += size;
	}
	return NULL;
}

int prefault_start(struct store *st, struct prefault **ret)
{
	struct prefault *pf;

	*ret = NULL;
	if (store_config(st)->prefault == SHM_HUGEPAGES_OFF)
		return 0;
	pf = calloc(1, sizeof(*pf));
	if (!pf)
		return 0; /* only slower */
	pf->st = st;
	/* the start of the catalog first (a few MiB: the loop writes an entry
	 * there at every commit, and would fault its pages in one by one),
	 * then the memory tiers, in segment order */
	{
		uint64_t size;
		uint8_t *base = store_catalog_memory(st, &size);

		if (base)
			pf->mem[pf->n++] = (struct prefault_mem) { base, size, "catalog", true };
	}
	for (unsigned i = 0; i < store_tier_count(st) && pf->n < PREFAULT_MAX_REGIONS; i++) {
		const struct tier *t = store_tier(st, i);
		uint64_t size;
		uint8_t *base = store_tier_memory(t, &size);

		if (!base)
			break; /* the disk tier: no memory */
		pf->mem[pf->n++] = (struct prefault_mem) { base, size, store_tier_name(t) };
	}
	if (pthread_create(&pf->th, NULL, prefault_main, pf) != 0) {
		free(pf);
		return 0;
	}
	*ret = pf;
	return 0;
}

void prefault_stop(struct prefault *pf)
{
	if (!pf)
		return;
	__atomic_store_n(&pf->stop, true, __ATOMIC_RELAXED);
	pthread_join(pf->th, NULL);
	free(pf);
}

