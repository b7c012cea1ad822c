/* SPDX-License-Identifier: MIT */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "peer-wire.h"

uint8_t peer_major = PEER_MAJOR;

void peer_hdr_encode(const struct peer_hdr *h, uint8_t out[PEER_HDR_SIZE])
{
	uint16_t magic = htole16(PEER_MAGIC);
	uint32_t len = htole32(h->len), seq = htole32(h->seq), flags = htole32(h->flags);

	memcpy(out, &magic, 2);
	out[2] = h->version;
	out[3] = h->type;
	memcpy(out + 4, &len, 4);
	memcpy(out + 8, &seq, 4);
	memcpy(out + 12, &flags, 4);
}

int peer_hdr_decode(const uint8_t in[PEER_HDR_SIZE], size_t max_payload, struct peer_hdr *ret)
{
	uint16_t magic;
	uint32_t len, seq, flags;

	memcpy(&magic, in, 2);
	memcpy(&len, in + 4, 4);
	memcpy(&seq, in + 8, 4);
	memcpy(&flags, in + 12, 4);
	if (le16toh(magic) == PEER_MAGIC && in[2] != peer_major) {
		ret->version = in[2]; /* a peer of another major: say which */
		return -EPROTONOSUPPORT;
	}
	if (le16toh(magic) != PEER_MAGIC || in[3] == 0 || in[3] > PEER_TYPE_MAX || flags != 0)
		return -EPROTO;
	if (le32toh(len) > max_payload)
		return -EMSGSIZE;
	*ret = (struct peer_hdr) { .version = in[2], .type = in[3], .len = le32toh(len),
				   .seq = le32toh(seq), .flags = 0 };
	return 0;
}

int peer_frame_pack(uint8_t type, uint32_t seq, const ProtobufCMessage *msg, uint8_t **ret_buf,
		    size_t *ret_len)
{
	size_t plen = protobuf_c_message_get_packed_size(msg);
	struct peer_hdr h = { .version = peer_major, .type = type, .seq = seq };
	uint8_t *buf;

	if (plen > PEER_MAX_PAYLOAD)
		return -EMSGSIZE;
	buf = malloc(PEER_HDR_SIZE + plen);
	if (!buf)
		return -ENOMEM;
	h.len = (uint32_t) plen;
	peer_hdr_encode(&h, buf);
	protobuf_c_message_pack(msg, buf + PEER_HDR_SIZE);
	*ret_buf = buf;
	*ret_len = PEER_HDR_SIZE + plen;
	return 0;
}

int peer_key_check(const ProtobufCBinaryData *key)
{
	if (key->len == 0 || key->len > PEER_MAX_KEY || memchr(key->data, 0, key->len))
		return -EINVAL;
	return 0;
}

static bool str_ok(const char *s)
{
	return !s || strnlen(s, PEER_MAX_ID + 1) <= PEER_MAX_ID;
}

static bool load_ok(const Kvc__Peer__NodeLoad *l)
{
	return !l || l->used <= UINT64_MAX / 2;
}

/* A pool's RDMA description: bounded blobs, regions that do not wrap
 * around the address space, each segment index once. */
static bool rdma_ok(const Kvc__Peer__RdmaInfo *r)
{
	uint32_t seen = 0;

	if (!r->worker.len || r->worker.len > PEER_MAX_RDMA_BLOB || !str_ok(r->device) ||
	    r->n_regions == 0 || r->n_regions > PEER_MAX_REGIONS)
		return false;
	for (size_t i = 0; i < r->n_regions; i++) {
		const Kvc__Peer__RdmaRegion *g = r->regions[i];

		if (g->id >= PEER_MAX_REGIONS || (seen & (1u << g->id)) || !g->size ||
		    g->addr > UINT64_MAX - g->size || !g->rkey.len ||
		    g->rkey.len > PEER_MAX_RDMA_BLOB)
			return false;
		seen |= 1u << g->id;
	}
	return true;
}

/* A batch of keys: at most PEER_MAX_BATCH, each a valid key. */
static int keys_ok(const ProtobufCBinaryData *keys, size_t n)
{
	if (n > PEER_MAX_BATCH)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (peer_key_check(&keys[i]) < 0)
			return -EINVAL;
	return 0;
}

/* A Remove or Drop: keys, or a prefix (no NUL), or all; at a version. */
static int removal_ok(const ProtobufCBinaryData *keys, size_t n, const ProtobufCBinaryData *prefix,
		      bool all, uint64_t version)
{
	if (prefix->len > PEER_MAX_KEY || (prefix->len && memchr(prefix->data, 0, prefix->len)) ||
	    (n && (prefix->len || all)) || !version)
		return -EINVAL;
	return keys_ok(keys, n);
}

