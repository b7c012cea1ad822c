/* SPDX-License-Identifier: MIT */
/* What an etcd endpoint answers (net/etcd.c): each answer the client
 * reads (a lease granted or renewed, a compare-and-create, a range, a
 * list) and a watch's stream, from whatever listens at the address it
 * was given. */
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	etcd_fuzz_answer(data, size);
	return 0;
}
