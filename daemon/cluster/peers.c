/* SPDX-License-Identifier: MIT */
/*
 * What this node knows of each peer it moved bytes with: transfers and
 * errors by direction (kvcachectl stats, peer.<address>.*), and whether a
 * fetch from it timed out lately (its other holders are asked first until
 * then, rfetch.c).  A fixed table: a peer past MAX_PEER_STATS is simply
 * not counted.
 */
#include <stdio.h>
#include <string.h>

#include "node-private.h"

struct peer_stat *node_peer_stat(struct node *n, const char *addr)
{
	for (unsigned i = 0; i < n->pstats.n; i++)
		if (strcmp(n->pstats.s[i].addr, addr) == 0)
			return &n->pstats.s[i];
	if (n->pstats.n == MAX_PEER_STATS)
		return NULL;
	struct peer_stat *p = &n->pstats.s[n->pstats.n++];
	*p = (struct peer_stat) { 0 };
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	return p;
}