static int check(uint8_t type, const ProtobufCMessage *m)
{
	switch (type) {
	case PEER_HELLO: {
		const Kvc__Peer__Hello *x = (const void *) m;

		if (!str_ok(x->node_id) || (x->nonce.len && x->nonce.len != PEER_NONCE_SIZE) ||
		    x->role < PEER_ROLE_NODE || x->role > PEER_ROLE_TOOL)
			return -EINVAL;
		return 0;
	}
	case PEER_HELLO_ACK: {
		const Kvc__Peer__HelloAck *x = (const void *) m;

		return str_ok(x->error_msg) && (!x->proof.len || x->proof.len == PEER_PROOF_SIZE) &&
		       (!x->nonce.len || x->nonce.len == PEER_NONCE_SIZE) && x->error <= 0 ? 0 : -EINVAL;
	}
	case PEER_JOIN: {
		const Kvc__Peer__Join *x = (const void *) m;

		if (!x->node_id || !x->node_id[0] || !str_ok(x->node_id) || !x->address ||
		    !x->address[0] || !str_ok(x->address) || !str_ok(x->transport) ||
		    !load_ok(x->load))
			return -EINVAL;
		return 0;
	}
	case PEER_MEMBERS: {
		const Kvc__Peer__Members *x = (const void *) m;

		if (x->n_members > PEER_MAX_MEMBERS || !str_ok(x->error_msg) || x->error > 0)
			return -EINVAL;
		for (size_t i = 0; i < x->n_members; i++) {
			const Kvc__Peer__Member *y = x->members[i];

			if (!y->node_id || !y->node_id[0] || !str_ok(y->node_id) || !str_ok(y->address) ||
			    !str_ok(y->transport) || y->state < PEER_STATE_UP ||
			    y->state > PEER_STATE_DOWN || !load_ok(y->load))
				return -EINVAL;
		}
		return 0;
	}
	case PEER_HEARTBEAT:
		return load_ok(((const Kvc__Peer__Heartbeat *) m)->load) ? 0 : -EINVAL;
	case PEER_PUBLISH: {
		const Kvc__Peer__Publish *x = (const void *) m;

		if (x->n_entries > PEER_MAX_BATCH)
			return -EINVAL;
		for (size_t i = 0; i < x->n_entries; i++)
			if (peer_key_check(&x->entries[i]->key) < 0)
				return -EINVAL;
		return 0;
	}
	case PEER_WITHDRAW:
		return keys_ok(((const Kvc__Peer__Withdraw *) m)->keys,
			       ((const Kvc__Peer__Withdraw *) m)->n_keys);
	case PEER_LOOKUP:
		return keys_ok(((const Kvc__Peer__Lookup *) m)->keys,
			       ((const Kvc__Peer__Lookup *) m)->n_keys);
	case PEER_REMOVE: {
		const Kvc__Peer__Remove *x = (const void *) m;

		return removal_ok(x->keys, x->n_keys, &x->prefix, x->all, x->version);
	}
	case PEER_DROP: {
		const Kvc__Peer__Drop *x = (const void *) m;

		return removal_ok(x->keys, x->n_keys, &x->prefix, x->all, x->version);
	}
	case PEER_LOOKUP_RESP: {
		const Kvc__Peer__LookupResp *x = (const void *) m;

		if (x->n_locations > PEER_MAX_BATCH || x->error > 0)
			return -EINVAL;
		for (size_t i = 0; i < x->n_locations; i++) {
			const Kvc__Peer__Location *y = x->locations[i];

			if (peer_key_check(&y->key) < 0 || y->n_holders != y->n_addresses ||
			    y->n_holders > PEER_MAX_MEMBERS)
				return -EINVAL;
			for (size_t j = 0; j < y->n_holders; j++)
				if (!str_ok(y->holders[j]) || !str_ok(y->addresses[j]))
					return -EINVAL;
		}
		return 0;
	}
	case PEER_PUSH: {
		const Kvc__Peer__Push *x = (const void *) m;

		return peer_key_check(&x->key) == 0 && x->len && x->len <= PEER_MAX_OBJECT ? 0
											    : -EINVAL;
	}
	case PEER_PUSH_READY:
	case PEER_PUSH_DONE:
		return ((const Kvc__Peer__PushReply *) m)->error <= 0 &&
		       ((const Kvc__Peer__PushReply *) m)->region < PEER_MAX_REGIONS ? 0 : -EINVAL;
	case PEER_AUTH:
		return ((const Kvc__Peer__Auth *) m)->proof.len == PEER_PROOF_SIZE ? 0 : -EINVAL;
	case PEER_FETCH: {
		const Kvc__Peer__Fetch *x = (const void *) m;

		return peer_key_check(&x->key) == 0 && x->len <= PEER_MAX_OBJECT ? 0 : -EINVAL;
	}
	case PEER_FETCH_RESP: {
		const Kvc__Peer__FetchResp *x = (const void *) m;

		return x->error <= 0 && x->len <= PEER_MAX_OBJECT && (!x->error || !x->len) &&
		       x->region < PEER_MAX_REGIONS && x->offset <= PEER_MAX_OBJECT * 64 ? 0 : -EINVAL;
	}
	case PEER_FETCH_DONE:
		return ((const Kvc__Peer__FetchDone *) m)->error <= 0 ? 0 : -EINVAL;
	case PEER_RDMA_INFO:
		return rdma_ok((const Kvc__Peer__RdmaInfo *) m) ? 0 : -EINVAL;
	}
	return -EPROTO;
}

