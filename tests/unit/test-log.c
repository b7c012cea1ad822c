/* SPDX-License-Identifier: MIT */
/* Log lines with an errno (": <what it says>" after the message, -|err|
 * returned) and rate-limited ones (a call site repeated at once writes one
 * line; what it stood for is said on its next line, an interval later).
 * stderr goes to a file here. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define LOG_TOPIC "test"
#include "log.h"

static unsigned count_lines(FILE *f, const char *needle)
{
	char line[1200];
	unsigned n = 0;

	fflush(stderr);
	rewind(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	return n;
}

static void warn_often(int i)
{
	log_warn_ratelimited("peer %d sent garbage", i);
}

int main(void)
{
	FILE *f = tmpfile();
	int saved = dup(2);

	CHECK(f != NULL && saved >= 0);
	CHECK(dup2(fileno(f), 2) == 2);
	CHECK_EQ(log_configure("info"), 0);

	CHECK_EQ(log_error_errno(ENOENT, "opening %s", "x"), -ENOENT);
	CHECK_EQ(log_warn_errno(-EACCES, "opening %s", "y"), -EACCES);
	for (int i = 0; i < 100; i++)
		warn_often(i);
	log_msg(LOG_LVL_WARN, "test", "a line of its own");
	CHECK(dup2(saved, 2) == 2);

	CHECK_EQ(count_lines(f, "opening x: No such file or directory"), 1);
	CHECK_EQ(count_lines(f, "opening y: Permission denied"), 1);
	/* one line for the hundred, the first one's */
	CHECK_EQ(count_lines(f, "sent garbage"), 1);
	CHECK_EQ(count_lines(f, "peer 0 sent garbage"), 1);
	CHECK_EQ(count_lines(f, "a line of its own"), 1);

	/* the next interval's line says how many it stood for */
	{
		struct log_ratelimit rl = { 0 };

		CHECK(dup2(fileno(f), 2) == 2);
		log_msg_ratelimited(&rl, LOG_LVL_WARN, "test", "again %d", 1);
		log_msg_ratelimited(&rl, LOG_LVL_WARN, "test", "again %d", 2);
		log_msg_ratelimited(&rl, LOG_LVL_WARN, "test", "again %d", 3);
		rl.next = 0; /* as if the interval were over */
		log_msg_ratelimited(&rl, LOG_LVL_WARN, "test", "again %d", 4);
		CHECK(dup2(saved, 2) == 2);
		CHECK_EQ(count_lines(f, "again "), 2);
		CHECK_EQ(count_lines(f, "again 4 (2 more like it in the last 10 s)"), 1);
	}
	printf("ok\n");
	return 0;
}
