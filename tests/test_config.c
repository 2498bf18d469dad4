/*
 * test_config.c - config.json -> hyper-parameters: the reference's defaults for keys a config
 * leaves out (transformers 5.17's config classes; a different default computes another model),
 * both config styles, the layer patterns (attention interval, sparse step, mlp_only_layers),
 * and Qwen3.5's multimodal wrapper.
 */
#include <math.h>
#include <string.h>

#include "models/model.h"
#include "test.h"

static bool parse(struct toast_hparams *hp, const char *json)
{
	struct toast_error err = {0};
	enum toast_status st = toast_hparams_parse(hp, json, &err);
	CHECK(st == TOAST_OK, "%s: %s", json, err.msg);
	return st == TOAST_OK;
}

#define HYBRID_KEYS                                                                                              \
	"\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, "           \
	"\"linear_value_head_dim\": 8"

static void test_defaults(void)
{
	static const struct {
		const char *json;
		int head_dim, n_head_kv, n_rot;
	} cases[] = {
		/* qwen3: head_dim 128, kv heads 32 */
		{"{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		 "\"num_attention_heads\": 32, \"intermediate_size\": 8}",
		 128, 32, 128},
		/* qwen3_moe: head_dim hidden/heads, kv heads 4 */
		{"{\"model_type\": \"qwen3_moe\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		 "\"num_attention_heads\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8}",
		 8, 4, 8},
		/* hybrids: head_dim 256, a quarter of it rotated */
		{"{\"model_type\": \"qwen3_next\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
		 "\"num_attention_heads\": 4, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, "
		 HYBRID_KEYS "}",
		 256, 2, 64},
		{"{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
		 "\"num_attention_heads\": 4, \"intermediate_size\": 8, " HYBRID_KEYS "}",
		 256, 4, 64},
		{"{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
		 "\"num_attention_heads\": 4, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, "
		 HYBRID_KEYS "}",
		 256, 2, 64},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct toast_hparams hp;
		if (!parse(&hp, cases[i].json))
			continue;
		CHECK(hp.head_dim == cases[i].head_dim && hp.n_head_kv == cases[i].n_head_kv && hp.n_rot == cases[i].n_rot,
		      "%s: head_dim %d, kv heads %d, rotary dims %d (want %d, %d, %d)", hp.arch_name, hp.head_dim,
		      hp.n_head_kv, hp.n_rot, cases[i].head_dim, cases[i].n_head_kv, cases[i].n_rot);
		CHECK(hp.n_ctx_train == 32768 && hp.rope_theta == 10000.0f && fabsf(hp.norm_eps - 1e-6f) < 1e-12f &&
			      !hp.tie_embd && hp.rope_freq_type == TOAST_DT_F32,
		      "%s: context %d, theta %g, eps %g, tied %d", hp.arch_name, hp.n_ctx_train, hp.rope_theta, hp.norm_eps,
		      hp.tie_embd);
		bool hybrid = hp.arch != TOAST_ARCH_QWEN3 && hp.arch != TOAST_ARCH_QWEN3_MOE;
		CHECK(hp.norm_plus_one == hybrid && hp.attn_gated == hybrid, "%s: norm/gate variant", hp.arch_name);
		if (hybrid) /* attention every 4th layer, conv kernel 4 */
			CHECK(!hp.layer_is_attn[0] && !hp.layer_is_attn[2] && hp.layer_is_attn[3] && hp.ssm_conv_k == 4,
			      "%s: layer pattern", hp.arch_name);
		bool norm_topk = hp.arch == TOAST_ARCH_QWEN3_NEXT || hp.arch == TOAST_ARCH_QWEN35_MOE;
		CHECK(hp.norm_topk == norm_topk, "%s: norm_topk_prob %d", hp.arch_name, hp.norm_topk);
		toast_hparams_free(&hp);
	}
}