static const ProtobufCMessageDescriptor *descriptor(uint8_t type)
{
	switch (type) {
	case PEER_HELLO: return &kvc__peer__hello__descriptor;
	case PEER_HELLO_ACK: return &kvc__peer__hello_ack__descriptor;
	case PEER_JOIN: return &kvc__peer__join__descriptor;
	case PEER_MEMBERS: return &kvc__peer__members__descriptor;
	case PEER_HEARTBEAT: return &kvc__peer__heartbeat__descriptor;
	case PEER_PUBLISH: return &kvc__peer__publish__descriptor;
	case PEER_WITHDRAW: return &kvc__peer__withdraw__descriptor;
	case PEER_LOOKUP: return &kvc__peer__lookup__descriptor;
	case PEER_LOOKUP_RESP: return &kvc__peer__lookup_resp__descriptor;
	case PEER_FETCH: return &kvc__peer__fetch__descriptor;
	case PEER_FETCH_RESP: return &kvc__peer__fetch_resp__descriptor;
	case PEER_AUTH: return &kvc__peer__auth__descriptor;
	case PEER_PUSH: return &kvc__peer__push__descriptor;
	case PEER_PUSH_READY:
	case PEER_PUSH_DONE: return &kvc__peer__push_reply__descriptor;
	case PEER_FETCH_DONE: return &kvc__peer__fetch_done__descriptor;
	case PEER_RDMA_INFO: return &kvc__peer__rdma_info__descriptor;
	case PEER_REMOVE: return &kvc__peer__remove__descriptor;
	case PEER_DROP: return &kvc__peer__drop__descriptor;
	}
	return NULL;
}

static int decode(uint8_t type, const uint8_t *payload, size_t len, ProtobufCAllocator *a,
		  ProtobufCMessage **ret)
{
	const ProtobufCMessageDescriptor *d = descriptor(type);
	ProtobufCMessage *m;
	int r;

	if (!d || len > PEER_MAX_PAYLOAD)
		return -EPROTO;
	m = protobuf_c_message_unpack(d, a, len, payload);
	if (!m)
		return -EPROTO;
	r = check(type, m);
	if (r < 0) {
		protobuf_c_message_free_unpacked(m, a);
		return r;
	}
	*ret = m;
	return 0;
}

int peer_msg_decode(uint8_t type, const uint8_t *payload, size_t len, ProtobufCMessage **ret)
{
	return decode(type, payload, len, NULL, ret);
}

/* ---- the arena ---- */

#define ARENA_MIN (64u << 10)
#define ARENA_MAX (16u << 20) /* kept between frames */

/* Under AddressSanitizer each piece is its own allocation, so a read past
 * one is still caught (a block would hide it). */
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_PIECES 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_PIECES 1
#endif
#endif
#ifndef ARENA_PIECES
#define ARENA_PIECES 0
#endif

struct peer_arena_more {
	struct peer_arena_more *next;
	max_align_t data[];
};

static void *arena_alloc(void *u, size_t size)
{
	struct peer_arena *ar = u;
	struct peer_arena_more *x;

	size = (size + 15) & ~(size_t) 15;
	if (!ARENA_PIECES && size <= ar->cap - ar->used) {
		void *p = ar->block + ar->used;

		ar->used += size;
		return p;
	}
	x = malloc(sizeof(*x) + size);
	if (!x)
		return NULL;
	x->next = ar->more;
	ar->more = x;
	ar->more_bytes += size;
	return x->data;
}

static void arena_free(void *u, void *p)
{
	(void) u;
	(void) p; /* all of it goes at the reset */
}

void peer_arena_init(struct peer_arena *ar)
{
	*ar = (struct peer_arena) { .alloc = { arena_alloc, arena_free, ar } };
}

static void free_more(struct peer_arena *ar)
{
	while (ar->more) {
		struct peer_arena_more *x = ar->more;

		ar->more = x->next;
		free(x);
	}
	ar->more_bytes = 0;
}

void peer_arena_reset(struct peer_arena *ar)
{
	size_t need = ar->used + ar->more_bytes;

	free_more(ar);
	ar->used = 0;
	if (need > ar->cap && need <= ARENA_MAX) {
		size_t cap = ar->cap ? ar->cap : ARENA_MIN;
		uint8_t *b;

		while (cap < need)
			cap *= 2;
		b = malloc(cap); /* nothing in the old block is live */
		if (b) {
			free(ar->block);
			ar->block = b;
			ar->cap = cap;
		}
	}
}

void peer_arena_done(struct peer_arena *ar)
{
	free_more(ar);
	free(ar->block);
	peer_arena_init(ar);
}

int peer_msg_decode_in(struct peer_arena *ar, uint8_t type, const uint8_t *payload, size_t len,
		       ProtobufCMessage **ret)
{
	return decode(type, payload, len, &ar->alloc, ret);
}
