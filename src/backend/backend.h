/*
 * backend.h - THE op interface between models and compute backends.
 *
 * A model is a sequence of calls to the ops below; a backend (cpu/, cuda/) implements them.
 * Models own no kernels and backends own no model logic beyond what an op's contract says.
 *
 * Precision. Matmul inputs are act (bf16 on the GPU, so tensor cores and half the bytes);
 * what feeds non-matmul math (attention q/k/v, the DeltaNet projections and gates, router
 * logits) is f32, since rounding there is amplified (a flipped expert, a drifting state).
 *
 * Memory. Every buffer an op touches is backend memory from alloc() (host memory on the CPU,
 * device memory on CUDA). Model code may offset pointers into a buffer but never reads it
 * except through read(). Element types:
 *   - "f32" buffers hold float (the residual stream, logits, recurrent state);
 *   - "act" buffers hold activations in the backend's act_type (F32 on the CPU, BF16 on CUDA);
 *     act_size is the bytes of one element. KV cache and conv state are act buffers.
 * All rows are contiguous: a [T][n] buffer has row t at t*n elements.
 *
 * Ordering. Ops run in call order on one queue; they may be asynchronous. read() and sync()
 * wait for all earlier ops. Ops do not fail individually: a backend that hits an error (a
 * sticky CUDA error) records it, does nothing more, and reports it from sync()/read().
 *
 * Steps. A forward pass over T tokens starting at position pos begins with begin_step(), which
 * hands the token ids to the backend. Ops also receive pos and T as plain ints; a backend that
 * records and replays a step (a CUDA graph) must read them from what begin_step() stored.
 */
#ifndef TOAST_BACKEND_H
#define TOAST_BACKEND_H

#include <stdbool.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/draw.h"
#include "format/dtype.h"
#include "util/err.h"

/*
 * A weight matrix (or vector): n_out rows of n_in elements, row-major, of type `type`
 * (y = W·x has n_out outputs). A vector has n_out == 1. `data` is host memory (mmap or heap)
 * and stays valid while the engine lives; `dev` is the backend's copy made by prepare_weight()
 * (the CPU backend computes from `data` directly and leaves dev NULL).
 *
 * Quantised types (layouts and exact dequantisation in format/quant.h; toast_dequant() is the
 * reference): for GGUF block types (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) each row is n_in/blck
 * whole blocks, so row r starts at byte r * n_in/blck * type_size. For MLX affine types
 * (MLX4, MLX8) `data` is the packed uint32 words [n_out][n_in*bits/32] and `scales`, `biases`
 * are [n_out][n_in/group_size] of sb_type (BF16, F16 or F32). n_bytes counts all of them.
 */
struct toast_weight {
	const char *name; /* for messages */
	enum toast_dtype type;
	int64_t n_in, n_out;
	const void *data; /* NULL for a synthetic weight: prepare_weight fills it with random values */
	void *dev;
	size_t n_bytes;
	enum toast_dtype dev_type; /* element type of dev, chosen by the backend */
	const void *scales, *biases; /* MLX affine only, else NULL */
	enum toast_dtype sb_type;
	int group_size;
};

/* A set of same-shaped expert matrices, one per expert. */
struct toast_experts {
	int n_expert;
	struct toast_weight *w; /* [n_expert] */
	void *dev;              /* backend-side packing of all experts (backend-defined) */
};

/*
 * Synthetic weights (benchmarks at real shapes without files): a weight with data == NULL is
 * made by prepare_weight/prepare_experts in the type the binder gave it, deterministically from
 * toast_synthetic_seed(name):
 *   - BF16 matrices and F32 vectors (n_out == 1): toast_synthetic_value(), matrices uniform in
 *     [-1/sqrt(n_in), 1/sqrt(n_in)], vectors uniform in [0, 0.1];
 *   - quantised types (GGUF blocks, MLX4/MLX8 with group 64 and BF16 scales/biases): the packed
 *     bytes defined in backend/synth_quant.h (random quants, bounded power-of-two scale fields),
 *     integer arithmetic only, so the CPU (toast_synthetic_fill_quant) and the CUDA backend (on
 *     the device) make identical bytes; n_bytes is then the packed size, scales and biases
 *     included.
 */
uint64_t toast_synthetic_seed(const char *name);
float toast_synthetic_value(uint64_t seed, uint64_t i, int64_t n_in, int64_t n_out);
/* Describe the synthetic weight `name` of type t (data NULL): MLX types get group size 64 and
 * BF16 scales; n_bytes is the packed size. t is F32, BF16 or quantised with whole-block rows. */
