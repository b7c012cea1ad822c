/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer-auth.h"

static const char domain[] = "kvcache peer v1";

int peer_secret_load(const char *path, struct peer_secret *ret, char *err, size_t err_len)
{
	struct stat st;
	ssize_t n;
	int fd;

	if (sodium_init() < 0) {
		snprintf(err, err_len, "cannot initialise libsodium");
		return -EIO;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 || fstat(fd, &st) < 0) {
		int e = errno;

		snprintf(err, err_len, "--cluster-secret-file %s: %s", path, strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		snprintf(err, err_len, "--cluster-secret-file %s: %s", path,
			 !S_ISREG(st.st_mode) ? "not a regular file"
					      : "readable by others: chmod 600 it");
		close(fd);
		return -EPERM;
	}
	n = read(fd, ret->key, sizeof(ret->key));
	close(fd);
	if (n <= 0 || (size_t) n == sizeof(ret->key)) {
		snprintf(err, err_len, "--cluster-secret-file %s: %s", path,
			 n <= 0 ? "empty or unreadable" : "longer than 4095 bytes");
		return -EINVAL;
	}
	/* a trailing newline is not part of the secret */
	while (n > 0 && (ret->key[n - 1] == '\n' || ret->key[n - 1] == '\r'))
		n--;
	if (n < 16) {
		snprintf(err, err_len, "--cluster-secret-file %s: shorter than 16 bytes", path);
		return -EINVAL;
	}
	ret->len = (size_t) n;
	return 0;
}

void peer_nonce(uint8_t out[PEER_NONCE_SIZE])
{
	randombytes_buf(out, PEER_NONCE_SIZE);
}

void peer_proof(const struct peer_secret *s, const uint8_t *nonce, size_t nonce_len,
		uint8_t out[PEER_PROOF_SIZE])
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, s->key, s->len);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *) domain, sizeof(domain));
	crypto_auth_hmacsha256_update(&st, nonce, nonce_len);
	crypto_auth_hmacsha256_final(&st, out);
}

bool peer_proof_ok(const struct peer_secret *s, const uint8_t *nonce, size_t nonce_len,
		   const uint8_t *proof, size_t proof_len)
{
	uint8_t want[PEER_PROOF_SIZE];

	if (!s->len || proof_len != PEER_PROOF_SIZE || nonce_len != PEER_NONCE_SIZE)
		return false;
	peer_proof(s, nonce, nonce_len, want);
	return sodium_memcmp(want, proof, PEER_PROOF_SIZE) == 0;
}
