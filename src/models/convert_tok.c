/*
 * convert_tok.c - the tokenizer of a Hugging Face directory as GGUF metadata, as llama.cpp's
 * converter writes it for byte-level BPE ("gpt2" model): tokens (GPT-2 byte-mapped strings,
 * [PADn] for unused ids up to the model's vocabulary size), token types (1 normal, 3 control for
 * special added tokens, 4 user-defined for other added tokens, 5 unused), merges ("a b"), the
 * pre-tokenizer name (tokenizer/tok_gguf_pre.c), special token ids and the chat template.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/convert.h"
#include "tokenizer/tok_gguf.h"
#include "util/fs.h"

#define CT_MAX_JSON (512u << 20)
#define CT_MAX_TEMPLATE (1u << 20)

enum { CT_NORMAL = 1, CT_CONTROL = 3, CT_USER = 4, CT_UNUSED = 5 };

static json_t *ct_load(const char *dir, const char *name, struct toast_error *err, enum toast_status *rc)
{
	char p[4096], *text = NULL;
	*rc = TOAST_OK;
	if (!toast_path_join(p, sizeof(p), dir, name) || !toast_file_exists(p))
		return NULL;
	if ((*rc = toast_read_file(p, CT_MAX_JSON, &text, NULL, err)) != TOAST_OK)
		return NULL;
	json_error_t je;
	json_t *j = json_loads(text, 0, &je);
	free(text);
	if (!j)
		*rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: not JSON: %s (line %d)", p, je.text, je.line);
	return j;
}

/* a special token named in tokenizer_config.json (string or {"content": ...}) -> its id */
static int ct_special(json_t *cfg, const char *key, char **tokens, int n)
{
	json_t *v = json_object_get(cfg, key);
	const char *s = json_is_object(v) ? json_string_value(json_object_get(v, "content")) : json_string_value(v);
	for (int i = 0; s && i < n; i++)
		if (tokens[i] && strcmp(tokens[i], s) == 0)
			return i;
	return -1;
}

enum toast_status toast_convert_tokenizer(struct toast_gguf_writer *w, const char *dir, const struct toast_hparams *hp,
					  struct toast_error *err)
{
	enum toast_status rc;
	json_t *tj = ct_load(dir, "tokenizer.json", err, &rc);
	if (!tj)
		return rc;
	json_t *cfg = ct_load(dir, "tokenizer_config.json", err, &rc);
	json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges"), *added = json_object_get(tj, "added_tokens");
	int n = hp->n_vocab;
	char **tokens = calloc((size_t)n, sizeof(char *)), *tmpl = NULL;
	size_t *lens = calloc((size_t)n, sizeof(size_t)), n_merges = json_array_size(merges);
	int32_t *types = calloc((size_t)n, sizeof(int32_t));
	char **mstr = calloc(n_merges + 1, sizeof(char *));
	size_t *mlen = calloc(n_merges + 1, sizeof(size_t));
	const struct toast_tok_pre *pre = NULL;
	if (rc != TOAST_OK)
		goto done;
	if (!tokens || !lens || !types || !mstr || !mlen) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto done;
	}
	const char *mt = json_string_value(json_object_get(model, "type"));
	if (!mt || strcmp(mt, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(merges) ||
	    json_is_true(json_object_get(model, "byte_fallback"))) {
		rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s/tokenizer.json: only byte-level BPE tokenizers convert", dir);
		goto done;
	}
	pre = toast_tok_pre_match(json_object_get(tj, "pre_tokenizer"), json_object_get(tj, "normalizer"));
	if (!pre) {
		rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				   "%s/tokenizer.json: its pre-tokenizer has no llama.cpp name (qwen2, qwen35, llama-bpe, smollm, gpt2)", dir);
		goto done;
	}
	const char *k;
	json_t *v;
	json_object_foreach(vocab, k, v)
	{
		json_int_t id = json_integer_value(v);
		if (json_is_integer(v) && id >= 0 && id < n && !tokens[id]) {
			tokens[id] = (char *)k;
			types[id] = CT_NORMAL;
		}
	}
	size_t i;
	json_array_foreach(added, i, v)
	{
		json_int_t id = json_integer_value(json_object_get(v, "id"));
		const char *s = json_string_value(json_object_get(v, "content"));
		if (s && id >= 0 && id < n) {
			tokens[id] = (char *)s;
			types[id] = json_is_true(json_object_get(v, "special")) ? CT_CONTROL : CT_USER;
		}
	}
	char (*pads)[24] = calloc((size_t)n, 24);
	if (!pads) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto done;
	}
	for (int id = 0; id < n; id++) {
		if (!tokens[id]) {
			snprintf(pads[id], 24, "[PAD%d]", id);
			tokens[id] = pads[id];
			types[id] = CT_UNUSED;
		}
		lens[id] = strlen(tokens[id]);
	}
	json_array_foreach(merges, i, v)
	{
		if (json_is_string(v)) {
			mstr[i] = strdup(json_string_value(v));
		} else if (json_is_array(v) && json_array_size(v) == 2) {
			const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
			size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
			if ((mstr[i] = malloc(la + lb + 2)))
				snprintf(mstr[i], la + lb + 2, "%s %s", a ? a : "", b ? b : "");
		}
		if (!mstr[i]) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s/tokenizer.json: merge %zu is malformed", dir, i);
			break;
		}
		mlen[i] = strlen(mstr[i]);
	}
	if (rc == TOAST_OK) {
		toast_gguf_put_str(w, "tokenizer.ggml.model", "gpt2", 4);
		toast_gguf_put_str(w, "tokenizer.ggml.pre", pre->name, strlen(pre->name));
		toast_gguf_put_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)tokens, lens, (size_t)n);
		toast_gguf_put_i32_arr(w, "tokenizer.ggml.token_type", types, (size_t)n);
		toast_gguf_put_str_arr(w, "tokenizer.ggml.merges", (const char *const *)mstr, mlen, n_merges);
		int eos = ct_special(cfg, "eos_token", tokens, n), bos = ct_special(cfg, "bos_token", tokens, n);
		int pad = ct_special(cfg, "pad_token", tokens, n);
		if (eos < 0 && hp->n_eos > 0)
			eos = hp->eos[0];
		if (bos < 0)
			bos = hp->bos;
		if (eos >= 0)
			toast_gguf_put_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
		if (bos >= 0)
			toast_gguf_put_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
		if (pad >= 0)
			toast_gguf_put_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
		toast_gguf_put_bool(w, "tokenizer.ggml.add_bos_token", json_is_true(json_object_get(cfg, "add_bos_token")));
		/* the chat template: tokenizer_config.json's, or chat_template.jinja beside it */
		const char *t = json_string_value(json_object_get(cfg, "chat_template"));
		char p[4096];
		if (!t && toast_path_join(p, sizeof(p), dir, "chat_template.jinja") && toast_file_exists(p) &&
		    toast_read_file(p, CT_MAX_TEMPLATE, &tmpl, NULL, err) == TOAST_OK)
			t = tmpl;
		if (t)
			toast_gguf_put_str(w, "tokenizer.chat_template", t, strlen(t));
	}
	free(pads);
done:
	for (size_t m = 0; mstr && m < n_merges; m++)
		free(mstr[m]);
	free(mstr);
	free(mlen);
	free(tokens);
	free(lens);
	free(types);
	free(tmpl);
	json_decref(cfg);
	json_decref(tj);
	return rc;
}
