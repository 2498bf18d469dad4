/* dtype.c - element type table. */
#include "format/dtype.h"

#include "util/mem.h"

const struct toast_dtype_traits toast_dtypes[TOAST_DT_COUNT] = {
	[TOAST_DT_F32] = {"F32", 1, 4},
	[TOAST_DT_F16] = {"F16", 1, 2},
	[TOAST_DT_BF16] = {"BF16", 1, 2},
	[TOAST_DT_I32] = {"I32", 1, 4},
	[TOAST_DT_I64] = {"I64", 1, 8},
	[TOAST_DT_U8] = {"U8", 1, 1},
	[TOAST_DT_UNKNOWN] = {"unknown", 1, 0},
};

bool toast_dtype_bytes(enum toast_dtype t, int64_t n, size_t *out)
{
	if ((unsigned)t >= TOAST_DT_COUNT || n < 0 || toast_dtypes[t].type_size == 0)
		return false;
	int blck = toast_dtypes[t].blck;
	if (n % blck)
		return false;
	return toast_mul_ok((size_t)(n / blck), (size_t)toast_dtypes[t].type_size, out);
}
