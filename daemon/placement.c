/* SPDX-License-Identifier: MIT */
/*
 * --numa-node: where the pool's memory and the daemon's threads live.  A
 * node number is checked against the machine; auto is the node of the
 * RDMA device the cluster will use (sysfs), or nothing without one.  The
 * memory tiers are bound when they are made (core/tier.c); the threads by
 * binding this one before it starts any that move data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvc-config.h"
#if KVC_HAVE_NUMA
#include <numa.h>
#endif

#include "log.h"
#include "placement.h"
#include "rdma.h"

#define LOG_TOPIC "main"

#if KVC_HAVE_NUMA
/* The NUMA node of an RDMA device ("mlx5_0:1"), or -1. */
static int device_node(const char *dev)
{
	char name[64], path[160];
	int node = -1;
	FILE *f;

	snprintf(name, sizeof(name), "%s", dev);
	name[strcspn(name, ":")] = '\0';
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/numa_node", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1)
		node = -1;
	fclose(f);
	return node;
}
#endif

int placement_resolve(const struct config *cfg, int *ret_node, char *err, size_t err_len)
{
	const char *want = cfg->numa_node;

	*ret_node = -1;
	if (!want[0])
		return 0;
#if !KVC_HAVE_NUMA
	snprintf(err, err_len, "--numa-node %s: this kvcached was built without libnuma", want);
	return -EINVAL;
#else
	char *end;
	long node;

	if (!strcmp(want, "auto")) {
		char dev[64];

		if (rdma_active_devices(cfg->device_name, dev, sizeof(dev)) <= 0) {
			log_info("--numa-node auto: no RDMA device; memory placement left alone");
			return 0;
		}
		node = device_node(dev);
		if (node < 0) {
			log_info("--numa-node auto: %s has no NUMA node; placement left alone", dev);
			return 0;
		}
		log_info("--numa-node auto: node %ld, the node of %s", node, dev);
	} else {
		errno = 0;
		node = strtol(want, &end, 10);
		if (errno || end == want || *end || node < 0) {
			snprintf(err, err_len, "--numa-node %s: expected a node number or auto", want);
			return -EINVAL;
		}
	}
	if (numa_available() < 0) {
		snprintf(err, err_len, "--numa-node %s: NUMA is not available on this machine", want);
		return -EINVAL;
	}
	if (node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned) node)) {
		snprintf(err, err_len, "--numa-node %s: no such node (this machine has node%s 0-%d)",
			 want, numa_max_node() ? "s" : "", numa_max_node());
		return -EINVAL;
	}
	if (numa_run_on_node((int) node) < 0) {
		snprintf(err, err_len, "--numa-node %ld: cannot run there: %s", node, strerror(errno));
		return -EINVAL;
	}
	*ret_node = (int) node;
	return 0;
#endif
}
