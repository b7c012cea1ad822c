/* SPDX-License-Identifier: MIT */
/* Peer frames as a master or node reads them off TCP: a byte stream cut
 * into frames by pconn_next(), each payload decoded and checked by
 * peer_msg_decode() against the type its header names, and decoded again
 * into an arena (peer_msg_decode_in(), as a node decodes a lookup's
 * answer): both must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "peer-conn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pconn c;
	struct peer_arena ar;
	struct peer_hdr h;
	const uint8_t *payload;
	int sv[2];

	if (size > (1u << 20) || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
		return 0;
	if (size && write(sv[1], data, size) != (ssize_t) size) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	close(sv[1]);
	pconn_init(&c, sv[0], 1u << 20);
	peer_arena_init(&ar);
	pconn_read(&c); /* ends with -ECONNRESET: the writer is gone */
	for (;;) {
		ProtobufCMessage *m;
		int r = pconn_next(&c, &h, &payload);

		if (r <= 0)
			break;
		if (h.len > PEER_MAX_PAYLOAD || h.type == 0 || h.type > PEER_TYPE_MAX)
			__builtin_trap();
		int plain = peer_msg_decode(h.type, payload, h.len, &m), in_arena;
		ProtobufCMessage *am;

		in_arena = peer_msg_decode_in(&ar, h.type, payload, h.len, &am);
		if (in_arena != plain)
			__builtin_trap();
		if (in_arena == 0 && protobuf_c_message_get_packed_size(am) !=
				     (plain == 0 ? protobuf_c_message_get_packed_size(m) : 0))
			__builtin_trap();
		peer_arena_reset(&ar);
		if (plain == 0) {
			/* what the decoder accepts holds the limits */
			if (h.type == PEER_PUBLISH) {
				const Kvc__Peer__Publish *p = (const void *) m;

				if (p->n_entries > PEER_MAX_BATCH)
					__builtin_trap();
				for (size_t i = 0; i < p->n_entries; i++)
					if (!p->entries[i]->key.len ||
					    p->entries[i]->key.len > PEER_MAX_KEY)
						__builtin_trap();
			}
			protobuf_c_message_free_unpacked(m, NULL);
		}
	}
	pconn_done(&c);
	peer_arena_done(&ar);
	return 0;
}
