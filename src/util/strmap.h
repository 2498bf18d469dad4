/*
 * strmap.h - open-addressing hash map from NUL-terminated strings to int, FNV-1a hashed.
 * Keys are borrowed (the caller keeps them alive); values are non-negative ints.
 */
#ifndef TOAST_UTIL_STRMAP_H
#define TOAST_UTIL_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct toast_strmap {
	const char **keys;
	size_t *lens;
	int *vals;
	size_t cap, n;
};

static inline uint64_t toast_fnv1a(const void *p, size_t n, uint64_t h)
{
	const unsigned char *s = p;
	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 0x100000001b3ull;
	}
	return h;
}
#define TOAST_FNV_OFFSET 0xcbf29ce484222325ull

/* 0 on success, -1 on allocation failure. Capacity grows as needed. */
int toast_strmap_init(struct toast_strmap *m, size_t expected);
void toast_strmap_deinit(struct toast_strmap *m);
/* Insert or replace (key of n bytes). -1 on allocation failure. */
int toast_strmap_put(struct toast_strmap *m, const char *key, size_t n, int val);
/* Value for key, or -1. */
int toast_strmap_get(const struct toast_strmap *m, const char *key, size_t n);

#endif