void toast_synthetic_weight(struct toast_weight *w, const char *name, enum toast_dtype t, int64_t n_out, int64_t n_in);
/* Fill buf (w->n_bytes) with the synthetic quantised weight w (type, n_in, n_out, name; MLX:
 * group_size) and point w->data (and scales, biases, sb_type for MLX: data, then scales, then
 * biases, in buf) at it. */
void toast_synthetic_fill_quant(struct toast_weight *w, void *buf);

enum toast_mm_mode {
	TOAST_MM_ACT, /* out (act) = in · Wᵀ */
	TOAST_MM_F32, /* out (f32) = in · Wᵀ */
	TOAST_MM_ADD, /* out (f32) += in · Wᵀ   (residual add) */
	TOAST_MM_GLU, /* out (act) = SiLU(in · Wᵀ) * (in · W2ᵀ)   (a dense MLP's gate and up; the call's only output) */
};

/*
 * The input of a matmul: act rows, f32 rows, or the RMSNorm of f32 rows computed on the way in,
 * y = x / sqrt(mean(x²) + eps) * (plus_one ? 1 + w : w) (so a backend can fuse the norm into
 * the projections that read it, and keep the normed input in f32 while it does). A backend may
 * round f32 rows (xf, y) to a 16-bit type for its products; it reads them at least as finely as
 * act rows.
 */
struct toast_mm_in {
	const void *act;                   /* act [T][n_in], or NULL */
	const float *xf;                   /* f32 [T][n_in] when act is NULL, or NULL: the input is the norm of norm_x */
	const float *norm_x;               /* f32 [T][n_in] */
	const struct toast_weight *norm_w; /* [n_in] */
	float eps;
	bool plus_one;
	void *norm_out;                    /* NULL, or act [T][n_in] that receives y */
	/* optional: backend memory the op after this one reads that no op before it wrote this step
	 * (the DeltaNet state), which a backend may start fetching while this op streams its weights
	 * (CUDA: into L2), or NULL */
	const void *prefetch;
	size_t prefetch_bytes;
};

/* One output of a matmul: out [T][W.n_out] (per mode) = input · Wᵀ. */
struct toast_mm_out {
	void *out;
	enum toast_mm_mode mode;
	const struct toast_weight *W;
	const struct toast_weight *W2; /* TOAST_MM_GLU: the up matrix (W's type and shape) */
};

#define TOAST_MM_MAX_OUT 4

/*
 * KV cache formats (toast_attn_args.kv_type). A cache is two buffers, K and V, of one attention
 * layer, each holding n_ctx tokens of n_head_kv heads of head_dim values:
 *   TOAST_KV_ACT: act rows [n_ctx][n_head_kv*head_dim] (bf16 on the GPU, f32 on the CPU);
 *   TOAST_KV_Q8:  8-bit codes with an f32 scale per (token, head), in units of TOAST_KV_UNIT
 *       tokens, a unit toast_kv_unit_bytes() long: the codes (kvd = n_head_kv*head_dim bytes a
 *       token; K: [token][kvd], token-major; V: [kvd][token], each value's 4 tokens side by side),
 *       then the scales [n_head_kv][TOAST_KV_UNIT] f32. A code is the byte q + 128 of
 *       q = rint(x * 127 / amax) (|q| <= 127, amax the head's largest |x|; all 0 when amax is 0),
 *       the scale amax / 127: x ~ q * scale, within amax / 254. Half the bytes of bf16 (decode at
 *       long context reads them all).
 * The bytes of tokens [0, n) are a prefix of each buffer: toast_kv_bytes(n) of them (a state
 * image copies that much; Q8 rounds n up to whole units, whose tokens past n are never read).
 */
enum toast_kv_type { TOAST_KV_ACT, TOAST_KV_Q8 };
#define TOAST_KV_UNIT 4
size_t toast_kv_bytes(enum toast_kv_type t, int n_head_kv, int head_dim, size_t act_size, int64_t n);
/* The Q8 layout and rounding below are defined once, for the host and (compiled by nvcc) the
 * device. */
#ifdef __CUDACC__
#define TOAST_HOST_DEVICE __host__ __device__
#else
#define TOAST_HOST_DEVICE
#endif
/* bytes of a Q8 unit */
static inline TOAST_HOST_DEVICE size_t toast_kv_unit_bytes(int n_head_kv, int head_dim)
{
	return (size_t)TOAST_KV_UNIT * ((size_t)n_head_kv * (size_t)head_dim + (size_t)n_head_kv * sizeof(float));
}
/* where head h of token t's codes start in a Q8 buffer (value i at + i, or + i * TOAST_KV_UNIT
 * in V), and where its scale is */
