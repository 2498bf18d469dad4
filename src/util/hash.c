/* hash.c - the streaming checksum (hash.h). */
#include "util/hash.h"

#include <string.h>

#define SUM_PRIME 0x100000001b3ull

void toast_sum_init(struct toast_sum *s)
{
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < 4; i++)
		s->lane[i] = TOAST_FNV_OFFSET + (uint64_t)i * 0x9e3779b97f4a7c15ull;
}

static void sum_block(uint64_t lane[4], const unsigned char *p)
{
	for (int i = 0; i < 4; i++) {
		uint64_t w;
		memcpy(&w, p + 8 * i, 8);
		lane[i] = (lane[i] ^ w) * SUM_PRIME;
	}
}

void toast_sum_add(struct toast_sum *s, const void *data, size_t n)
{
	const unsigned char *p = data;
	s->n += n;
	if (s->n_tail) {
		size_t k = 32 - s->n_tail < n ? 32 - s->n_tail : n;
		memcpy(s->tail + s->n_tail, p, k);
		s->n_tail += k;
		p += k;
		n -= k;
		if (s->n_tail < 32)
			return;
		sum_block(s->lane, s->tail);
		s->n_tail = 0;
	}
	for (; n >= 32; p += 32, n -= 32)
		sum_block(s->lane, p);
	memcpy(s->tail, p, n);
	s->n_tail = n;
}

uint64_t toast_sum_final(const struct toast_sum *s)
{
	uint64_t lane[4];
	memcpy(lane, s->lane, sizeof(lane));
	if (s->n_tail) {
		unsigned char last[32] = {0};
		memcpy(last, s->tail, s->n_tail);
		sum_block(lane, last);
	}
	uint64_t h = s->n;
	for (int i = 0; i < 4; i++) {
		h = (h ^ lane[i]) * SUM_PRIME;
		h ^= h >> 29;
	}
	return h;
}
