/* SPDX-License-Identifier: MIT */
/* Re-run a fuzz target over its corpus as a regression test: every file
 * under the given directories goes through LLVMFuzzerTestOneInput() once,
 * under whatever sanitizers the build has. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return -errno;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(n > 0 ? (size_t) n : 1);
	if (!buf || fread(buf, 1, (size_t) n, f) != (size_t) n) {
		free(buf);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t) n);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned count = 0;

	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		struct dirent *e;

		if (!d) {
			fprintf(stderr, "cannot open corpus %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		while ((e = readdir(d))) {
			char path[4096];
			struct stat st;

			snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
			if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
				continue;
			if (run_file(path) < 0) {
				fprintf(stderr, "cannot read %s\n", path);
				closedir(d);
				return 1;
			}
			count++;
		}
		closedir(d);
	}
	printf("%u corpus inputs ran clean\n", count);
	return count > 0 ? 0 : 1;
}
