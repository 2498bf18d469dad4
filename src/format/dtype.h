/*
 * dtype.h - element types of stored tensors.
 *
 * Plain types have a per-element size; block-quantised types (issue 7) store blocks of
 * `blck` elements in `type_size` bytes. toast_dtype_row_bytes() is the one place that turns a
 * row length into bytes.
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

/* Bytes of n elements; false when n is not a whole number of blocks or on overflow. */
bool toast_dtype_bytes(enum toast_dtype t, int64_t n, size_t *out);

#endif
