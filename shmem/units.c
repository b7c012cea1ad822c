/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>

#include "shmem.h"

static const struct {
	const char *suffix;
	unsigned shift;
} suffixes[] = {
	{ "", 0 },    { "b", 0 },
	{ "k", 10 },  { "kb", 10 }, { "kib", 10 },
	{ "m", 20 },  { "mb", 20 }, { "mib", 20 },
	{ "g", 30 },  { "gb", 30 }, { "gib", 30 },
	{ "t", 40 },  { "tb", 40 }, { "tib", 40 },
};

int shm_parse_size(const char *s, uint64_t *ret)
{
	uint64_t whole = 0, frac_num = 0, frac_den = 1, v;
	const char *p = s;
	char unit[4];
	size_t n = 0;
	unsigned shift = 64;
	bool digits = false;

	if (!s)
		return -EINVAL;
	while (isspace((unsigned char) *p))
		p++;
	for (; isdigit((unsigned char) *p); p++) {
		uint64_t digit = (uint64_t) (*p - '0');

		if (whole > UINT64_MAX / 10 || (whole == UINT64_MAX / 10 && digit > UINT64_MAX % 10))
			return -ERANGE;
		whole = whole * 10 + digit;
		digits = true;
	}
	if (*p == '.') {
		p++;
		for (; isdigit((unsigned char) *p); p++) {
			if (frac_den < UINT64_C(1000000000)) {
				frac_num = frac_num * 10 + (uint64_t) (*p - '0');
				frac_den *= 10;
			}
			digits = true;
		}
	}
	if (!digits)
		return -EINVAL;
	while (isspace((unsigned char) *p))
		p++;
	while (*p && !isspace((unsigned char) *p)) {
		if (n == sizeof(unit) - 1)
			return -EINVAL;
		unit[n++] = (char) tolower((unsigned char) *p++);
	}
	unit[n] = '\0';
	while (isspace((unsigned char) *p))
		p++;
	if (*p)
		return -EINVAL;

	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
		if (strcmp(unit, suffixes[i].suffix) == 0)
			shift = suffixes[i].shift;
	if (shift == 64)
		return -EINVAL;
	if (shift && whole > (UINT64_MAX >> shift))
		return -ERANGE;
	v = whole << shift;
	if (frac_num) {
		/* frac_num / frac_den < 1, so this cannot overflow 2^64 */
		uint64_t f = (uint64_t) (((unsigned __int128) frac_num << shift) / frac_den);

		if (v > UINT64_MAX - f)
			return -ERANGE;
		v += f;
	}
	*ret = v;
	return 0;
}

int shm_socket_path(const char *override, char *buf, size_t len)
{
	const char *e;
	int n;

	if (override && *override)
		n = snprintf(buf, len, "%s", override);
	else if ((e = getenv("KVCACHE_SOCKET")) && *e)
		n = snprintf(buf, len, "%s", e);
	else if ((e = getenv("XDG_RUNTIME_DIR")) && *e)
		n = snprintf(buf, len, "%s/kvcached.sock", e);
	else
		n = snprintf(buf, len, "/tmp/kvcached-%u.sock", (unsigned) getuid());
	if (n < 0)
		return -EINVAL;
	if ((size_t) n >= len || (size_t) n >= sizeof(((struct sockaddr_un *) 0)->sun_path))
		return -ENAMETOOLONG;
	return 0;
}