static inline TOAST_HOST_DEVICE size_t toast_kv_q8_code_at(int n_head_kv, int head_dim, bool is_v, int64_t t, int h)
{
	size_t unit = (size_t)(t / TOAST_KV_UNIT) * toast_kv_unit_bytes(n_head_kv, head_dim), s = (size_t)(t % TOAST_KV_UNIT);
	return is_v ? unit + (size_t)h * head_dim * TOAST_KV_UNIT + s
		    : unit + s * (size_t)n_head_kv * head_dim + (size_t)h * head_dim;
}
static inline TOAST_HOST_DEVICE size_t toast_kv_q8_scale_at(int n_head_kv, int head_dim, int64_t t, int h)
{
	size_t unit = (size_t)(t / TOAST_KV_UNIT) * toast_kv_unit_bytes(n_head_kv, head_dim);
	return unit + (size_t)TOAST_KV_UNIT * n_head_kv * head_dim +
	       ((size_t)h * TOAST_KV_UNIT + (size_t)(t % TOAST_KV_UNIT)) * sizeof(float);
}
/* the Q8 code of x for a head whose largest |value| is amax, and the scale stored with them */
static inline TOAST_HOST_DEVICE int toast_kv_q8_code(float x, float amax)
{
	float v = amax > 0 ? rintf(x * (127.0f / amax)) : 0.0f;
	return (int)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v) + 128;
}
static inline TOAST_HOST_DEVICE float toast_kv_q8_scale(float amax)
{
	return amax / 127.0f;
}
/* Q8 on the host (the CPU backend, tests): store head h of token t (x: head_dim values) into
 * the K (is_v false) or V buffer buf, or read it back dequantised */
void toast_kv_q8_put(void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h, const float *x);
void toast_kv_q8_get(const void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h, float *x);
/* head h of token t in place: its codes (value i at [i], in V at [i * TOAST_KV_UNIT]) and its
 * scale */
const unsigned char *toast_kv_q8_codes(const void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h,
				       float *scale);

/*
 * Gated attention with a KV cache, for T new tokens at positions pos..pos+T-1. In one op:
 * optional per-head RMSNorm of q and k (before RoPE), NeoX RoPE on the first n_rot dims of
 * each head (pairs (i, i + n_rot/2)), K/V written to the cache at rows pos..pos+T-1, causal
 * softmax attention over cache rows 0..pos+t with scale 1/sqrt(head_dim), query head h reading
 * KV head h / (n_head / n_head_kv), and when gated, o *= sigmoid(gate) elementwise.
 * RoPE angles are f32: pos * inv_freq_i with inv_freq_i = 1 / theta^(2i/n_rot) computed in f32
 * and then rounded to rope_freq_type (F32, BF16 or F16): the reference implementation keeps
 * inv_freq in the checkpoint's dtype, and matching it matters over long contexts.
 */
struct toast_attn_args {
	const float *q;                     /* f32 [T][n_head][gated ? 2*head_dim : head_dim]: per head [q | gate] */
	const float *k, *v;                 /* f32 [T][n_head_kv*head_dim] */
	const struct toast_weight *q_norm;  /* [head_dim] or NULL (then k_norm is NULL too) */
	const struct toast_weight *k_norm;
	bool norm_plus_one;                 /* norm weight is (1 + w) (zero-centred) */
	float eps;
	int n_head, n_head_kv, head_dim, n_rot;
	float rope_theta;
	enum toast_dtype rope_freq_type;
	bool gated;
	enum toast_kv_type kv_type;
	void *k_cache, *v_cache;            /* n_ctx tokens each, as kv_type lays them out */
	int n_ctx, pos, T;
	void *out;                          /* act [T][n_head*head_dim] */
	int span;                           /* 0, or a bound pos + T <= span <= n_ctx that a recorded
					       decode step is keyed on (the CUDA backend sizes its
					       key splits by it, not by n_ctx) */
};

