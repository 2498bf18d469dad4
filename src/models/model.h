/*
 * model.h - the Qwen3 family of decoders (qwen3, qwen3_moe, qwen3_next, qwen3_5 dense and MoE) and
 * Llama (attention without q/k norm or gate, dense SwiGLU MLP, plain RMSNorm):
 * hyper-parameters, weights bound to a backend, per-session state, and the forward pass as a
 * sequence of backend ops.
 *
 * One place owns the KV/recurrent-state layout: struct toast_state, made by
 * toast_model_state_new(). The engine owns when a state is used; the model only computes.
 */
#ifndef TOAST_MODELS_MODEL_H
#define TOAST_MODELS_MODEL_H

#include <stdbool.h>

#include "backend/backend.h"
#include "format/gguf.h"
#include "format/tensordir.h"

enum toast_arch {
	TOAST_ARCH_QWEN3,
	TOAST_ARCH_QWEN3_MOE,
	TOAST_ARCH_QWEN3_NEXT,
	TOAST_ARCH_QWEN35,
	TOAST_ARCH_QWEN35_MOE,
	TOAST_ARCH_LLAMA,
};

#define TOAST_MAX_EOS 8

struct toast_hparams {
	enum toast_arch arch;
	const char *arch_name;
	int n_vocab, n_embd, n_layer, n_ctx_train;
	int n_head, n_head_kv, head_dim, n_rot;
	float rope_theta, norm_eps;
	enum toast_dtype rope_freq_type; /* the checkpoint dtype: see toast_attn_args */
	bool norm_plus_one; /* zero-centred RMSNorm weights (1 + w); false when a converter baked +1 in */
	bool a_is_neg_exp;  /* GDN A stored as -exp(A_log) (GGUF ssm_a) */
	bool v_heads_tiled; /* GDN value heads in tiled order (llama.cpp qwen35 GGUF): see toast_gdn_args */
	bool attn_gated;    /* q_proj carries a per-head output gate */
	bool tie_embd;
	int n_ff;                       /* dense MLP width */
	int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
	bool norm_topk;
	int ssm_n_k_head, ssm_n_v_head, ssm_d_k, ssm_d_v, ssm_conv_k;
	bool *layer_is_attn; /* [n_layer] */
	bool *layer_is_moe;  /* [n_layer] */
	int n_eos;
	int32_t eos[TOAST_MAX_EOS];
	int32_t bos; /* -1 if none */
};

struct toast_layer {
	bool is_attn, is_moe;
	struct toast_weight attn_norm, ffn_norm;
	/* attention */
	struct toast_weight wq, wk, wv, wo, q_norm, k_norm;
	bool has_qk_norm;
	/* gated deltanet: qkv is in_proj_qkvz when qkvz_grouped, z unused then; likewise b/ba */
	struct toast_weight ssm_qkv, ssm_z, ssm_b, ssm_a, ssm_conv, ssm_A, ssm_dt, ssm_norm, ssm_out;
	bool qkvz_grouped, ba_grouped;
	/* dense MLP */
	struct toast_weight ffn_gate, ffn_up, ffn_down;
	/* MoE */
	struct toast_weight router;
	struct toast_experts gate_exps, up_exps, down_exps;
	bool has_shexp;
	struct toast_weight sh_gate, sh_up, sh_down, sh_gate_inp;
	bool has_sh_gate_inp;
};

/*
 * Quantisation mixes, named as llama.cpp names its file types (`toasted convert --type`,
 * `--quant`): which type each matrix gets is toast_quant_pick() (models/quantize.c).
 */
enum toast_quant_mix {
	TOAST_MIX_NONE, /* weights as stored */
	TOAST_MIX_BF16,
	TOAST_MIX_Q8_0,
	TOAST_MIX_Q4_0,
	TOAST_MIX_Q4_1,
	TOAST_MIX_Q4_K_M,
	TOAST_MIX_Q5_K_M,
	TOAST_MIX_Q6_K,
};

