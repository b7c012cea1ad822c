/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

#define MAX_TOPICS 16

static enum log_level default_level = LOG_LVL_NOTICE;
static struct {
	char name[24];
	enum log_level level;
} topics[MAX_TOPICS];
static unsigned n_topics;

static const char *const names[] = { "error", "warn", "notice", "info", "debug", "trace" };

int log_level_parse(const char *s)
{
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcasecmp(s, names[i]) == 0)
			return (int) i;
	if (strcasecmp(s, "warning") == 0)
		return LOG_LVL_WARN;
	return -EINVAL;
}

int log_configure(const char *spec)
{
	char buf[256], *save = NULL, *tok;
	enum log_level def = default_level;
	unsigned n = 0;
	typeof(topics) t;

	if (!spec || strlen(spec) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, spec);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		int l;

		if (!colon) {
			l = log_level_parse(tok);
			if (l < 0)
				return l;
			def = (enum log_level) l;
			continue;
		}
		*colon = '\0';
		l = log_level_parse(colon + 1);
		if (l < 0 || n == MAX_TOPICS || strlen(tok) >= sizeof(t[0].name) || !*tok)
			return -EINVAL;
		strcpy(t[n].name, tok);
		t[n++].level = (enum log_level) l;
	}
	default_level = def;
	memcpy(topics, t, sizeof(t));
	n_topics = n;
	return 0;
}

bool log_enabled(enum log_level lvl, const char *topic)
{
	for (unsigned i = 0; i < n_topics; i++)
		if (strcmp(topics[i].name, topic) == 0)
			return lvl <= topics[i].level;
	return lvl <= default_level;
}

static const char *ident = "kvcached";

void log_set_ident(const char *name)
{
	ident = name;
}

static void log_vmsg(enum log_level lvl, const char *topic, int err, const char *suffix,
		     const char *fmt, va_list ap)
{
	int saved = errno; /* so %m still means the caller's errno */
	char line[1024];
	struct timespec ts;
	struct tm tm;
	size_t used;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		     tm.tm_sec, ts.tv_nsec / 1000000, ident, (int) getpid(), names[lvl], topic);
	if (n < 0 || (size_t) n >= sizeof(line))
		n = 0;
	errno = saved;
	vsnprintf(line + n, sizeof(line) - (size_t) n, fmt, ap);
	used = strlen(line);
	if (err)
		snprintf(line + used, sizeof(line) - used, ": %s", strerror(err < 0 ? -err : err));
	used = strlen(line);
	if (suffix)
		snprintf(line + used, sizeof(line) - used, "%s", suffix);
	fprintf(stderr, "%s\n", line);
	errno = saved;
}

void log_msg(enum log_level lvl, const char *topic, const char *fmt, ...)
{
	va_list ap;

	if (!log_enabled(lvl, topic))
		return;
	va_start(ap, fmt);
	log_vmsg(lvl, topic, 0, NULL, fmt, ap);
	va_end(ap);
}

int log_msg_errno(enum log_level lvl, const char *topic, int err, const char *fmt, ...)
{
	va_list ap;

	if (log_enabled(lvl, topic)) {
		va_start(ap, fmt);
		log_vmsg(lvl, topic, err, NULL, fmt, ap);
		va_end(ap);
	}
	return err < 0 ? err : -err;
}

void log_msg_ratelimited(struct log_ratelimit *rl, enum log_level lvl, const char *topic,
			 const char *fmt, ...)
{
	usec_t now, next;
	uint64_t suppressed;
	char note[64] = "";
	va_list ap;

	if (!log_enabled(lvl, topic))
		return;
	now = mono_us();
	next = __atomic_load_n(&rl->next, __ATOMIC_RELAXED);
	/* one caller in an interval wins the line; the others count */
	if (now < next ||
	    !__atomic_compare_exchange_n(&rl->next, &next, now + LOG_RATELIMIT, false,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
		__atomic_add_fetch(&rl->suppressed, 1, __ATOMIC_RELAXED);
		return;
	}
	suppressed = __atomic_exchange_n(&rl->suppressed, 0, __ATOMIC_RELAXED);
	if (suppressed)
		snprintf(note, sizeof(note), " (%llu more like it in the last %llu s)",
			 (unsigned long long) suppressed,
			 (unsigned long long) (LOG_RATELIMIT / USEC_PER_SEC));
	va_start(ap, fmt);
	log_vmsg(lvl, topic, 0, suppressed ? note : NULL, fmt, ap);
	va_end(ap);
}
