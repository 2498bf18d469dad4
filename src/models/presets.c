/*
 * presets.c - config.json texts of real model shapes, for synthetic benchmarks
 * (`toasted bench --synthetic NAME`). Values from docs/qwen3next-spec.md §1 and §9.
 */
#include <string.h>

#include "models/model.h"

static const struct {
	const char *name;
	const char *config;
} presets[] = {
	{"qwen3-next-80b-a3b",
	 "{\"model_type\": \"qwen3_next\", \"vocab_size\": 151936, \"hidden_size\": 2048,"
	 " \"num_hidden_layers\": 48, \"full_attention_interval\": 4, \"num_attention_heads\": 16,"
	 " \"num_key_value_heads\": 2, \"head_dim\": 256, \"partial_rotary_factor\": 0.25,"
	 " \"rope_theta\": 10000000, \"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-6,"
	 " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128,"
	 " \"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4, \"num_experts\": 512,"
	 " \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512,"
	 " \"shared_expert_intermediate_size\": 512, \"norm_topk_prob\": true, \"intermediate_size\": 5120,"
	 " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"}"},
	{"qwen3.5-35b-a3b",
	 "{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 248320, \"hidden_size\": 2048,"
	 " \"num_hidden_layers\": 40, \"full_attention_interval\": 4, \"num_attention_heads\": 16,"
	 " \"num_key_value_heads\": 2, \"head_dim\": 256, \"partial_rotary_factor\": 0.25,"
	 " \"rope_theta\": 10000000, \"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-6,"
	 " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128,"
	 " \"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4, \"num_experts\": 256,"
	 " \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 512,"
	 " \"shared_expert_intermediate_size\": 512, \"tie_word_embeddings\": false, \"dtype\": \"bfloat16\"}"},
};

const char *toast_model_preset(const char *name)
{
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (strcmp(presets[i].name, name) == 0)
			return presets[i].config;
	return NULL;
}
