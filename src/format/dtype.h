/*
 * dtype.h - element types of stored tensors.
 *
 * Plain types have a per-element size; block-quantised types store blocks of `blck` elements in
 * `type_size` bytes. toast_dtype_bytes() is the one place that turns an element count into bytes.
 *
 * Quantised types (layouts in format/quant.h):
 *   - GGUF block types Q4_0, Q4_1, Q8_0 (32 elements a block) and Q4_K, Q5_K, Q6_K (256), stored
 *     exactly as ggml stores them, so a GGUF tensor's bytes are used in place;
 *   - MLX affine MLX4 / MLX8: the `data` part only (uint32 words each holding 32/bits values);
 *     the per-group scales and biases live beside it (struct toast_weight.scales/biases).
 */
#ifndef TOAST_FORMAT_DTYPE_H
#define TOAST_FORMAT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum toast_dtype {
	TOAST_DT_F32,
	TOAST_DT_F16,
	TOAST_DT_BF16,
	TOAST_DT_I32,
	TOAST_DT_I64,
	TOAST_DT_U8,
	TOAST_DT_Q4_0,
	TOAST_DT_Q4_1,
	TOAST_DT_Q8_0,
	TOAST_DT_Q4_K,
	TOAST_DT_Q5_K,
	TOAST_DT_Q6_K,
	TOAST_DT_MLX4,
	TOAST_DT_MLX8,
	TOAST_DT_U32,
	TOAST_DT_UNKNOWN,
	TOAST_DT_COUNT
};

struct toast_dtype_traits {
	const char *name;
	int blck;      /* elements per block (1 for plain types) */
	int type_size; /* bytes per block */
};

extern const struct toast_dtype_traits toast_dtypes[TOAST_DT_COUNT];

static inline const char *toast_dtype_name(enum toast_dtype t)
{
	return (unsigned)t < TOAST_DT_COUNT ? toast_dtypes[t].name : "?";
}

static inline bool toast_dtype_is_quant(enum toast_dtype t)
{
	return t >= TOAST_DT_Q4_0 && t <= TOAST_DT_MLX8;
}

/* Parse a type name as written by toast_dtype_name ("Q4_K", "BF16"; case-insensitive);
 * TOAST_DT_UNKNOWN when unknown. */
enum toast_dtype toast_dtype_parse(const char *name);

/* Bytes of n elements; false when n is not a whole number of blocks or on overflow. */
bool toast_dtype_bytes(enum toast_dtype t, int64_t n, size_t *out);

#endif
