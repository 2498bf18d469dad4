/*
 * k_quant.cu - quantised weights into and out of the device layout (cu_quant.cuh): the upload
 * that splits unaligned GGUF blocks into their planes, the synthetic fill (backend/synth_quant.h:
 * the same bytes the CPU backend makes, made on the device, where 45 GB take a second), and the
 * dequantisation of row ranges to bf16 or scaled fp16 for tensor-core GEMMs.
 */
#include "backend/cuda/cu_quant.cuh"

extern "C" {
#include "backend/synth_quant.h"
}

__global__ void k_q_split(uint8_t *dst, const uint8_t *src, size_t n, cu_qgeo g, size_t m_off, int64_t nb)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[cu_qdev_pos(g, m_off, nb, i)] = src[i];
}

/* tq_row: an MLX weight's bytes a row of codes when it is tiled (else 0) */
__global__ void k_q_synth(uint8_t *dst, size_t n, int type, cu_qgeo g, size_t m_off, uint64_t seed, int64_t n_in,
			  int64_t tq_row)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[tq_row ? cu_tile_pos(tq_row, 0, i) : cu_qdev_pos(g, m_off, n_in / g.blck, i)] =
			toast_synth_qbyte(type, seed, i, n_in);
}

/* (bf16 scales and biases; ng: groups a row when tiled, else 0) */
__global__ void k_q_synth_sb(uint16_t *scales, uint16_t *biases, size_t n_groups, int bits, uint64_t seed, int64_t n_in,
			     int64_t ng)
{
	for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n_groups; g += (size_t)gridDim.x * blockDim.x) {
		size_t at = ng ? cu_tile_pos(2 * ng, 2, 2 * g) / 2 : g;
		scales[at] = toast_synth_mlx_sb(bits, seed, g, 0, n_in);
		biases[at] = toast_synth_mlx_sb(bits, seed, g, 1, n_in);
	}
}

/* a row-major plane (n bytes, row_bytes a row) into its tiled place (cu_tile_pos) */
__global__ void k_q_tile(uint8_t *dst, const uint8_t *src, size_t n, int64_t row_bytes, int mu)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[cu_tile_pos(row_bytes, mu, i)] = src[i];
}

static unsigned q_grid(size_t n)
{
	unsigned b = cu_blocks(n, 256);
	return b < 65535u ? b : 65535u;
}

static enum toast_status q_copy(struct cuda_backend *cb, void *dst, const void *src, size_t n, const char *name,
				struct toast_error *err)
{
	if (cu_copy_in(cb, dst, src, n))
		return toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", name, cb->fail_msg);
	return TOAST_OK;
}

/* a tiled weight's padding rows are zeros (kernels read them, and drop what they give); count
 * weights stride bytes apart */
static void q_zero_tiles(struct cuda_backend *cb, void *dst, const struct toast_weight *w, const cu_layout &l,
			 size_t stride, int count)
{
	if (l.tiled && w->n_out % 16)
		cu_fail(cb, cudaMemsetAsync(dst, 0, stride * (size_t)(count - 1) + l.bytes, cb->stream), "weight padding");
}

/* count items of n file bytes each, one after another at src: copied to the device scratch, many
 * at a time (up to 64 MB), then each put where it goes by place(tmp, i) (a kernel named what).
 * Nothing waits for those kernels here: the stream orders the scratch's next copy after them. */
template <typename Fn>
static enum toast_status q_placed(struct cuda_backend *cb, const void *src, size_t n, int count, const char *name,
				  const char *what, struct toast_error *err, Fn place)
{
	const size_t batch = (size_t)64 << 20;
	int per = n >= batch ? 1 : (int)(batch / n) < count ? (int)(batch / n) : count;
	uint8_t *tmp = (uint8_t *)cu_scratch(cb, n * (size_t)per);
	if (!tmp)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: %s", name, cb->fail_msg);
	for (int i = 0; i < count; i += per) {
		int k = count - i < per ? count - i : per;
		enum toast_status rc = q_copy(cb, tmp, (const uint8_t *)src + n * (size_t)i, n * (size_t)k, name, err);
		if (rc != TOAST_OK)
			return rc;
		for (int j = 0; j < k; j++)
			place(tmp + n * (size_t)j, i + j);
		cu_launched(cb, what);
		if (cb->failed)
			return toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", name, cb->fail_msg);
	}
	return TOAST_OK;
}

/* a row-major plane of n bytes a weight (count of them one after another at src) into each
 * weight's place at dst + i * stride, tiled (cu_tile_pos) */
static enum toast_status q_tile_copy(struct cuda_backend *cb, uint8_t *dst, size_t stride, const void *src, size_t n,
				     int count, int64_t row_bytes, int mu, const char *name, struct toast_error *err)
{
	return q_placed(cb, src, n, count, name, "weight tiles", err, [&](const uint8_t *tmp, int i) {
		cu_launch(cb, k_q_tile, q_grid(n), 256, 0, dst + stride * (size_t)i, tmp, n, row_bytes, mu);
	});
}

