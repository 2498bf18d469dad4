/* backend.c - backend selection helpers that do not depend on CUDA being built. */
#include "backend/backend.h"

#include <math.h>

#include "util/half.h"

float toast_rope_inv_freq(float theta, int i, int n_rot, enum toast_dtype freq_type)
{
	float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
	if (freq_type == TOAST_DT_BF16)
		return toast_bf16_to_f32(toast_f32_to_bf16(inv));
	if (freq_type == TOAST_DT_F16)
		return toast_f16_to_f32(toast_f32_to_f16(inv));
	return inv;
}

#ifndef TOAST_HAVE_CUDA
enum toast_status toast_backend_cuda_new(struct toast_backend **out, struct toast_error *err)
{
	*out = NULL;
	return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "this build has no CUDA backend (nvcc was not found at build time)");
}

bool toast_backend_cuda_available(void)
{
	return false;
}
#endif
