/*
 * log.h - leveled logging to stderr or a file. Thread-safe (one fprintf per line).
 */
#ifndef TOAST_UTIL_LOG_H
#define TOAST_UTIL_LOG_H

#include <stdio.h>

#include "util/err.h"

enum toast_log_level { TOAST_LOG_DEBUG, TOAST_LOG_INFO, TOAST_LOG_WARN, TOAST_LOG_ERROR };

void toast_log_set_level(enum toast_log_level lvl);
/* Log to f (NULL: stderr). The caller keeps f open. */
void toast_log_set_file(FILE *f);
void toast_log(enum toast_log_level lvl, const char *fmt, ...) TOAST_PRINTF(2, 3);

#define TOAST_DEBUG(...) toast_log(TOAST_LOG_DEBUG, __VA_ARGS__)
#define TOAST_INFO(...) toast_log(TOAST_LOG_INFO, __VA_ARGS__)
#define TOAST_WARN(...) toast_log(TOAST_LOG_WARN, __VA_ARGS__)
#define TOAST_ERROR(...) toast_log(TOAST_LOG_ERROR, __VA_ARGS__)

#endif
