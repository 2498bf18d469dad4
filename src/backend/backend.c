/* backend.c - backend selection helpers that do not depend on CUDA being built. */
#include "backend/backend.h"

#include <math.h>

#include "util/half.h"

uint64_t toast_synthetic_seed(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *p = name ? name : ""; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	return h;
}

/* splitmix64 of (seed, i): a stateless generator, so any backend can fill in parallel */
float toast_synthetic_value(uint64_t seed, uint64_t i, int64_t n_in, int64_t n_out)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
	if (n_out == 1)
		return 0.1f * u;
	return (2.0f * u - 1.0f) / sqrtf((float)n_in);
}

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
