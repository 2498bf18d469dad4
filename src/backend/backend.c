/* backend.c - backend selection helpers that do not depend on CUDA being built. */
#include "backend/backend.h"

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
