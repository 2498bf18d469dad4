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

struct toast_model {
	struct toast_hparams hp;
	struct toast_weight tok_embd, output_norm, output;
	struct toast_layer *layers;
	struct toast_tensordir td; /* tensors under Hugging Face names */
	struct toast_gguf gguf;    /* the open GGUF file when loaded from one (td points into it) */
	bool is_gguf;
	struct toast_backend *be;
	size_t weight_bytes, decode_bytes;
	bool quantized; /* some matrix is of a quantised type */
};

/* The bound (data != NULL) per-layer weights of l, experts excepted; returns their count. */
#define TOAST_LAYER_MAX_WEIGHTS 25
int toast_layer_weights(struct toast_layer *l, struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS]);

/* Per-session state: KV caches of attention layers, conv and recurrent states of GDN layers. */
struct toast_state {
	int n_ctx;
	void **k_cache, **v_cache; /* [n_layer] act [n_ctx][n_head_kv*head_dim], NULL for GDN layers */
	void **conv;               /* [n_layer] act [conv_k-1][conv_dim], NULL for attention layers */
	float **ssm;               /* [n_layer] f32 [n_v_head][d_v][d_k], NULL for attention layers */
	size_t kv_bytes_per_tok, fixed_bytes;
};

/* Activation buffers for forward passes of up to max_T tokens. */
struct toast_work {
	int max_T;
	float *x;      /* f32 [max_T][n_embd] */
	void *h;       /* act [max_T][n_embd] */
	void *q, *k, *v, *o;  /* attention */
	void *qkv, *z, *b, *a, *g_out; /* gdn */
	void *ff_g, *ff_u;    /* dense MLP */
	float *logits;        /* f32 [max_T][n_vocab] */
};

/* Called with host f32 copies of the residual stream: index 0 after the embedding, il after
 * decoder layer il-1 for il < n_layer, and n_layer after the final norm. */
typedef void (*toast_layer_hook)(void *ud, int index, const float *x, int T, int n_embd);

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

/*
 * Load a model: a directory (config.json + safetensors) or a GGUF file. quant: TOAST_MIX_NONE to
 * use the weights as stored, else quantise the float matrices at load time (toast_model_quantize).
 */
enum toast_status toast_model_load(struct toast_model *m, const char *path, struct toast_backend *be,
				   enum toast_quant_mix quant, struct toast_error *err);
void toast_model_unload(struct toast_model *m);
/* Parse config.json text into hp (exposed for tests). */
enum toast_status toast_hparams_parse(struct toast_hparams *hp, const char *json_text, struct toast_error *err);
void toast_hparams_free(struct toast_hparams *hp);

enum toast_status toast_model_state_new(const struct toast_model *m, int n_ctx, struct toast_state *s,
					struct toast_error *err);
void toast_model_state_free(const struct toast_model *m, struct toast_state *s);
void toast_model_state_zero(const struct toast_model *m, struct toast_state *s);

enum toast_status toast_model_work_new(const struct toast_model *m, int max_T, struct toast_work *w,
				       struct toast_error *err);
void toast_model_work_free(const struct toast_model *m, struct toast_work *w);

/*
 * Run T <= w->max_T tokens at positions pos.. through the model, updating s. Leaves logits in
 * w->logits (backend memory): all T rows when all_logits, else only the last token's row 0.
 * hook may be NULL.
 */
enum toast_status toast_model_forward(const struct toast_model *m, struct toast_state *s, struct toast_work *w,
				      const int32_t *ids, int T, int pos, bool all_logits, toast_layer_hook hook,
				      void *hook_ud, struct toast_error *err);

#endif
