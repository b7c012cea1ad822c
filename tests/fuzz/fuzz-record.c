/* SPDX-License-Identifier: MIT */
/* The on-disk record parser: what kvcached reads from its disk directory at
 * start (and from every record it loads) is checked by disk_record_check()
 * before anything else looks at it; and what a node reads from a shared
 * directory, which any other node may have written, by
 * shared_record_parse(). */
#include <stdint.h>
#include <string.h>

#include "disk-record.h"
#include "shared.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct disk_record_hdr h;
	int r;

	/* the file may claim to be longer than what was read */
	for (uint64_t file = size; file <= (uint64_t) size + 8192; file += 4096)
		if (disk_record_check(data, size, file, &h) == 0) {
			/* what a valid header promises holds */
			if (h.key_len == 0 || h.key_len > 511 || sizeof(h) + h.key_len > size ||
			    disk_record_size(h.key_len, h.stored_len) > file ||
			    disk_record_header_sum(&h, data + sizeof(h)) != h.header_sum)
				__builtin_trap();
		}
	/* asked for the key the record names, and for another */
	for (int k = 0; k < 2; k++) {
		const uint8_t *key = k == 0 && size > sizeof(h) ? data + sizeof(h) : (const uint8_t *) "key";
		uint32_t key_len = k == 0 && size > sizeof(h) ? (uint32_t) ((size - sizeof(h)) % 512) : 3;

		if (k == 0 && size > sizeof(h)) {
			memcpy(&h, data, sizeof(h));
			key_len = h.key_len <= size - sizeof(h) ? h.key_len : 0;
		}
		r = shared_record_parse(data, size, key, key_len, &h);
		if (r == 0 && (h.key_len != key_len || memcmp(data + sizeof(h), key, key_len) ||
			       disk_record_payload_off(h.key_len) + h.value_len > size))
			__builtin_trap();
	}
	return 0;
}
