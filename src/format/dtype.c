/* dtype.c - element type table. */
#include "format/dtype.h"

#include <strings.h>

#include "util/mem.h"

const struct toast_dtype_traits toast_dtypes[TOAST_DT_COUNT] = {
	[TOAST_DT_F32] = {"F32", 1, 4},
	[TOAST_DT_F16] = {"F16", 1, 2},
	[TOAST_DT_BF16] = {"BF16", 1, 2},
	[TOAST_DT_I32] = {"I32", 1, 4},
	[TOAST_DT_I64] = {"I64", 1, 8},
	[TOAST_DT_U8] = {"U8", 1, 1},
	[TOAST_DT_Q4_0] = {"Q4_0", 32, 18},
	[TOAST_DT_Q4_1] = {"Q4_1", 32, 20},
	[TOAST_DT_Q8_0] = {"Q8_0", 32, 34},
	[TOAST_DT_Q4_K] = {"Q4_K", 256, 144},
	[TOAST_DT_Q5_K] = {"Q5_K", 256, 176},
	[TOAST_DT_Q6_K] = {"Q6_K", 256, 210},
	[TOAST_DT_MLX4] = {"MLX4", 8, 4},
	[TOAST_DT_MLX8] = {"MLX8", 4, 4},
	[TOAST_DT_U32] = {"U32", 1, 4},
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

enum toast_dtype toast_dtype_parse(const char *name)
{
	for (int t = 0; t < TOAST_DT_UNKNOWN; t++)
		if (strcasecmp(name, toast_dtypes[t].name) == 0)
			return (enum toast_dtype)t;
	return TOAST_DT_UNKNOWN;
}
