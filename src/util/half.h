/*
 * half.h - bf16 and f16 <-> f32 conversions (scalar, exact; round-to-nearest-even on narrowing).
 */
#ifndef TOAST_UTIL_HALF_H
#define TOAST_UTIL_HALF_H

#include <stdint.h>
#include <string.h>

static inline float toast_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t toast_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static inline float toast_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t u;
	if (exp == 0) {
		if (man == 0) {
			u = sign;
		} else { /* subnormal: normalise */
			exp = 127 - 15 + 1;
			while (!(man & 0x400)) {
				man <<= 1;
				exp--;
			}
			man &= 0x3ff;
			u = sign | (exp << 23) | (man << 13);
		}
	} else if (exp == 31) {
		u = sign | 0x7f800000u | (man << 13);
	} else {
		u = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t toast_f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffffu;
	if (a >= 0x7f800000u) /* inf or nan */
		return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
	if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) { /* below the smallest normal: subnormal or zero */
		if (a < 0x33000000u)
			return (uint16_t)sign;
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14 + (113 - e) */
		uint32_t r = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
	uint32_t h = r >> 13;
	uint32_t rem = r & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

#endif
