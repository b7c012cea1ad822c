/* SPDX-License-Identifier: MIT */
/*
 * The cluster secret (--cluster-secret-file): each side of a connection
 * sends a random nonce and proves it knows the secret with an HMAC-SHA-256
 * of the other side's nonce, so the secret itself never crosses the wire
 * and a recorded proof is worth nothing on another connection.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "peer-wire.h"

#define PEER_SECRET_MAX 4096

struct peer_secret {
	uint8_t key[PEER_SECRET_MAX];
	size_t len;        /* 0: no secret */
};

/* Read FILE: 0, or -errno with err saying why (missing, empty, too long,
 * readable by others: refused, as ssh refuses a key). */
int peer_secret_load(const char *path, struct peer_secret *ret, char *err, size_t err_len);
void peer_nonce(uint8_t out[PEER_NONCE_SIZE]);
void peer_proof(const struct peer_secret *s, const uint8_t *nonce, size_t nonce_len,
		uint8_t out[PEER_PROOF_SIZE]);
/* In constant time. */
bool peer_proof_ok(const struct peer_secret *s, const uint8_t *nonce, size_t nonce_len,
		   const uint8_t *proof, size_t proof_len);
