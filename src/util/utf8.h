/*
 * utf8.h - UTF-8 validation, repair and decoding.
 *
 * "Valid" is the Unicode definition: no overlongs, no surrogates, nothing above U+10FFFF. Repair
 * replaces each maximal invalid subsequence by U+FFFD, as Python's bytes.decode("utf-8",
 * "replace") and Rust's String::from_utf8_lossy do.
 */
#ifndef TOAST_UTIL_UTF8_H
#define TOAST_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* true if [p, p+n) is valid UTF-8. */
bool toast_utf8_valid(const char *p, size_t n);
/* A NUL-terminated copy with each maximal invalid subsequence replaced by U+FFFD (malloc'd,
 * *out_n bytes without the NUL); NULL when out of memory. */
char *toast_utf8_sanitize(const char *p, size_t n, size_t *out_n);
/* The code point at p (n > 0 bytes left) and its length in *len; an invalid byte reads as
 * itself with length 1. */
uint32_t toast_utf8_next(const char *p, size_t n, int *len);

#endif
