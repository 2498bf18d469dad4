/*
 * strmap.h - open-addressing hash map from NUL-terminated strings to int, FNV-1a hashed.
 * Keys are borrowed (the caller keeps them alive); values are non-negative ints.
 */
#ifndef TOAST_UTIL_STRMAP_H
#define TOAST_UTIL_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "util/hash.h"

struct toast_strmap {
	const char **keys;
	size_t *lens;
	int *vals;
	size_t cap, n;
};

/* 0 on success, -1 on allocation failure. Capacity grows as needed. */
int toast_strmap_init(struct toast_strmap *m, size_t expected);
void toast_strmap_deinit(struct toast_strmap *m);
/* Insert or replace (key of n bytes). -1 on allocation failure. */
int toast_strmap_put(struct toast_strmap *m, const char *key, size_t n, int val);
/* Value for key, or -1. */
int toast_strmap_get(const struct toast_strmap *m, const char *key, size_t n);

#endif