struct toast_model {
	struct toast_hparams hp;
	struct toast_weight tok_embd, output_norm, output;
	struct toast_layer *layers;
	struct toast_tensordir td; /* tensors under Hugging Face names */
	struct toast_gguf gguf;    /* the open GGUF file when loaded from one (td points into it) */
	bool is_gguf;
	struct toast_backend *be;
	size_t weight_bytes, decode_bytes;
	double token_flops; /* one token's matrix products: 2 per weight element read at decode */
	bool quantized; /* some matrix is of a quantised type */
	bool output_tied;    /* lm_head is the embedding table */
	bool synthetic;      /* weights made by the backend, no files (benchmarks) */
	enum toast_kv_type kv_type; /* of the states made (set before the first; backend.h) */
	char **synth_names;  /* names of synthetic weights, owned */
	enum toast_dtype synth_type; /* their matrices' type (see toast_model_load_synthetic) */
	enum toast_quant_mix synth_mix; /* or, when not NONE, the mix that picks each one's */
	size_t n_synth_names;
	toast_progress_cb progress; /* while loading: after each layer is prepared (may be NULL) */
	void *progress_ud;
};

/* The bound (n_out > 0) per-layer weights of l, experts excepted; returns their count. */
#define TOAST_LAYER_MAX_WEIGHTS 25
int toast_layer_weights(struct toast_layer *l, struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS]);

#define TOAST_RECORD_MAX_T 8 /* the most tokens of a recorded pass: T - 1 is 3 bits of its key */

/* Per-session state: KV caches of attention layers, conv and recurrent states of GDN layers. */
struct toast_state {
	uint64_t id; /* unique per state made: keys recorded decode steps */
	int n_ctx;
	int record_T; /* passes of up to this many tokens (at most TOAST_RECORD_MAX_T) are recorded as
			 decode's one is (a benchmark's, a speculative decoder's; 0: decode's one token only) */
	void **k_cache, **v_cache; /* [n_layer] n_ctx tokens as m->kv_type lays them out (backend.h), NULL for GDN layers */
	float **conv;              /* [n_layer] f32 [2][conv_k-1][conv_dim], NULL for attention layers */
	float **ssm;               /* [n_layer] f32 [n_v_head][d_v][d_k], NULL for attention layers */
	/* toast_model_state_keep: a forward of 2..keep_T tokens also leaves each GDN layer's states
	 * after each of its tokens but the last (toast_gdn_args' ssm_keep and conv_keep, [keep_T-1]
	 * of them a layer), so that toast_model_state_rewind can keep fewer of its tokens */
	int keep_T;
	float **ssm_keep, **conv_keep; /* [n_layer], NULL for attention layers */
};

/* Activation buffers for forward passes of up to max_T tokens. */
struct toast_work {
	int max_T;
	float *x;      /* f32 [max_T][n_embd] */
	void *h;       /* act [max_T][n_embd]: the normed residual, when a layer hook wants it */
	float *q, *k, *v;     /* attention projections (f32) */
	void *o;              /* attention output (act) */
	float *qkv, *z, *b, *a; /* gdn projections (f32) */
	float *g_out;          /* gdn output (f32) */
	void *ff_act;         /* dense MLP: SiLU(gate) * up (act) */
	float *logits;        /* f32 [n_vocab]: the last token's (what decode and sampling read) */
	float *logits_all;    /* f32 [max_T][n_vocab] or NULL: every row of a chunk, made the first
				 time a forward asks for them (a check, a hook), so that a prefill chunk
				 of 4,096 does not hold 2.5 GB for one row */
};

/* the per-layer callback of toast_session_feed_layers() (toasted.h) */
typedef toast_layer_cb toast_layer_hook;

/*
 * Load and bind a model: a directory (config.json + safetensors) or a GGUF file. quant:
 * TOAST_MIX_NONE to use the weights as stored, else quantise the matrices at load time
 * (toast_model_quantize). progress (may be NULL) is called after each layer's weights are
 * prepared on the backend and may cancel the load (TOAST_ERR_CANCELLED).
 */
enum toast_status toast_model_load(struct toast_model *m, const char *path, struct toast_backend *be,
				   enum toast_quant_mix quant, toast_progress_cb progress, void *progress_ud,
				   struct toast_error *err);
void toast_model_unload(struct toast_model *m);
/* A model of the shape described by config_json (a config.json text) with synthetic weights
 * (backend.h): for benchmarks at real shapes. n_layer > 0 overrides the layer count. type
 * (BF16 or a quantised type) is that of the matrices, as a published checkpoint of that type
 * has them: vectors are F32; the MoE router stays BF16 (GGUF types; llama.cpp keeps it
 * unquantised) or is MLX8 under MLX types (mlx-lm keeps routers at 8 bits); a matrix whose rows
 * are not whole blocks (the GDN conv1d) is BF16; MLX weights have group 64 and BF16 scales.
 * mix, when not TOAST_MIX_NONE, replaces type: each matrix gets what toast_quant_pick() gives a
 * converted file (Q4_K_M: Q6_K for the output and some layers' v_proj and down_proj). */
