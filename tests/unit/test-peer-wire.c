/* SPDX-License-Identifier: MIT */
/* A lookup's answer decoded into an arena: the same message as decoded
 * with malloc, again and again across resets (the first frame needs more
 * than the arena's block, the next ones fit the grown block), and a frame
 * that breaks a limit refused the same way. */
#include "helpers.h"
#include "peer-wire.h"

enum { N = 3000 };

static uint8_t *answer(size_t *ret_len, const char *holder)
{
	static Kvc__Peer__Location locs[N], *lp[N];
	static char keys[N][32];
	char *h[1] = { (char *) holder }, *a[1] = { "10.0.0.1:50052" };
	Kvc__Peer__LookupResp r = KVC__PEER__LOOKUP_RESP__INIT;
	uint8_t *buf;

	for (int i = 0; i < N; i++) {
		kvc__peer__location__init(&locs[i]);
		snprintf(keys[i], sizeof(keys[i]), "key/%d", i);
		locs[i].key = (ProtobufCBinaryData) { strlen(keys[i]), (uint8_t *) keys[i] };
		locs[i].len = (uint64_t) i * 4096;
		locs[i].n_holders = locs[i].n_addresses = 1;
		locs[i].holders = h;
		locs[i].addresses = a;
		lp[i] = &locs[i];
	}
	r.n_locations = N;
	r.locations = lp;
	*ret_len = kvc__peer__lookup_resp__get_packed_size(&r);
	buf = malloc(*ret_len);
	CHECK(buf);
	kvc__peer__lookup_resp__pack(&r, buf);
	return buf;
}

static void same(const Kvc__Peer__LookupResp *x, const Kvc__Peer__LookupResp *y)
{
	CHECK_EQ(x->n_locations, y->n_locations);
	for (size_t i = 0; i < x->n_locations; i++) {
		const Kvc__Peer__Location *a = x->locations[i], *b = y->locations[i];

		CHECK_EQ(a->key.len, b->key.len);
		CHECK(memcmp(a->key.data, b->key.data, a->key.len) == 0);
		CHECK_EQ(a->len, b->len);
		CHECK_EQ(a->n_holders, 1);
		CHECK_EQ(b->n_holders, 1);
		CHECK(strcmp(a->holders[0], b->holders[0]) == 0);
		CHECK(strcmp(a->addresses[0], b->addresses[0]) == 0);
	}
}

int main(void)
{
	struct peer_arena ar;
	ProtobufCMessage *plain, *m;
	size_t len;
	uint8_t *buf = answer(&len, "node-a");

	peer_arena_init(&ar);
	CHECK_EQ(peer_msg_decode(PEER_LOOKUP_RESP, buf, len, &plain), 0);
	for (int round = 0; round < 3; round++) {
		CHECK_EQ(peer_msg_decode_in(&ar, PEER_LOOKUP_RESP, buf, len, &m), 0);
		same((const void *) plain, (const void *) m);
		peer_arena_reset(&ar);
		/* after the first frame the block holds a whole answer */
		CHECK(ar.cap >= len);
		CHECK(!ar.more && !ar.used);
	}
	protobuf_c_message_free_unpacked(plain, NULL);
	free(buf);

	/* a holder name past the limit: refused, and nothing kept */
	{
		char big[300];

		memset(big, 'x', sizeof(big) - 1);
		big[sizeof(big) - 1] = 0;
		buf = answer(&len, big);
		CHECK(peer_msg_decode(PEER_LOOKUP_RESP, buf, len, &plain) < 0);
		CHECK(peer_msg_decode_in(&ar, PEER_LOOKUP_RESP, buf, len, &m) < 0);
		peer_arena_reset(&ar);
		free(buf);
	}
	/* garbage is -EPROTO either way */
	CHECK_EQ(peer_msg_decode_in(&ar, PEER_LOOKUP_RESP, (const uint8_t *) "\xff\xff\xff", 3, &m),
		 -EPROTO);
	peer_arena_done(&ar);
	return 0;
}