/*
 * Gated DeltaNet mixer for T tokens, continuing from conv_state/ssm_state and updating them:
 * causal depthwise conv (kernel conv_k) + SiLU over the conv channels [q | k | v], L2-norm of
 * q and k per key head (q also scaled by d_k^-1/2), beta = sigmoid(b),
 * g = -exp(A_log) * softplus(a + dt_bias) per value head, the delta rule (value head h uses key
 * head h / (n_v_head / n_k_head)), then per value head RMSNorm(o) * norm_w * SiLU(z).
 *
 * Input layouts. Flat (Qwen3.5): qkv [T][conv_dim] with conv_dim = 2*n_k_head*d_k + n_v_head*d_v
 * in channel order [q heads | k heads | v heads], z [T][n_v_head*d_v]. Grouped (Qwen3-Next
 * in_proj_qkvz): qkv [T][conv_dim + n_v_head*d_v], per key head g the run
 * [q_g | k_g | v of its r value heads | z of its r value heads], and z is unused.
 * ba: flat b [T][n_v_head] and a [T][n_v_head]; grouped (in_proj_ba) ba [T][2*n_v_head], per key
 * head [b of its r value heads | a of its r value heads], and a is unused.
 * Value-head order: value head h reads key head h / (n_v_head / n_k_head) (grouped, Hugging Face),
 * or h % n_k_head when v_heads_tiled (llama.cpp's qwen35 GGUFs reorder value heads that way; all
 * per-value-head tensors are in that order then, so only the key-head mapping changes).
 * All inputs are f32. conv_state (f32 [2][conv_k-1][conv_dim]) has two slots of the last
 * conv_k-1 raw (pre-conv) inputs, oldest first, in flat channel order: the op reads slot
 * pos & 1 and leaves the new state in slot (pos + T) & 1, so that a backend can compute a
 * decode step in blocks that all read the old state while one writes the new one. ssm_state
 * is [n_v_head][d_v][d_k] f32 (S[h][j][i]: key dim i contiguous).
 */
struct toast_gdn_args {
	const float *qkv, *z, *b, *a;
	bool qkvz_grouped, ba_grouped;
	const struct toast_weight *conv_w;  /* [conv_dim][conv_k] */
	const struct toast_weight *A_log;   /* [n_v_head]; when a_is_neg_exp holds -exp(A_log) instead */
	bool a_is_neg_exp;
	const struct toast_weight *dt_bias; /* [n_v_head] */
	const struct toast_weight *norm_w;  /* [d_v], used as is */
	int n_k_head, n_v_head, d_k, d_v, conv_k;
	float eps;
	float *conv_state;                  /* f32 [2][conv_k-1][conv_dim] */
	float *ssm_state;                   /* f32 [n_v_head][d_v][d_k] */
	int pos, T;
	float *out;                         /* f32 [T][n_v_head*d_v] (out_proj's input: the models' precision
					       is most sensitive to its rounding, docs/PERF.md) */
	bool v_heads_tiled;                 /* value head h reads key head h % n_k_head (see above) */
	/* Optional (NULL: not kept; both or neither): the states after each token t < T - 1 of the
	 * step, for a caller that may keep only its first t + 1 tokens (a speculative step):
	 * ssm_keep [T-1][n_v_head][d_v][d_k] as ssm_state, conv_keep [T-1][conv_k-1][conv_dim] the
	 * last conv_k-1 raw inputs up to token t, oldest first (one slot). A backend may take them
	 * only for T <= TOAST_GDN_KEEP_MAX. */
	float *ssm_keep, *conv_keep;
};
#define TOAST_GDN_KEEP_MAX 8

/*
 * Mixture of experts with optional shared expert, added to the residual:
 * p = softmax(router · h) over n_expert (fp32), the n_expert_used largest (ties: lower index),
 * renormalised to sum 1 when norm_topk; each chosen expert e adds
 * p_e · down_e(SiLU(gate_e·h) ⊙ up_e·h); the shared expert adds
 * sigmoid(sh_gate_inp · h) · down_s(SiLU(gate_s·h) ⊙ up_s·h) (no sigmoid factor when
 * sh_gate_inp is NULL), where h = RMSNorm(x) with norm_w (as struct toast_mm_in defines it).
 * The router and the shared gate see h in f32 (a near-tie must not flip on rounding).
 */
struct toast_moe_args {
	float *x;                               /* f32 [T][n_embd]: read (normed: the input), then += the output */
	const struct toast_weight *norm_w;      /* [n_embd] */
	float eps;
	bool plus_one;
	const struct toast_weight *router;      /* [n_expert][n_embd] */
	const struct toast_experts *gate, *up;  /* [n_ff][n_embd] each */
	const struct toast_experts *down;       /* [n_embd][n_ff] each */
	int n_expert, n_expert_used;
	bool norm_topk;
	const struct toast_weight *sh_gate, *sh_up, *sh_down; /* NULL when there is no shared expert */
	const struct toast_weight *sh_gate_inp;               /* [1][n_embd] or NULL */
	int n_embd, n_ff, n_ff_sh, T;
};