enum toast_status toast_model_load_synthetic(struct toast_model *m, const char *config_json, int n_layer,
					     enum toast_dtype type, enum toast_quant_mix mix, struct toast_backend *be,
					     struct toast_error *err);
/* The config.json text of a named real model shape ("qwen3-next-80b-a3b", ...), or NULL. */
const char *toast_model_preset(const char *name);
/* Parse config.json text into hp (exposed for tests). */
enum toast_status toast_hparams_parse(struct toast_hparams *hp, const char *json_text, struct toast_error *err);
void toast_hparams_free(struct toast_hparams *hp);

enum toast_status toast_model_state_new(const struct toast_model *m, int n_ctx, struct toast_state *s,
					struct toast_error *err);
void toast_model_state_free(const struct toast_model *m, struct toast_state *s);
void toast_model_state_zero(const struct toast_model *m, struct toast_state *s);
/* Make s keep the states a forward of 2..max_T tokens passes through (max_T <=
 * TOAST_GDN_KEEP_MAX; model.h's toast_state.keep_T), for speculative steps; 0 frees them. */
enum toast_status toast_model_state_keep(const struct toast_model *m, struct toast_state *s, int max_T,
					 struct toast_error *err);
/* After a forward of T tokens at pos (2 <= T <= s->keep_T), make s what it would be had only the
 * first n (1 <= n <= T) of them been run: the GDN layers' states from those kept; the attention
 * layers' KV rows past pos + n are never read before they are written again. Queued. */
enum toast_status toast_model_state_rewind(const struct toast_model *m, struct toast_state *s, int pos, int T, int n,
					   struct toast_error *err);

/*
 * State images: what a state holds after n tokens, copied out so that it can be kept (the
 * session cache), moved between device and host memory, and written to a file; and copied back
 * into a state (the same one or another of the same model), whose buffers stay where they are.
 * Two parts, each one flat buffer:
 *   kv  [kv_bytes(n)]: for each attention layer in order, the K then the V cache's bytes of
 *       tokens [0, n) (toast_kv_bytes: act rows, or Q8 units, the last one whole);
 *   rec [rec_bytes]:   for each GDN layer in order, the conv state (f32, both slots: the current
 *       one is n & 1, so an image is loaded back at the n it was saved at) then the recurrent
 *       state (f32).
 * kv or rec may be NULL (that part is not copied); img_host says whether the image buffers are
 * host memory (else backend memory). Tokens >= n of a loaded state are left as they were (but
 * those sharing a Q8 unit with token n - 1, which are never read before they are written).
 */
size_t toast_model_kv_bytes(const struct toast_model *m, int n);
size_t toast_model_rec_bytes(const struct toast_model *m);
enum toast_status toast_model_state_save(const struct toast_model *m, const struct toast_state *s, int n, void *kv,
					 void *rec, bool img_host, struct toast_error *err);
/* Load rows [0, n) of a kv image laid out with kv_rows >= n rows per layer (a snapshot taken at
 * kv_rows can be loaded at an earlier point whose rows it shares). */
enum toast_status toast_model_state_load(const struct toast_model *m, struct toast_state *s, int n, const void *kv,
					 int kv_rows, const void *rec, bool img_host, struct toast_error *err);
/* A 64-bit fingerprint of what a state image depends on: the shapes, the backend's act type and
 * the weights (their norm vectors' bytes, which any two trained checkpoints differ in, and every
 * matrix's storage and compute types, which differ between quantisations of one checkpoint). */
uint64_t toast_model_fingerprint(const struct toast_model *m);

enum toast_status toast_model_work_new(const struct toast_model *m, int max_T, struct toast_work *w,
				       struct toast_error *err);
void toast_model_work_free(const struct toast_model *m, struct toast_work *w);

/*
 * Run T <= w->max_T tokens at positions pos.. through the model, updating s. Leaves the last
 * token's logits in w->logits (backend memory), and all T rows in w->logits_all when all_logits
 * (or a hook). ids NULL: one token, the backend's last queued pick (toast_backend_ops.pick; the
 * caller checks that the backend has them).
 * hook may be NULL.
 */
enum toast_status toast_model_forward(const struct toast_model *m, struct toast_state *s, struct toast_work *w,
				      const int32_t *ids, int T, int pos, bool all_logits, toast_layer_hook hook,
				      void *hook_ud, struct toast_error *err);

#endif
