/* SPDX-License-Identifier: MIT */
/* The on-disk record parser: what kvcached reads from its disk directory at
 * start (and from every record it loads) is checked by disk_record_check()
 * before anything else looks at it. */
#include <stdint.h>
#include <string.h>

#include "disk-record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct disk_record_hdr h;

	/* the file may claim to be longer than what was read */
	for (uint64_t file = size; file <= (uint64_t) size + 8192; file += 4096)
		if (disk_record_check(data, size, file, &h) == 0) {
			/* what a valid header promises holds */
			if (h.key_len == 0 || h.key_len > 511 || sizeof(h) + h.key_len > size ||
			    disk_record_size(h.key_len, h.stored_len) > file ||
			    disk_record_header_sum(&h, data + sizeof(h)) != h.header_sum)
				__builtin_trap();
		}
	return 0;
}