/* a plane's bytes a weight in the file: codes, and for MLX the scales' and the biases' */
static void q_planes(const struct toast_weight *w, const cu_layout &l, size_t *nq, size_t *ns)
{
	*nq = cu_is_mlx(w->type) ? (size_t)l.q_row * (size_t)w->n_out : w->n_bytes;
	*ns = cu_is_mlx(w->type) ? (size_t)l.m_row * (size_t)w->n_out : 0;
}

bool cu_q_follows(const struct toast_weight *a, const struct toast_weight *b, const cu_layout &l)
{
	size_t nq, ns;
	q_planes(a, l, &nq, &ns);
	return b->data == (const uint8_t *)a->data + nq &&
	       (!ns || (b->scales == (const uint8_t *)a->scales + ns && b->biases == (const uint8_t *)a->biases + ns));
}

enum toast_status cu_q_upload(struct cuda_backend *cb, void *dst, size_t stride, const struct toast_weight *w, int count,
			      const cu_layout &l, struct toast_error *err)
{
	uint8_t *d = (uint8_t *)dst;
	size_t nq, ns;
	q_planes(w, l, &nq, &ns);
	if (cu_is_mlx(w->type) && l.tiled) {
		int mu = toast_dtypes[w->sb_type].type_size;
		q_zero_tiles(cb, d, w, l, stride, count);
		enum toast_status rc = q_tile_copy(cb, d, stride, w->data, nq, count, l.q_row, 0, w->name, err);
		if (rc == TOAST_OK)
			rc = q_tile_copy(cb, d + l.m_off, stride, w->scales, ns, count, l.m_row, mu, w->name, err);
		return rc == TOAST_OK ? q_tile_copy(cb, d + l.b_off, stride, w->biases, ns, count, l.m_row, mu, w->name, err)
				      : rc;
	}
	cu_qgeo g = cu_qgeo_for(w->type, w->n_in);
	if (!cu_is_mlx(w->type) && g.qb != g.bs) { /* split (and tiled) on the device */
		q_zero_tiles(cb, d, w, l, stride, count);
		return q_placed(cb, w->data, nq, count, w->name, "weight split", err, [&](const uint8_t *tmp, int i) {
			cu_launch(cb, k_q_split, q_grid(nq), 256, 0, d + stride * (size_t)i, tmp, nq, g, l.m_off,
				  (int64_t)(w->n_in / g.blck));
		});
	}
	/* as in the file: each weight's planes by a copy of their own */
	enum toast_status rc = TOAST_OK;
	for (int i = 0; rc == TOAST_OK && i < count; i++, d += stride) {
		rc = q_copy(cb, d, (const uint8_t *)w->data + nq * (size_t)i, nq, w->name, err);
		if (rc == TOAST_OK && ns)
			rc = q_copy(cb, d + l.m_off, (const uint8_t *)w->scales + ns * (size_t)i, ns, w->name, err);
		if (rc == TOAST_OK && ns)
			rc = q_copy(cb, d + l.b_off, (const uint8_t *)w->biases + ns * (size_t)i, ns, w->name, err);
	}
	return rc;
}

void cu_q_fill_synthetic(struct cuda_backend *cb, void *dst, const struct toast_weight *w, const cu_layout &l)
{
	uint8_t *d = (uint8_t *)dst;
	uint64_t seed = toast_synthetic_seed(w->name);
	size_t nq, ns;
	q_planes(w, l, &nq, &ns);
	bool mlx = cu_is_mlx(w->type);
	q_zero_tiles(cb, d, w, l, 0, 1);
	cu_launch(cb, k_q_synth, q_grid(nq), 256, 0, d, nq, (int)w->type, cu_qgeo_for(w->type, w->n_in), l.m_off, seed, w->n_in,
		  (int64_t)(mlx && l.tiled ? l.q_row : 0));
	if (mlx) {
		size_t ng = (size_t)w->n_out * (size_t)(w->n_in / w->group_size);
		cu_launch(cb, k_q_synth_sb, q_grid(ng), 256, 0, (uint16_t *)(d + l.m_off), (uint16_t *)(d + l.b_off), ng,
			  w->type == TOAST_DT_MLX4 ? 4 : 8, seed, w->n_in, (int64_t)(l.tiled ? w->n_in / w->group_size : 0));
	}
	cu_launched(cb, "synthetic quantised fill");
}

