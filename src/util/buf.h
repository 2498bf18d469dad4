/*
 * buf.h - a growable byte buffer (always NUL-terminated after its len bytes).
 *
 * Appends report allocation failure (false) instead of aborting; callers that take sizes from
 * outside bound them before appending. toast_buf_consume() drops bytes from the front.
 */
#ifndef TOAST_UTIL_BUF_H
#define TOAST_UTIL_BUF_H

#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

struct toast_buf {
	char *data; /* NULL until the first append */
	size_t len, cap;
};

void toast_buf_init(struct toast_buf *b);
void toast_buf_deinit(struct toast_buf *b);
bool toast_buf_append(struct toast_buf *b, const void *p, size_t n);
bool toast_buf_puts(struct toast_buf *b, const char *s);
bool toast_buf_printf(struct toast_buf *b, const char *fmt, ...) TOAST_PRINTF(2, 3);
/* Drop the first n (<= len) bytes. */
void toast_buf_consume(struct toast_buf *b, size_t n);
/* Append s as the contents of a JSON string (without the quotes); a byte that is not part of
 * valid UTF-8 becomes U+FFFD, so the string is valid JSON whatever s holds. */
bool toast_buf_json_escape(struct toast_buf *b, const char *s, size_t n);
/* Hand the bytes over: returns data (malloc'd, NUL-terminated; never NULL unless out of memory)
 * and leaves b empty. */
char *toast_buf_steal(struct toast_buf *b);

#endif