/* inv_freq_i of RoPE as the attention op contract defines it (f32, rounded to freq_type) */
float toast_rope_inv_freq(float theta, int i, int n_rot, enum toast_dtype freq_type);

struct toast_backend;
struct toast_draw;

struct toast_backend_ops {
	void (*free)(struct toast_backend *be);

	/* memory: alloc returns zeroed backend memory or NULL */
	void *(*alloc)(struct toast_backend *be, size_t n_bytes);
	void (*release)(struct toast_backend *be, void *p);
	void (*write)(struct toast_backend *be, void *dst, const void *src, size_t n_bytes); /* host -> backend */
	enum toast_status (*read)(struct toast_backend *be, void *dst, const void *src, size_t n_bytes,
				  struct toast_error *err); /* backend -> host, waits */
	void (*copy)(struct toast_backend *be, void *dst, const void *src, size_t n_bytes);
	void (*zero)(struct toast_backend *be, void *dst, size_t n_bytes);
	enum toast_status (*sync)(struct toast_backend *be, struct toast_error *err);

	/* make w (or experts) usable by the ops (upload to the device); CPU: nothing */
	enum toast_status (*prepare_weight)(struct toast_backend *be, struct toast_weight *w, struct toast_error *err);
	enum toast_status (*prepare_experts)(struct toast_backend *be, struct toast_experts *x, struct toast_error *err);

	/* start a forward step over ids[0..T) (host memory) at positions pos.. */
	void (*begin_step)(struct toast_backend *be, const int32_t *ids, int T, int pos);
	/*
	 * Optional (NULL on backends that do not record): replay of recorded decode steps. After
	 * begin_step, graph_begin(key) returns true when it launched the step recorded under key
	 * (the caller then skips the ops); otherwise the caller runs the ops and calls
	 * graph_end(key), which finishes a recording if one was started. A key names everything
	 * a step touches (state, buffers, T == 1); steps under one key differ only in what
	 * begin_step stored. A backend records a key only after running it once normally.
	 */
	bool (*graph_begin)(struct toast_backend *be, uint64_t key);
	void (*graph_end)(struct toast_backend *be, uint64_t key);

	/* x (f32 [T][n_embd]) = rows ids[t] of W ([n_vocab][n_embd]) for the step's ids */
	void (*embed)(struct toast_backend *be, float *x, const struct toast_weight *W, int T);
	/* n_outs (<= TOAST_MM_MAX_OUT) products of one input with weights of the same n_in;
	 * an output never aliases the input */
	void (*matmul)(struct toast_backend *be, const struct toast_mm_in *in, const struct toast_mm_out *outs,
		       int n_outs, int T);
	void (*attention)(struct toast_backend *be, const struct toast_attn_args *a);
	void (*gdn)(struct toast_backend *be, const struct toast_gdn_args *a);
	void (*moe)(struct toast_backend *be, const struct toast_moe_args *a);

