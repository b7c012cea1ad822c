/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "clock.h"

enum log_level {
	LOG_LVL_ERROR,
	LOG_LVL_WARN,
	LOG_LVL_NOTICE,
	LOG_LVL_INFO,
	LOG_LVL_DEBUG,
	LOG_LVL_TRACE,
};

/* "info" or "warn,session:debug,loop:trace"; -EINVAL on a bad spec. */
int log_configure(const char *spec);
/* The program name in each line (default "kvcached"); a static string. */
void log_set_ident(const char *name);
int log_level_parse(const char *s);
bool log_enabled(enum log_level lvl, const char *topic);
void log_msg(enum log_level lvl, const char *topic, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The same with ": <what err says>" after it (err: an errno, either
 * sign); returns -|err|, for "return log_error_errno(r, ...)". */
int log_msg_errno(enum log_level lvl, const char *topic, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* A line a peer can cause again and again (a bad checksum, a wrong
 * secret): at most one per LOG_RATELIMIT per call site, which says how
 * many it stood for.  Safe from any thread. */
#define LOG_RATELIMIT (10 * USEC_PER_SEC)
struct log_ratelimit {
	usec_t next;         /* atomic */
	uint64_t suppressed; /* atomic */
};
void log_msg_ratelimited(struct log_ratelimit *rl, enum log_level lvl, const char *topic,
			 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Each file defines LOG_TOPIC before including this header. */
#define log_error(...) log_msg(LOG_LVL_ERROR, LOG_TOPIC, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, LOG_TOPIC, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LVL_NOTICE, LOG_TOPIC, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, LOG_TOPIC, __VA_ARGS__)
#define log_error_errno(err, ...) log_msg_errno(LOG_LVL_ERROR, LOG_TOPIC, (err), __VA_ARGS__)
#define log_warn_errno(err, ...) log_msg_errno(LOG_LVL_WARN, LOG_TOPIC, (err), __VA_ARGS__)
#define log_warn_ratelimited(...)                                                 \
	do {                                                                      \
		static struct log_ratelimit rl_;                                  \
		log_msg_ratelimited(&rl_, LOG_LVL_WARN, LOG_TOPIC, __VA_ARGS__);  \
	} while (0)
#define log_debug(...)                                                   \
	do {                                                             \
		if (log_enabled(LOG_LVL_DEBUG, LOG_TOPIC))               \
			log_msg(LOG_LVL_DEBUG, LOG_TOPIC, __VA_ARGS__);  \
	} while (0)