__global__ void k_q_dequant_bf16(cu_wd w, size_t e, int64_t r0, int64_t n, int64_t n_in, bf16 *out, bf16 *lo)
{
	int64_t n8 = n_in / 8;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * n8; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / n8, k = (i - r * n8) * 8;
		float y[8];
		cu_dq8(w, e, r0 + r, k, y);
		__nv_bfloat162 v[4], l[4];
		for (int j = 0; j < 4; j++) {
			v[j] = __floats2bfloat162_rn(y[2 * j], y[2 * j + 1]);
			float2 f = __bfloat1622float2(v[j]);
			l[j] = __floats2bfloat162_rn(y[2 * j] - f.x, y[2 * j + 1] - f.y);
		}
		*(uint4 *)(out + r * n_in + k) = *(const uint4 *)v;
		if (lo)
			*(uint4 *)(lo + r * n_in + k) = *(const uint4 *)l;
	}
}

/* element i of rows [r0, r0 + n) of a bf16 matrix */
__device__ __forceinline__ float q_bf16_at(const cu_wd &w, int64_t r0, int64_t n_in, int64_t i)
{
	int64_t r = i / n_in;
	return __bfloat162float(((const bf16 *)cu_row(w, 0, r0 + r).q)[i - r * n_in]);
}

/* the largest |value| of the n rows into *amax (f32 bits; zero it first) */
__global__ void k_q_amax(cu_wd w, int64_t n, int64_t n_in, unsigned *amax)
{
	int64_t n8 = n_in / 8;
	float m = 0;
	if (n_in & 7) { /* bf16 rows of any length (quantised ones are whole blocks) */
		for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * n_in; i += (int64_t)gridDim.x * blockDim.x)
			m = fmaxf(m, fabsf(q_bf16_at(w, 0, n_in, i)));
	} else {
		for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * n8; i += (int64_t)gridDim.x * blockDim.x) {
			int64_t r = i / n8, k = (i - r * n8) * 8;
			float y[8];
			cu_dq8(w, 0, r, k, y);
			for (int j = 0; j < 8; j++)
				m = fmaxf(m, fabsf(y[j]));
		}
	}
	cu_amax_add(m, amax);
}

/* rows [r0, r0 + n) as fp16 scaled by s = cu_f16_scale(*amax); alpha = 1 / (s * the input's) */
__global__ void k_q_dequant_f16(cu_wd w, int64_t r0, int64_t n, int64_t n_in, __half *out, const float *amax,
				float *slots)
{
	float s = cu_f16_scale(*amax);
	if (blockIdx.x == 0 && threadIdx.x == 0)
		slots[CU_F16_ALPHA] = 1.0f / (s * slots[CU_F16_SX]);
	int64_t n8 = n_in / 8;
	if (n_in & 7) {
		for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * n_in; i += (int64_t)gridDim.x * blockDim.x)
			out[i] = __float2half_rn(q_bf16_at(w, r0, n_in, i) * s);
		return;
	}
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * n8; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / n8, k = (i - r * n8) * 8;
		float y[8];
		cu_dq8(w, 0, r0 + r, k, y);
		__half2 v[4];
		for (int j = 0; j < 4; j++)
			v[j] = __floats2half2_rn(y[2 * j] * s, y[2 * j + 1] * s);
		*(uint4 *)(out + r * n_in + k) = *(const uint4 *)v;
	}
}

static unsigned q_f16_grid(struct cuda_backend *cb, int64_t n, int64_t n_in)
{
	unsigned blocks = cu_blocks((size_t)n * (size_t)(n_in % 8 ? n_in : n_in / 8), 256), cap = (unsigned)cb->n_sm * 16;
	return blocks < cap ? blocks : cap;
}

void cu_q_amax(struct cuda_backend *cb, const cu_wd &w, int64_t n_out, int64_t n_in, float *amax)
{
	cu_fail(cb, cudaMemsetAsync(amax, 0, sizeof(float), cb->stream), "weight maximum");
	cu_launch(cb, k_q_amax, q_f16_grid(cb, n_out, n_in), 256, 0, w, n_out, n_in, (unsigned *)amax);
	cu_launched(cb, "weight maximum");
}

void cu_q_dequant_f16(struct cuda_backend *cb, const cu_wd &w, int64_t r0, int64_t n, int64_t n_in, __half *out,
		      const float *amax)
{
	cu_launch(cb, k_q_dequant_f16, q_f16_grid(cb, n, n_in), 256, 0, w, r0, n, n_in, out, amax, cb->f16_slots);
	cu_launched(cb, "dequantise to fp16");
}

void cu_q_dequant_bf16(struct cuda_backend *cb, const cu_wd &w, size_t e, int64_t r0, int64_t n, int64_t n_in,
		       bf16 *out, bf16 *lo)
{
	size_t total = (size_t)n * (size_t)(n_in / 8);
	unsigned blocks = cu_blocks(total, 256);
	unsigned cap = (unsigned)cb->n_sm * 16;
	cu_launch(cb, k_q_dequant_bf16, blocks < cap ? blocks : cap, 256, 0, w, e, r0, n, n_in, out, lo);
	cu_launched(cb, "dequantise to bf16");
}
