/*
 * k_matmul.cu - products of one input with up to TOAST_MM_MAX_OUT bf16 weight matrices, f32
 * accumulation (contract: toast_mm_in / toast_mm_out in backend.h).
 *
 * Decode-sized T (<= CU_GEMV_MAX_T): one GEMV launch for all outputs. Each block stages the
 * input in shared memory as f32 (computing the RMSNorm there when the input is a normed
 * residual, so the norm costs no launch and no rounding), then each warp streams four weight
 * rows with 16-byte loads. Larger T: the normed input is written once in bf16 and each output
 * is a cuBLAS GEMM on tensor cores.
 */
#include "backend/cuda/cuda_common.cuh"

#define GEMV_WARPS 8

struct gemv_job {
	void *out;
	const bf16 *W;
	int mode;
	int64_t n_out;
	int64_t first_block; /* blocks before this job's */
};

struct gemv_args {
	struct gemv_job job[TOAST_MM_MAX_OUT];
	int n_jobs;
	int64_t n_in;
	const bf16 *act;       /* input rows, or NULL: */
	const float *norm_x;   /* RMSNorm(norm_x) with norm_w */
	const float *norm_w;
	float eps;
	int plus_one;
	bf16 *norm_out;        /* written by block 0 when set */
};

__device__ __forceinline__ void gemv_store(void *out, int mode, int64_t n_out, int t, int64_t r, float v)
{
	if (mode == TOAST_MM_ACT)
		((bf16 *)out)[t * n_out + r] = __float2bfloat16(v);
	else if (mode == TOAST_MM_F32)
		((float *)out)[t * n_out + r] = v;
	else
		((float *)out)[t * n_out + r] += v;
}

/* stage the T input rows in shared memory as f32: xs[t][n_in] */
template <int T>
__device__ __forceinline__ void gemv_stage(const gemv_args &a, float *xs)
{
	__shared__ float red[32];
	int64_t n = a.n_in;
	for (int t = 0; t < T; t++) {
		if (a.act) {
			for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
				xs[t * n + i] = __bfloat162float(a.act[t * n + i]);
			continue;
		}
		const float *x = a.norm_x + t * n;
		float ss = 0;
		for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
			ss += x[i] * x[i];
		ss = cu_block_sum(ss, red);
		float r = rsqrtf(ss / n + a.eps);
		for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
			float y = x[i] * r * (a.plus_one ? 1.0f + a.norm_w[i] : a.norm_w[i]);
			xs[t * n + i] = y;
			if (a.norm_out && blockIdx.x == 0)
				a.norm_out[t * n + i] = __float2bfloat16(y);
		}
	}
	__syncthreads();
}

/* requires n_in % 8 == 0 and 16-byte aligned weight rows; ROWS rows per warp */
template <int T, int ROWS>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv(gemv_args a)
{
	const int GEMV_ROWS = ROWS, GEMV_BLOCK_ROWS = GEMV_WARPS * ROWS;
	extern __shared__ float xs[];
	gemv_stage<T>(a, xs);
	int j = 0;
	while (j + 1 < a.n_jobs && blockIdx.x >= a.job[j + 1].first_block)
		j++;
	const gemv_job &jb = a.job[j];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r0 = (blockIdx.x - jb.first_block) * GEMV_BLOCK_ROWS + warp * GEMV_ROWS;
	if (r0 >= jb.n_out)
		return;
	int64_t n_in = a.n_in, n8 = n_in / 8;
	const uint4 *w[GEMV_ROWS];
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		w[r] = (const uint4 *)(jb.W + min(r0 + r, jb.n_out - 1) * n_in);
	float acc[GEMV_ROWS][T];
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < T; t++)
			acc[r][t] = 0.0f;
#pragma unroll 2
	for (int64_t i = lane; i < n8; i += 32) {
		uint4 u[GEMV_ROWS];
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			u[r] = __ldg(w[r] + i);
#pragma unroll
		for (int t = 0; t < T; t++) {
			const float4 *xv = (const float4 *)(xs + t * n_in + i * 8);
			float4 x0 = xv[0], x1 = xv[1];
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++) {
				float f[8];
				cu_bf16x8(u[r], f);
				acc[r][t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y +
					     f[6] * x1.z + f[7] * x1.w;
			}
		}
	}
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < T; t++)
			acc[r][t] = cu_warp_sum(acc[r][t]);
	if (lane == 0)
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			if (r0 + r < jb.n_out)
#pragma unroll
				for (int t = 0; t < T; t++)
					gemv_store(jb.out, jb.mode, jb.n_out, t, r0 + r, acc[r][t]);
}

