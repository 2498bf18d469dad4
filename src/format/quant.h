/*
 * quant.h - quantised weight formats: block layouts, dequantisation (the reference every backend
 * is tested against) and the standard quantisers used by `toasted convert` and `--quant`.
 *
 * GGUF block types, byte-exact with ggml (ggml-common.h); all multi-byte fields little-endian,
 * f16 = IEEE half. A row of n elements is n/blck consecutive blocks; rows are consecutive.
 * Element k of a block (0 <= k < blck) dequantises as follows.
 *
 *   Q4_0  (32 elements, 18 bytes): f16 d; u8 qs[16].
 *         q = k < 16 ? qs[k] & 15 : qs[k-16] >> 4;   y = (q - 8) * d
 *   Q4_1  (32, 20): f16 d; f16 m; u8 qs[16].
 *         q as Q4_0;                                  y = q * d + m
 *   Q8_0  (32, 34): f16 d; i8 qs[32].                 y = qs[k] * d
 *   Q4_K  (256, 144): f16 d; f16 dmin; u8 scales[12]; u8 qs[128].
 *         8 sub-blocks of 32 (j = k/32) with 6-bit scale sc_j and min m_j packed in scales[]:
 *           j < 4: sc = scales[j] & 63, m = scales[j+4] & 63
 *           j >= 4: sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4,
 *                   m  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4
 *         q = j even ? qs[32*(j/2) + k%32] & 15 : qs[32*(j/2) + k%32] >> 4
 *         y = (d * sc) * q - (dmin * m)
 *   Q5_K  (256, 176): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
 *         as Q4_K, plus the fifth bit: q += 16 if qh[k%32] & (1 << j)
 *   Q6_K  (256, 210): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d.
 *         h = k/128, r = k%128, l = r%32, s = r/32 (0..3):
 *         low 4 bits: ql[64h + l + 32*(s&1)], nibble s < 2 ? low : high
 *         high 2 bits: (qh[32h + l] >> 2s) & 3
 *         q = low | high << 4;  y = (d * scales[k/16]) * (q - 32)
 *
 * Products are rounded left to right in f32 exactly as written (no fused multiply-add): that
 * is what "bit-exact" means for every dequantiser here and in other backends' tests.
 *
 * MLX affine (mlx.core.quantize, mode "affine"): a weight [n_out][n_in] quantised with `bits`
 * (4 or 8) and group_size g (64 in published checkpoints) is three tensors:
 *   weight  uint32 [n_out][n_in*bits/32]: per row a little-endian bit stream of n_in codes,
 *           code j in word j*bits/32 at bit (j*bits) % 32;
 *   scales, biases [n_out][n_in/g] in the checkpoint dtype (bf16, f16 or f32).
 *   y[j] = scale[j/g] * q_j + bias[j/g]  (scale and bias widened to f32)
 */
#ifndef TOAST_FORMAT_QUANT_H
#define TOAST_FORMAT_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "format/dtype.h"

/* Dequantise n elements of GGUF block type t (n a multiple of the block) from src to dst. */
void toast_dequant(enum toast_dtype t, const void *src, float *dst, int64_t n);

/* Dequantise n elements of an MLX affine row segment: q points at the packed words of the first
 * element (which starts a group), scales/biases at that group's entries of sb_type. */
void toast_dequant_mlx(int bits, int group_size, const uint32_t *q, const void *scales, const void *biases,
		       enum toast_dtype sb_type, float *dst, int64_t n);

/* Quantise n elements (a multiple of the block) of src into dst with ggml's reference
 * quantisers (quantize_row_*_ref: no importance matrix). t is a GGUF block type or F32/F16/BF16. */
void toast_quant(enum toast_dtype t, const float *src, void *dst, int64_t n);

/* MLX affine quantisation as mlx.core.quantize does it (per group: min/max, the edge of larger
 * magnitude made exactly representable): q is n*bits/32 words, scales and biases n/group_size
 * floats (round them to the checkpoint dtype to store). */
void toast_quant_mlx(int bits, int group_size, const float *src, int64_t n, uint32_t *q, float *scales,
		     float *biases);

#endif
