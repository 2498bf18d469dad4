/*
 * mem.h - checked allocation helpers.
 *
 * Sizes that come from outside (a file, a socket) go through toast_mul_ok() before allocating;
 * allocation failure is reported to the caller, never aborted on.
 */
#ifndef TOAST_UTIL_MEM_H
#define TOAST_UTIL_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* a*b without overflow into *out; false on overflow. */
static inline bool toast_mul_ok(size_t a, size_t b, size_t *out)
{
	if (a && b > SIZE_MAX / a)
		return false;
	*out = a * b;
	return true;
}

/* calloc of n elements of size sz with overflow check; NULL on failure. */
static inline void *toast_calloc(size_t n, size_t sz)
{
	if (n == 0 || sz == 0)
		return calloc(1, 1);
	return calloc(n, sz);
}

char *toast_strdup(const char *s);
/* 64-byte aligned, zeroed allocation; free with toast_afree(). NULL on failure. */
void *toast_aalloc(size_t n_bytes);
void toast_afree(void *p);

/* Bytes of RAM available to new allocations (MemAvailable in /proc/meminfo), 0 if unknown. */
size_t toast_mem_available(void);

#endif
