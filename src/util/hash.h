/*
 * hash.h - FNV-1a (short keys, token prefixes) and a fast streaming checksum that detects
 * corrupted files. Neither is cryptographic: they find accidents, not attacks.
 */
#ifndef TOAST_UTIL_HASH_H
#define TOAST_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

#define TOAST_FNV_OFFSET 0xcbf29ce484222325ull

static inline uint64_t toast_fnv1a(const void *p, size_t n, uint64_t h)
{
	const unsigned char *s = p;
	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/*
 * Checksum of a byte stream fed in pieces of any size: four lanes of FNV-1a over 64-bit words
 * (each step is a bijection of the lane, so any one changed word changes the result), then the
 * lanes and the length mixed. About 8 bytes per cycle; the same result however the stream is cut.
 */
struct toast_sum {
	uint64_t lane[4];
	uint64_t n; /* bytes added */
	unsigned char tail[32];
	size_t n_tail;
};

void toast_sum_init(struct toast_sum *s);
void toast_sum_add(struct toast_sum *s, const void *p, size_t n);
uint64_t toast_sum_final(const struct toast_sum *s);

#endif
