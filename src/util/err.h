/*
 * err.h - status codes and error messages (struct toast_error from toasted.h).
 *
 * toast_err_set() formats a message into an optional error struct and returns the code, so a
 * failing path reads `return toast_err_set(err, TOAST_ERR_FORMAT, "%s: ...", path);`.
 */
#ifndef TOAST_UTIL_ERR_H
#define TOAST_UTIL_ERR_H

#include "toasted.h"

#if defined(__GNUC__)
#define TOAST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TOAST_PRINTF(a, b)
#endif

enum toast_status toast_err_set(struct toast_error *err, enum toast_status code, const char *fmt, ...)
	TOAST_PRINTF(3, 4);
/* Prefix an existing message with context ("loading x: " + old message); returns err->code. */
enum toast_status toast_err_prefix(struct toast_error *err, const char *fmt, ...) TOAST_PRINTF(2, 3);
void toast_err_clear(struct toast_error *err);

#endif
