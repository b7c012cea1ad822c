/* SPDX-License-Identifier: MIT */
/* The frame decoder: header checks, then the payload of every frame type,
 * then request validation, exactly as the daemon and the library apply them
 * to bytes from the socket. */
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *payload;
	struct wire_hdr h;
	const char *why;

	if (wire_frame_parse(data, size, &h, &payload) < 0)
		return 0;
	switch (h.type) {
	case WIRE_HELLO: {
		Kvc__Hello *m = kvc__hello__unpack(NULL, h.len, payload);

		if (m)
			kvc__hello__free_unpacked(m, NULL);
		break;
	}
	case WIRE_WELCOME: {
		Kvc__Welcome *m = kvc__welcome__unpack(NULL, h.len, payload);

		if (m)
			kvc__welcome__free_unpacked(m, NULL);
		break;
	}
	case WIRE_REQUEST: {
		Kvc__Request *q;

		if (wire_request_decode(payload, h.len, &q, &why) == 0) {
			/* validated requests hold the invariants the daemon relies on */
			if (q->body_case == KVC__REQUEST__BODY_KEY &&
			    (q->key->key.len == 0 || q->key->key.len > WIRE_MAX_KEY))
				__builtin_trap();
			if (q->body_case == KVC__REQUEST__BODY_REMOVE &&
			    (q->remove->prefix.len > WIRE_MAX_KEY ||
			     (q->remove->flags & ~(uint32_t) WIRE_REMOVE_KNOWN)))
				__builtin_trap();
			kvc__request__free_unpacked(q, NULL);
		}
		break;
	}
	case WIRE_RESPONSE: {
		Kvc__Response *m = kvc__response__unpack(NULL, h.len, payload);

		if (m)
			kvc__response__free_unpacked(m, NULL);
		break;
	}
	default:
		break;
	}
	return 0;
}
