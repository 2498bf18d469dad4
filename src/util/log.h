/*
 * log.h - leveled logging to stderr or a file. Thread-safe: a mutex orders lines and guards the
 * switch to another file (the daemon reopens its log on SIGHUP).
 */
#ifndef TOAST_UTIL_LOG_H
#define TOAST_UTIL_LOG_H

#include <stdbool.h>
#include <stdio.h>

#include "util/err.h"

enum toast_log_level { TOAST_LOG_DEBUG, TOAST_LOG_INFO, TOAST_LOG_WARN, TOAST_LOG_ERROR };

void toast_log_set_level(enum toast_log_level lvl);
/* Log to f (NULL: stderr) and return the previous file, which the caller may then close. */
FILE *toast_log_set_file(FILE *f);
/* Write lines as JSON objects {"time","level","msg"} (the daemon's log) instead of text. */
void toast_log_set_json(bool on);
void toast_log(enum toast_log_level lvl, const char *fmt, ...) TOAST_PRINTF(2, 3);
/* Write one preformatted line (a JSON record without its newline) to the log, whatever the level. */
void toast_log_line(const char *line);
/* The current time as "2026-01-31T12:34:56.789Z" into buf[32]. */
void toast_log_time(char buf[32]);

#define TOAST_DEBUG(...) toast_log(TOAST_LOG_DEBUG, __VA_ARGS__)
#define TOAST_INFO(...) toast_log(TOAST_LOG_INFO, __VA_ARGS__)
#define TOAST_WARN(...) toast_log(TOAST_LOG_WARN, __VA_ARGS__)
#define TOAST_ERROR(...) toast_log(TOAST_LOG_ERROR, __VA_ARGS__)

#endif
