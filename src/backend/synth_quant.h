/*
 * synth_quant.h - the bytes of synthetic quantised weights (benchmarks at real shapes without
 * files), one definition compiled for the host and for CUDA devices, so that every backend makes
 * exactly the same bytes: integer arithmetic only, no floating-point rounding to disagree on.
 *
 * A synthetic quantised weight of type t (backend.h: toast_synthetic_value() is the float
 * twin) with seed s = toast_synthetic_seed(name) is, in the layout of format/quant.h:
 *   - every byte not listed below: byte i of the little-endian words toast_synth_word(s, i / 4),
 *     i.e. uniformly random quants (and random 6-bit scales/mins for Q4_K/Q5_K, random int8
 *     scales for Q6_K);
 *   - the f16 scale fields of block b (d; and dmin for Q4_K/Q5_K, m for Q4_1) are a power of two
 *     chosen by type and n_in, with 10 random mantissa bits from toast_synth_word(s ^ SALT,
 *     4 * b + field), so every dequantised value is finite and of the order of 1/sqrt(n_in), as
 *     the float synthetic weights are, and roughly centred (dmin ~ 7.5 d, m ~ -8 d);
 *   - MLX affine weights: the packed words as above, and per group g (row-major [n_out][n_in/64],
 *     group size 64, bf16) a positive scale and a negative bias made the same way
 *     (toast_synth_mlx_sb).
 * e = floor(log2(n_in)) / 2, so 2^e ~ sqrt(n_in); the exponent of each field is listed in
 * synth_field_exp().
 */
#ifndef TOAST_BACKEND_SYNTH_QUANT_H
#define TOAST_BACKEND_SYNTH_QUANT_H

#include <stdint.h>

#include "format/dtype.h"

#ifdef __CUDACC__
#define TOAST_HD __host__ __device__
#else
#define TOAST_HD
#endif

#define TOAST_SYNTH_SALT 0x5f1e1d5e2c3b4a69ull
#define TOAST_SYNTH_MLX_GROUP 64

TOAST_HD static inline uint32_t toast_synth_mix32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	x *= 0xc2b2ae35u;
	x ^= x >> 16;
	return x;
}

/* word j of the random stream of seed (32-bit arithmetic: cheap on a GPU) */
TOAST_HD static inline uint32_t toast_synth_word(uint64_t seed, uint64_t j)
{
	uint32_t x = (uint32_t)j * 0x9e3779b9u + (uint32_t)(j >> 32) * 0x7f4a7c15u + (uint32_t)seed;
	return toast_synth_mix32(x ^ (uint32_t)(seed >> 32));
}

TOAST_HD static inline int toast_synth_e(int64_t n_in)
{
	int l = 0;
	while (l < 62 && ((int64_t)2 << l) <= n_in)
		l++;
	return l / 2;
}

/* f16 bits of (sign) 2^expo * (1 + mant/1024), subnormal below 2^-14 (K-quant scales are that
 * small), expo at most 15 */
TOAST_HD static inline uint16_t toast_synth_f16(int neg, int expo, uint32_t mant)
{
	uint32_t m = mant & 0x3ffu, bits;
	if (expo < -14)
		bits = expo < -24 ? 0 : (1024u + m) >> (-14 - expo);
	else
		bits = (uint32_t)(15 + (expo > 15 ? 15 : expo)) << 10 | m;
	return (uint16_t)((neg ? 0x8000u : 0u) | bits);
}

/* GGUF block geometry for the synthetic fill: bytes per block, or 0 */
TOAST_HD static inline int toast_synth_block_bytes(int type)
{
	switch (type) {
	case TOAST_DT_Q4_0: return 18;
	case TOAST_DT_Q4_1: return 20;
	case TOAST_DT_Q8_0: return 34;
	case TOAST_DT_Q4_K: return 144;
	case TOAST_DT_Q5_K: return 176;
	case TOAST_DT_Q6_K: return 210;
	default: return 0;
	}
}

/* the scale field of a block covering byte offset o: its first byte, exponent (relative to
 * -e) and sign; returns 0 when o is not in a scale field */
TOAST_HD static inline int toast_synth_field(int type, int o, int *start, int *expo, int *neg)
{
	*neg = 0;
	switch (type) {
	case TOAST_DT_Q4_0: *start = 0, *expo = -3; return o < 2;
	case TOAST_DT_Q8_0: *start = 0, *expo = -7; return o < 2;
	case TOAST_DT_Q4_1:
		*start = o & ~1, *expo = o < 2 ? -4 : -1, *neg = o >= 2; /* d, then m < 0 */
		return o < 4;
	case TOAST_DT_Q4_K:
	case TOAST_DT_Q5_K: {
		int q5 = type == TOAST_DT_Q5_K;
		*start = o & ~1, *expo = o < 2 ? -10 - q5 : -7; /* d, then dmin */
		return o < 4;
	}
	case TOAST_DT_Q6_K: *start = 208, *expo = -11; return o >= 208;
	default: return 0;
	}
}

/* byte i of a synthetic GGUF-block weight of type t whose rows have n_in elements */
TOAST_HD static inline uint8_t toast_synth_qbyte(int type, uint64_t seed, uint64_t i, int64_t n_in)
{
	int bs = toast_synth_block_bytes(type);
	uint64_t b = bs ? i / (uint64_t)bs : 0;
	int o = bs ? (int)(i - b * (uint64_t)bs) : 0, start, expo, neg;
	if (bs && toast_synth_field(type, o, &start, &expo, &neg)) {
		uint32_t h = toast_synth_word(seed ^ TOAST_SYNTH_SALT, 4 * b + (uint64_t)start);
		uint16_t f = toast_synth_f16(neg, expo - toast_synth_e(n_in), h);
		return (uint8_t)(f >> (8 * (o - start)));
	}
	return (uint8_t)(toast_synth_word(seed, i >> 2) >> (8 * (i & 3)));
}

/* bf16 bits of the scale (bias == 0) or bias of group g of a synthetic MLX weight */
TOAST_HD static inline uint16_t toast_synth_mlx_sb(int bits, uint64_t seed, uint64_t g, int bias, int64_t n_in)
{
	uint32_t h = toast_synth_word(seed ^ TOAST_SYNTH_SALT, 2 * g + (uint64_t)bias);
	int expo = (bias ? 0 : bits == 4 ? -3 : -7) - toast_synth_e(n_in);
	expo = expo < -126 ? -126 : expo;
	return (uint16_t)((bias ? 0x8000u : 0u) | (uint32_t)(127 + expo) << 7 | (h & 0x7fu));
}

#endif
