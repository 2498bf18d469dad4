/*
 * utf8.c - UTF-8 validation (with an ASCII fast path), repair into U+FFFD, and decoding one code
 * point. See utf8.h for the exact rules.
 */
#include "util/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid sequence at p (1..4), or 0 with *bad = bytes of its maximal invalid prefix. */
static int utf8_seq(const unsigned char *p, size_t n, size_t *bad)
{
	unsigned char b = p[0];
	int need;
	unsigned char lo = 0x80, hi = 0xBF;
	if (b < 0x80)
		return 1;
	if (b >= 0xC2 && b <= 0xDF)
		need = 1;
	else if (b >= 0xE0 && b <= 0xEF) {
		need = 2;
		if (b == 0xE0)
			lo = 0xA0;
		else if (b == 0xED)
			hi = 0x9F; /* no surrogates */
	} else if (b >= 0xF0 && b <= 0xF4) {
		need = 3;
		if (b == 0xF0)
			lo = 0x90;
		else if (b == 0xF4)
			hi = 0x8F;
	} else {
		*bad = 1;
		return 0;
	}
	for (int k = 1; k <= need; k++) {
		if ((size_t)k >= n || p[k] < (k == 1 ? lo : 0x80) || p[k] > (k == 1 ? hi : 0xBF)) {
			*bad = (size_t)k;
			return 0;
		}
	}
	return need + 1;
}

bool toast_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, bad;
	while (i < n) {
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, p + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		int l = utf8_seq(p + i, n - i, &bad);
		if (!l)
			return false;
		i += (size_t)l;
	}
	return true;
}

char *toast_utf8_sanitize(const char *s, size_t n, size_t *out_n)
{
	const unsigned char *p = (const unsigned char *)s;
	/* each invalid byte becomes at most 3 bytes */
	if (n > (SIZE_MAX - 1) / 3)
		return NULL;
	char *out = malloc(n * 3 + 1);
	if (!out)
		return NULL;
	size_t i = 0, o = 0, bad;
	while (i < n) {
		int l = utf8_seq(p + i, n - i, &bad);
		if (l) {
			memcpy(out + o, p + i, (size_t)l);
			o += (size_t)l;
			i += (size_t)l;
		} else {
			memcpy(out + o, "\xEF\xBF\xBD", 3);
			o += 3;
			i += bad;
		}
	}
	out[o] = 0;
	*out_n = o;
	return out;
}

uint32_t toast_utf8_next(const char *s, size_t n, int *len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t bad;
	int l = utf8_seq(p, n, &bad);
	if (!l) {
		*len = 1;
		return p[0];
	}
	*len = l;
	switch (l) {
	case 1: return p[0];
	case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
	case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
	default:
		return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 |
		       (p[3] & 0x3F);
	}
}
