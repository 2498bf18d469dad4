/* buf.c - growable byte buffers. */
#include "util/buf.h"
#include "util/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void toast_buf_init(struct toast_buf *b)
{
	b->data = NULL;
	b->len = b->cap = 0;
}

void toast_buf_deinit(struct toast_buf *b)
{
	if (!b)
		return;
	free(b->data);
	toast_buf_init(b);
}

static bool buf_reserve(struct toast_buf *b, size_t extra)
{
	if (extra > (size_t)-1 / 2 - b->len)
		return false;
	size_t need = b->len + extra + 1;
	if (need <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap *= 2;
	char *p = realloc(b->data, cap);
	if (!p)
		return false;
	b->data = p;
	b->cap = cap;
	return true;
}

bool toast_buf_append(struct toast_buf *b, const void *p, size_t n)
{
	if (!buf_reserve(b, n))
		return false;
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = 0;
	return true;
}

bool toast_buf_puts(struct toast_buf *b, const char *s)
{
	return toast_buf_append(b, s, strlen(s));
}

bool toast_buf_printf(struct toast_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !buf_reserve(b, (size_t)n))
		return false;
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
	return true;
}

void toast_buf_consume(struct toast_buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
	} else {
		memmove(b->data, b->data + n, b->len - n);
		b->len -= n;
	}
	if (b->data)
		b->data[b->len] = 0;
}

bool toast_buf_json_escape(struct toast_buf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t run = 0; /* bytes copied verbatim in one append */
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x80) {
			int seq;
			toast_utf8_next(s + i, n - i, &seq);
			if (seq > 1) { /* valid UTF-8, as it is */
				i += (size_t)seq - 1;
				continue;
			}
		} else if (c >= 0x20 && c != '"' && c != '\\') {
			continue;
		}
		if (!toast_buf_append(b, s + run, i - run))
			return false;
		run = i + 1;
		char esc[7] = {'\\', 0};
		size_t len = 2;
		switch (c) {
		case '"': esc[1] = '"'; break;
		case '\\': esc[1] = '\\'; break;
		case '\n': esc[1] = 'n'; break;
		case '\r': esc[1] = 'r'; break;
		case '\t': esc[1] = 't'; break;
		default: /* a byte of invalid UTF-8 as U+FFFD, a control character as itself */
			if (c >= 0x80) {
				memcpy(esc, "\\ufffd", 6);
			} else {
				memcpy(esc, "\\u00", 4);
				esc[4] = hex[c >> 4];
				esc[5] = hex[c & 15];
			}
			len = 6;
		}
		if (!toast_buf_append(b, esc, len))
			return false;
	}
	return toast_buf_append(b, s + run, n - run);
}

char *toast_buf_steal(struct toast_buf *b)
{
	if (!b->data && !buf_reserve(b, 0))
		return NULL;
	char *p = b->data;
	toast_buf_init(b);
	return p;
}