	/* Host memory that write() and read() move fastest (pinned on CUDA, plain on the CPU),
	 * not zeroed, or NULL; freed with host_release (NULL allowed). For state snapshots. */
	void *(*host_alloc)(struct toast_backend *be, size_t n_bytes);
	void (*host_release)(struct toast_backend *be, void *p);
	/* Bytes of backend memory free now (GPU memory on CUDA, available RAM on the CPU). */
	size_t (*mem_free)(struct toast_backend *be);
	/* The m (1..TOAST_TOP_MAX) largest of x[0..n) (backend memory): ids and values (host) in
	 * order, larger value first, the lower index first among equal values (-0 equals +0), NaN
	 * never; the same answer as toast_top_host. Returns how many (fewer than m when fewer than
	 * m values are not NaN), or -1 on a backend failure (err set). Waits for earlier ops. */
	int (*top)(struct toast_backend *be, const float *x, int n, int m, int32_t *ids, float *vals,
		   struct toast_error *err);
	/* Optional (NULL: not measured): the rate of a large bf16 GEMM as the prefill runs them, in
	 * FLOP/s, measured now: the denominator of a compute floor. */
	double (*gemm_rate)(struct toast_backend *be);
	/* Optional (NULL: use sync): the failures recorded so far, without waiting for the ops in
	 * flight (a replayed decode step returns at once; its errors show at the next read). */
	enum toast_status (*status)(struct toast_backend *be, struct toast_error *err);
	/*
	 * Optional (NULL: the host picks): decoding without a round trip to the host between
	 * steps. pick(x, n, d) queues the pick of a token from x[0..n) (backend memory): with d
	 * NULL the largest (top()'s order: the lower index among equals, NaN never, id 0 when all
	 * are NaN), else the draw d (d->n_top <= TOAST_TOP_MAX, d->n_recent too) as
	 * toast_draw_pick makes it on the host from top()'s answer (draw.h; with d->prev, the
	 * token of the pick queued before this one counts as seen), or, d->n_top 0, from every
	 * logit, as toast_pick_host makes it; at most two are pending.
	 * begin_step_pick(pos) is begin_step for one token at pos that is the last pick queued,
	 * read on the device. pick_read() waits for the oldest pending pick and returns its token
	 * (-1 on a backend failure, err set).
	 */
	void (*pick)(struct toast_backend *be, const float *x, int n, const struct toast_draw *d);
	void (*begin_step_pick)(struct toast_backend *be, int pos);
	int32_t (*pick_read)(struct toast_backend *be, struct toast_error *err);
	/* Optional (NULL: pick() then pick_read() a row at a time): the picks of rows (<=
	 * TOAST_TOP_MAX) rows of n values (x row-major, backend memory), row r's as pick(x + r n, n,
	 * d ? d + r : NULL) makes it (no d[r].prev), 0 for a row of NaN, with one wait; pending picks
	 * stay pending. Returns 0, or -1 on a backend failure (err set). */
	int (*pick_rows)(struct toast_backend *be, const float *x, int n, int rows, const struct toast_draw *d,
			 int32_t *ids, struct toast_error *err);
	/* Optional (NULL: copy() each): n copies between backend buffers (sizes whole 4-byte words),
	 * queued in a launch or few (a rewind's states: two a DeltaNet layer) */
	void (*copy_many)(struct toast_backend *be, void *const *dst, const void *const *src, const size_t *n_bytes,
			  int n);
};

#define TOAST_TOP_MAX 256
/* top() on host memory: the reference every backend's top() matches exactly */
int toast_top_host(const float *x, int n, int m, int32_t *ids, float *vals);
/* The key (top()'s order: the value's order, toast_draw_order's, in the high word, the complement
 * of the index in the low) of the k-th largest of x[0..n) that are not NaN; 0 when k is 0 or
 * there are no more than k. keys: scratch of n. */
uint64_t toast_top_key(const float *x, int n, int k, uint64_t *keys);
/* What a pick (toast_backend_ops.pick) of x[0..n) (host memory) chooses, prev the pending pick's
 * token (counted when d->prev): the largest (d NULL), toast_draw_pick's draw from top()'s
 * d->n_top largest, or, n_top 0, the draw from every logit (n <= TOAST_DRAW_WIDE_MAX): the penalty
 * on every token seen, then the best (temperature 0), toast_draw_pick's draw from the top_k best
 * (top_k 1..TOAST_TOP_MAX), or toast_draw_wide's from all or (top_k over TOAST_TOP_MAX) from the
 * top_k best; -1 when its scratch cannot be had. */
int32_t toast_pick_host(const float *x, int n, const struct toast_draw *d, int32_t prev);

struct toast_backend {
	const struct toast_backend_ops *ops;
	const char *name;
	enum toast_dtype act_type;
	size_t act_size;
	/* a forward pass returns once its ops are queued (the host may work while they run): a
	 * generation loop then feeds a token before it streams the token's text, and chains
	 * its steps (ops.pick) */
	bool async_steps;
	void *impl;
};

/* Move n bytes from src to dst, each in backend memory or (*_host) in host memory: copy(),
 * read(), write() or memcpy. Waits for earlier ops when host memory is involved; a copy between
 * two backend buffers is queued like any op. */
enum toast_status toast_backend_move(struct toast_backend *be, void *dst, bool dst_host, const void *src,
				     bool src_host, size_t n, struct toast_error *err);

/* Backends. toast_backend_cpu_new never fails for lack of a GPU; cuda_new fails with a message
 * when there is no usable device or the build has no CUDA. */
enum toast_status toast_backend_cpu_new(int n_threads, struct toast_backend **out, struct toast_error *err);
enum toast_status toast_backend_cuda_new(struct toast_backend **out, struct toast_error *err);
/* true when this build has CUDA and a device answers */
bool toast_backend_cuda_available(void);
void toast_backend_free(struct toast_backend *be);

#endif