/* any shape and weight type: one warp per (row, token), input from global (act bf16 or f32) */
__global__ void k_gemv_plain(void *out, int mode, const bf16 *x, const float *xf, const void *W, int wtype,
			     int64_t n_out, int64_t n_in)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
	int t = blockIdx.y;
	if (r >= n_out)
		return;
	float acc = 0;
	for (int64_t i = lane; i < n_in; i += 32)
		acc += cu_ldw(W, wtype, r * n_in + i) * (xf ? xf[t * n_in + i] : __bfloat162float(x[t * n_in + i]));
	acc = cu_warp_sum(acc);
	if (lane == 0)
		gemv_store(out, mode, n_out, t, r, acc);
}

/* y = RMSNorm(x) rows, to f32 and/or bf16 */
__global__ void k_norm_rows(const float *x, const float *w, int64_t n, float eps, int plus_one, float *yf, bf16 *yb,
			    bf16 *ylo)
{
	__shared__ float red[32];
	const float *xr = x + blockIdx.x * n;
	float ss = 0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	ss = cu_block_sum(ss, red);
	float r = rsqrtf(ss / n + eps);
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		float y = xr[i] * r * (plus_one ? 1.0f + w[i] : w[i]);
		if (yf)
			yf[blockIdx.x * n + i] = y;
		bf16 hi = __float2bfloat16(y);
		if (yb)
			yb[blockIdx.x * n + i] = hi;
		if (ylo)
			ylo[blockIdx.x * n + i] = __float2bfloat16(y - __bfloat162float(hi));
	}
}

void cu_gemv_f32(struct cuda_backend *cb, float *out, const float *x, const struct toast_weight *W, int T)
{
	dim3 grid(cu_blocks((size_t)W->n_out, 8), T);
	cu_launch(cb, k_gemv_plain, grid, 256, 0, out, (int)TOAST_MM_F32, (const bf16 *)NULL, x, W->dev, (int)W->dev_type,
		  W->n_out, W->n_in);
	cu_launched(cb, "gemv (f32 input)");
}

void cu_norm_rows(struct cuda_backend *cb, const float *x, const struct toast_weight *w, int T, int64_t n, float eps,
		  bool plus_one, float *yf, bf16 *yb, bf16 *ylo)
{
	cu_launch(cb, k_norm_rows, T, 256, 0, x, (const float *)w->dev, n, eps, (int)plus_one, yf, yb, ylo);
	cu_launched(cb, "rmsnorm");
}

void cu_cublas(struct cuda_backend *cb, const struct toast_mm_out *o, const bf16 *in, int T)
{
	/* column-major: outᵀ [n_out x T] = W (row-major n_out x n_in = col-major n_in x n_out, op T) · inᵀ */
	const struct toast_weight *W = o->W;
	float alpha = 1.0f, beta = o->mode == TOAST_MM_ADD ? 1.0f : 0.0f;
	cudaDataType_t ct = o->mode == TOAST_MM_ACT ? CUDA_R_16BF : CUDA_R_32F;
	cublasStatus_t st = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->n_out, T, (int)W->n_in, &alpha,
					 W->dev, CUDA_R_16BF, (int)W->n_in, in, CUDA_R_16BF, (int)W->n_in, &beta, o->out,
					 ct, (int)W->n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		cu_fail_msg(cb, "cublasGemmEx %lldx%dx%lld: status %d", (long long)W->n_out, T, (long long)W->n_in, (int)st);
	cu_launched(cb, "matmul (cublas)");
}

template <int T, int ROWS>
static void gemv_launch(struct cuda_backend *cb, const gemv_args &a, unsigned blocks, size_t smem)
{
	static size_t room;
	if (!room)
		room = cu_allow_smem(cb, (const void *)k_gemv<T, ROWS>);
	if (smem > room) {
		cu_fail_msg(cb, "gemv: %zu bytes of shared memory needed, %zu allowed", smem, room);
		return;
	}
	cu_launch(cb, k_gemv<T, ROWS>, blocks, GEMV_WARPS * 32, smem, a);
}

