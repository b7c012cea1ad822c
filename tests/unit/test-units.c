/* SPDX-License-Identifier: MIT */
#include "helpers.h"
#include "shmem.h"

static uint64_t size_of(const char *s)
{
	uint64_t v = 0;

	CHECK_EQ(shm_parse_size(s, &v), 0);
	return v;
}

int main(void)
{
	uint64_t v;
	char buf[200];

	CHECK_EQ(size_of("4096"), 4096);
	CHECK_EQ(size_of("512MB"), UINT64_C(512) << 20);
	CHECK_EQ(size_of("1GB"), UINT64_C(1) << 30);
	CHECK_EQ(size_of("1GiB"), UINT64_C(1) << 30);
	CHECK_EQ(size_of("1gib"), UINT64_C(1) << 30);
	CHECK_EQ(size_of("30000000000"), UINT64_C(30000000000));
	CHECK_EQ(size_of(" 2 GB "), UINT64_C(2) << 30);
	CHECK_EQ(size_of("1.5GB"), UINT64_C(3) << 29);
	CHECK_EQ(size_of("64k"), 65536);
	CHECK_EQ(size_of("1T"), UINT64_C(1) << 40);
	CHECK_EQ(size_of("0"), 0);
	CHECK_EQ(size_of("7B"), 7);
	CHECK_EQ(size_of("18446744073709551615"), UINT64_MAX);

	CHECK_EQ(shm_parse_size("", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("abc", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("-1", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("12XB", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("1 G B", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("1GBx", &v), -EINVAL);
	CHECK_EQ(shm_parse_size(".", &v), -EINVAL);
	CHECK_EQ(shm_parse_size("18446744073709551616", &v), -ERANGE);
	CHECK_EQ(shm_parse_size("99999999999999999999", &v), -ERANGE);
	CHECK_EQ(shm_parse_size("16777216T", &v), -ERANGE);
	CHECK_EQ(shm_parse_size(NULL, &v), -EINVAL);

	/* socket path resolution order */
	unsetenv("KVCACHE_SOCKET");
	unsetenv("XDG_RUNTIME_DIR");
	CHECK_EQ(shm_socket_path("/x/y.sock", buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "/x/y.sock") == 0);
	CHECK_EQ(shm_socket_path(NULL, buf, sizeof(buf)), 0);
	CHECK(strncmp(buf, "/tmp/kvcached-", 14) == 0);
	setenv("XDG_RUNTIME_DIR", "/run/user/5", 1);
	CHECK_EQ(shm_socket_path(NULL, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "/run/user/5/kvcached.sock") == 0);
	setenv("KVCACHE_SOCKET", "/s.sock", 1);
	CHECK_EQ(shm_socket_path(NULL, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "/s.sock") == 0);
	memset(buf, 'a', 150);
	buf[150] = '\0';
	{
		char out[200];

		CHECK_EQ(shm_socket_path(buf, out, sizeof(out)), -ENAMETOOLONG);
	}
	return 0;
}
