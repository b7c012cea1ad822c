/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>

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

/* Each file defines LOG_TOPIC before including this header. */
#define log_error(...) log_msg(LOG_LVL_ERROR, LOG_TOPIC, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, LOG_TOPIC, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LVL_NOTICE, LOG_TOPIC, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, LOG_TOPIC, __VA_ARGS__)
#define log_debug(...)                                                   \
	do {                                                             \
		if (log_enabled(LOG_LVL_DEBUG, LOG_TOPIC))               \
			log_msg(LOG_LVL_DEBUG, LOG_TOPIC, __VA_ARGS__);  \
	} while (0)