template <int T>
static void gemv_launch_rows(struct cuda_backend *cb, gemv_args &a, const struct toast_mm_out *outs, int n_outs,
			     size_t smem)
{
	/* four rows a warp stream more bytes per load batch; one row a warp gives small matrices
	 * enough blocks to fill the GPU */
	int64_t rows = 0;
	for (int k = 0; k < n_outs; k++)
		rows += outs[k].W->n_out;
	int per_warp = rows >= (int64_t)cb->n_sm * GEMV_WARPS * 4 * 2 ? 4 : 1;
	int64_t blocks = 0;
	for (int k = 0; k < n_outs; k++) {
		a.job[k].first_block = blocks;
		blocks += (outs[k].W->n_out + GEMV_WARPS * per_warp - 1) / (GEMV_WARPS * per_warp);
	}
	if (per_warp == 4)
		gemv_launch<T, 4>(cb, a, (unsigned)blocks, smem);
	else
		gemv_launch<T, 1>(cb, a, (unsigned)blocks, smem);
}

void cu_matmul(struct cuda_backend *cb, const struct toast_mm_in *in, const struct toast_mm_out *outs, int n_outs,
	       int T)
{
	int64_t n_in = outs[0].W->n_in;
	bool fast = T <= CU_GEMV_MAX_T && n_in % 8 == 0 && (size_t)T * n_in * 4 + 1024 <= cb->smem_optin;
	for (int k = 0; k < n_outs; k++)
		fast = fast && outs[k].W->dev_type == TOAST_DT_BF16 && ((uintptr_t)outs[k].W->dev & 15) == 0;
	if (fast) {
		gemv_args a = {};
		for (int k = 0; k < n_outs; k++)
			a.job[k] = {outs[k].out, (const bf16 *)outs[k].W->dev, (int)outs[k].mode, outs[k].W->n_out, 0};
		a.n_jobs = n_outs;
		a.n_in = n_in;
		a.act = (const bf16 *)in->act;
		a.norm_x = in->norm_x;
		a.norm_w = in->act ? NULL : (const float *)in->norm_w->dev;
		a.eps = in->eps;
		a.plus_one = in->plus_one;
		a.norm_out = (bf16 *)in->norm_out;
		size_t smem = (size_t)T * n_in * 4;
		switch (T) {
		case 1: gemv_launch_rows<1>(cb, a, outs, n_outs, smem); break;
		case 2: gemv_launch_rows<2>(cb, a, outs, n_outs, smem); break;
		case 3: gemv_launch_rows<3>(cb, a, outs, n_outs, smem); break;
		case 4: gemv_launch_rows<4>(cb, a, outs, n_outs, smem); break;
		case 5: gemv_launch_rows<5>(cb, a, outs, n_outs, smem); break;
		case 6: gemv_launch_rows<6>(cb, a, outs, n_outs, smem); break;
		case 7: gemv_launch_rows<7>(cb, a, outs, n_outs, smem); break;
		default: gemv_launch_rows<8>(cb, a, outs, n_outs, smem); break;
		}
		cu_launched(cb, "gemv");
		return;
	}
	/* the general path: the input in memory once (bf16 for tensor cores, f32 for odd shapes) */
	const bf16 *xb = (const bf16 *)in->act;
	const float *xf = NULL;
	if (!xb) {
		size_t n = (size_t)T * n_in;
		char *scr = (char *)cu_scratch(cb, n * 6);
		if (!scr)
			return;
		float *yf = (float *)scr;
		bf16 *yb = in->norm_out ? (bf16 *)in->norm_out : (bf16 *)(scr + n * 4);
		cu_norm_rows(cb, in->norm_x, in->norm_w, T, n_in, in->eps, in->plus_one, yf, yb, NULL);
		xb = yb;
		xf = yf;
	}
	for (int k = 0; k < n_outs; k++) {
		const struct toast_weight *W = outs[k].W;
		if (T > CU_GEMV_MAX_T && W->dev_type == TOAST_DT_BF16) {
			cu_cublas(cb, &outs[k], xb, T);
			continue;
		}
		dim3 grid(cu_blocks((size_t)W->n_out, 8), T);
		cu_launch(cb, k_gemv_plain, grid, 256, 0, outs[k].out, outs[k].mode, xb, xf, W->dev, W->dev_type, W->n_out,
							    n_in);
		cu_launched(cb, "matmul (plain)");
	}
}
