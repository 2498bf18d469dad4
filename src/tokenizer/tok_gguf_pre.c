/*
 * tok_gguf_pre.c - the pre-tokenizers llama.cpp names in tokenizer.ggml.pre, as the
 * tokenizer.json pre_tokenizer (and normalizer) each name stands for. One table serves both
 * directions: `toasted convert` names a tokenizer.json's pipeline, and a GGUF's tokenizer is
 * rebuilt from the name (tok_gguf.c).
 */
#include "tokenizer/tok_gguf.h"

#include <stdio.h>
#include <string.h>

static const struct toast_tok_pre tok_pres[] = {
	{"qwen2",
	 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}",
	 "{\"type\":\"NFC\"}"},
	{"qwen35", /* Qwen3.5: qwen2 with combining marks kept in words */
	 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}",
	 "{\"type\":\"NFC\"}"},
	{"llama-bpe",
	 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}",
	 NULL},
	{"smollm",
	 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}]}",
	 NULL},
	{"gpt2",
	 "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}",
	 NULL},
};

const struct toast_tok_pre *toast_tok_pre_by_name(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(tok_pres) / sizeof(tok_pres[0]); i++)
		if (strlen(tok_pres[i].name) == len && memcmp(tok_pres[i].name, name, len) == 0)
			return &tok_pres[i];
	return NULL;
}

/* Canonical text of a pipeline step, over the fields that change what it does. */
static void pre_canon(const json_t *v, char *out, size_t cap)
{
	const char *type = json_string_value(json_object_get(v, "type"));
	size_t n = 0;
	out[0] = 0;
	if (!type)
		return;
	if (strcmp(type, "Sequence") == 0) {
		const json_t *list = json_object_get(v, "pretokenizers");
		if (!list)
			list = json_object_get(v, "normalizers");
		size_t i;
		const json_t *e;
		json_array_foreach(list, i, e)
		{
			if (n + 1 >= cap)
				return;
			pre_canon(e, out + n, cap - n);
			n += strlen(out + n);
			if (n + 1 < cap)
				out[n++] = '|', out[n] = 0;
		}
		return;
	}
	const json_t *pat = json_object_get(v, "pattern");
	const char *rx = json_string_value(json_object_get(pat, "Regex"));
	snprintf(out, cap, "%s:%s:%s:%d:%d:%d:%d", type, rx ? rx : "",
		 json_string_value(json_object_get(v, "behavior")) ? json_string_value(json_object_get(v, "behavior")) : "",
		 json_is_true(json_object_get(v, "invert")), json_is_true(json_object_get(v, "add_prefix_space")),
		 json_object_get(v, "use_regex") ? json_is_true(json_object_get(v, "use_regex")) : 1,
		 json_is_true(json_object_get(v, "individual_digits")));
}

const struct toast_tok_pre *toast_tok_pre_match(const json_t *pre_tokenizer, const json_t *normalizer)
{
	char want[2048], have[2048], nw[256], nh[256];
	pre_canon(pre_tokenizer, have, sizeof(have));
	pre_canon(json_is_object(normalizer) ? normalizer : NULL, nh, sizeof(nh));
	for (size_t i = 0; i < sizeof(tok_pres) / sizeof(tok_pres[0]); i++) {
		json_t *p = json_loads(tok_pres[i].pre_json, 0, NULL);
		json_t *no = tok_pres[i].norm_json ? json_loads(tok_pres[i].norm_json, 0, NULL) : NULL;
		pre_canon(p, want, sizeof(want));
		pre_canon(no, nw, sizeof(nw));
		json_decref(p);
		json_decref(no);
		if (strcmp(want, have) == 0 && strcmp(nw, nh) == 0)
			return &tok_pres[i];
	}
	return NULL;
}