/* transformers-5 style and released-checkpoint style describe the same model */
static void test_styles(void)
{
	struct toast_hparams a, b;
	const char *v5 = "{\"model_type\": \"qwen3_next\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
			 "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 20, \"num_experts\": 4, "
			 "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, " HYBRID_KEYS ", \"dtype\": \"bfloat16\", "
			 "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
			 "\"partial_rotary_factor\": 0.5}, \"layer_types\": [\"linear_attention\", \"linear_attention\", "
			 "\"full_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"]}";
	const char *hub = "{\"model_type\": \"qwen3_next\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
			  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 20, \"num_experts\": 4, "
			  "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, " HYBRID_KEYS ", "
			  "\"torch_dtype\": \"bfloat16\", \"rope_theta\": 1000000.0, \"partial_rotary_factor\": 0.5, "
			  "\"full_attention_interval\": 3}";
	if (!parse(&a, v5))
		return;
	if (parse(&b, hub)) {
		CHECK(a.n_rot == 10 && b.n_rot == 10 && a.rope_theta == b.rope_theta && a.rope_theta == 1e6f &&
			      a.rope_freq_type == TOAST_DT_BF16 && b.rope_freq_type == TOAST_DT_BF16,
		      "rope: %d/%d dims, theta %g/%g", a.n_rot, b.n_rot, a.rope_theta, b.rope_theta);
		for (int il = 0; il < 6; il++)
			CHECK(a.layer_is_attn[il] == b.layer_is_attn[il] && a.layer_is_attn[il] == (il % 3 == 2),
			      "layer %d: attention %d/%d", il, a.layer_is_attn[il], b.layer_is_attn[il]);
		toast_hparams_free(&b);
	}
	toast_hparams_free(&a);
}

/* which layers are MoE: decoder_sparse_step and mlp_only_layers, as the reference decides */
static void test_moe_layers(void)
{
	struct toast_hparams hp;
	if (parse(&hp, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
		       "\"num_attention_heads\": 4, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
		       "\"moe_intermediate_size\": 8, \"intermediate_size\": 16, \"decoder_sparse_step\": 2, "
		       "\"mlp_only_layers\": [3]}")) {
		static const bool want[6] = {false, true, false, false, false, true};
		for (int il = 0; il < 6; il++)
			CHECK(hp.layer_is_moe[il] == want[il], "layer %d: moe %d", il, hp.layer_is_moe[il]);
		toast_hparams_free(&hp);
	}
	if (parse(&hp, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		       "\"num_attention_heads\": 4, \"num_experts\": 0, \"intermediate_size\": 16}")) {
		CHECK(!hp.layer_is_moe[0] && !hp.layer_is_moe[1] && hp.n_expert == 0, "0 experts: all dense");
		toast_hparams_free(&hp);
	}
	if (parse(&hp, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		       "\"num_attention_heads\": 4, \"num_local_experts\": 6, \"num_experts_per_tok\": 2, "
		       "\"moe_intermediate_size\": 8}")) {
		CHECK(hp.n_expert == 6 && hp.layer_is_moe[0] && hp.layer_is_moe[1], "num_local_experts: %d", hp.n_expert);
		toast_hparams_free(&hp);
	}
}

/* special token ids: only those inside the vocabulary are kept */
static void test_token_ids(void)
{
	struct toast_hparams hp;
	if (parse(&hp, "{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		       "\"num_attention_heads\": 4, \"head_dim\": 16, \"num_key_value_heads\": 4, \"intermediate_size\": 8, "
		       "\"bos_token_id\": 10, \"eos_token_id\": [9, -1, 10, 4294967305, 0, \"3\"]}")) {
		CHECK(hp.bos == -1 && hp.n_eos == 2 && hp.eos[0] == 9 && hp.eos[1] == 0, "bos %d, %d eos", hp.bos, hp.n_eos);
		toast_hparams_free(&hp);
	}
}

/* Qwen3.5's multimodal wrapper: the text decoder's config is text_config */
static void test_wrapper(void)
{
	struct toast_hparams hp;
	if (parse(&hp, "{\"model_type\": \"qwen3_5_moe\", \"vision_config\": {}, \"text_config\": {\"vocab_size\": 10, "
		       "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_experts\": 4, "
		       "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, " HYBRID_KEYS "}}")) {
		CHECK(hp.arch == TOAST_ARCH_QWEN35_MOE && hp.n_embd == 64 && hp.n_rot == 64, "wrapper: %s, %d, %d",
		      hp.arch_name, hp.n_embd, hp.n_rot);
		toast_hparams_free(&hp);
	}
}

int main(void)
{
	test_defaults();
	test_styles();
	test_moe_layers();
	test_token_ids();
	test_wrapper();
	return test_done("test_config");
}
