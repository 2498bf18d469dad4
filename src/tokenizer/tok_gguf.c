/*
 * tok_gguf.c - the tokenizer stored in a GGUF's metadata, rebuilt as the tokenizer.json it was
 * converted from: tokens (byte-level strings; type 1 normal -> vocab, 3 control -> special added
 * token, 4 user-defined -> added token, 5 unused -> left out, as Hugging Face has no such ids),
 * merges, the pre-tokenizer and normaliser that tokenizer.ggml.pre names (tok_gguf_pre.c),
 * special token ids and the chat template. The same pipeline as tokenizer.json then encodes it.
 */
#include <stdio.h>
#include <string.h>

#include "tokenizer/tok.h"
#include "tokenizer/tok_gguf.h"

enum { TG_NORMAL = 1, TG_UNKNOWN = 2, TG_CONTROL = 3, TG_USER = 4, TG_UNUSED = 5, TG_BYTE = 6 };

static json_t *tg_str(const char *s, size_t n)
{
	return json_stringn_nocheck(s, n);
}

/* the content of token id (tokens walked once into offsets) */
static json_t *tg_token(const struct toast_gguf_kv *tokens, const size_t *off, int64_t id)
{
	if (id < 0 || (uint64_t)id >= tokens->n)
		return NULL;
	size_t pos = off[id], n;
	const char *s;
	toast_gguf_next_str(tokens, &pos, &s, &n);
	return tg_str(s, n);
}

enum toast_status toast_tok_from_gguf(const struct toast_gguf *g, struct toast_tokenizer **out,
				      struct toast_error *err)
{
	*out = NULL;
	const struct toast_gguf_kv *tokens = toast_gguf_find(g, "tokenizer.ggml.tokens");
	const struct toast_gguf_kv *types = toast_gguf_find(g, "tokenizer.ggml.token_type");
	const struct toast_gguf_kv *merges = toast_gguf_find(g, "tokenizer.ggml.merges");
	const char *model, *pre_name, *tmpl;
	size_t model_n, pre_n, tmpl_n;
	enum toast_status rc = toast_gguf_get_str(g, "tokenizer.ggml.model", true, &model, &model_n, err);
	if (rc == TOAST_OK)
		rc = toast_gguf_get_str(g, "tokenizer.ggml.pre", false, &pre_name, &pre_n, err);
	if (rc == TOAST_OK)
		rc = toast_gguf_get_str(g, "tokenizer.chat_template", false, &tmpl, &tmpl_n, err);
	if (rc != TOAST_OK)
		return rc;
	if (model_n != 4 || memcmp(model, "gpt2", 4) != 0)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: tokenizer model \"%.*s\": only byte-level BPE (gpt2)",
				     g->path, (int)(model_n < 32 ? model_n : 32), model);
	if (!tokens || tokens->type != TOAST_GGUF_ARRAY || tokens->arr_type != TOAST_GGUF_STRING || tokens->n == 0 ||
	    tokens->n > TOK_MAX_VOCAB || !merges || merges->type != TOAST_GGUF_ARRAY ||
	    merges->arr_type != TOAST_GGUF_STRING ||
	    (types && (types->type != TOAST_GGUF_ARRAY || types->n != tokens->n ||
		       (types->arr_type != TOAST_GGUF_I32 && types->arr_type != TOAST_GGUF_U32))))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tokenizer.ggml.tokens/token_type/merges missing or malformed",
				     g->path);
	const struct toast_tok_pre *pre = pre_name ? toast_tok_pre_by_name(pre_name, pre_n) : NULL;
	if (!pre)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				     "%s: pre-tokenizer \"%.*s\" is not supported (qwen2, qwen35, llama-bpe, smollm, gpt2)", g->path,
				     (int)(pre_n < 32 ? pre_n : 32), pre_name ? pre_name : "(none)");
	size_t *off = malloc(tokens->n * sizeof(size_t));
	json_t *root = json_object(), *mdl = json_object(), *vocab = json_object(), *jm = json_array();
	json_t *added = json_array(), *cfg = json_object(), *eos = json_array();
	json_t *pj = json_loads(pre->pre_json, 0, NULL), *nj = pre->norm_json ? json_loads(pre->norm_json, 0, NULL) : json_null();
	bool ok = off && root && mdl && vocab && jm && added && cfg && eos && pj && nj;
	size_t pos = 0;
	for (uint64_t i = 0; ok && i < tokens->n; i++) {
		const char *s;
		size_t n;
		off[i] = pos;
		toast_gguf_next_str(tokens, &pos, &s, &n);
		int64_t t = types ? toast_gguf_arr_int(types, i) : TG_NORMAL;
		if (t == TG_CONTROL || t == TG_USER) {
			json_t *a = json_object();
			ok = a && !json_object_set_new(a, "id", json_integer((json_int_t)i)) &&
			     !json_object_set_new(a, "content", tg_str(s, n)) &&
			     !json_object_set_new(a, "special", json_boolean(t == TG_CONTROL)) &&
			     !json_object_set_new(a, "normalized", json_false()) && !json_array_append_new(added, a);
		} else if (t != TG_UNUSED) {
			char key[1024];
			if (n >= sizeof(key) || memchr(s, 0, n)) {
				ok = false;
				break;
			}
			memcpy(key, s, n);
			key[n] = 0;
			ok = !json_object_set_new(vocab, key, json_integer((json_int_t)i));
		}
	}
	pos = 0;
	for (uint64_t i = 0; ok && i < merges->n; i++) {
		const char *s;
		size_t n;
		toast_gguf_next_str(merges, &pos, &s, &n);
		ok = !json_array_append_new(jm, tg_str(s, n));
	}
	if (!ok) {
		rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: tokenizer metadata is malformed (or out of memory)", g->path);
		goto done;
	}
	json_object_set_new(mdl, "type", json_string("BPE"));
	json_object_set(mdl, "vocab", vocab);
	json_object_set(mdl, "merges", jm);
	json_object_set(root, "model", mdl);
	json_object_set(root, "added_tokens", added);
	json_object_set(root, "pre_tokenizer", pj);
	json_object_set(root, "normalizer", nj);
	json_object_set_new(root, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
	static const char *const specials[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
						  {"tokenizer.ggml.eos_token_id", "eos_token"},
						  {"tokenizer.ggml.padding_token_id", "pad_token"},
						  {"tokenizer.ggml.unknown_token_id", "unk_token"},
						  {"tokenizer.ggml.eot_token_id", NULL},
						  {"tokenizer.ggml.eom_token_id", NULL}};
	for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]) && rc == TOAST_OK; k++) {
		int64_t id = -1;
		rc = toast_gguf_get_int(g, specials[k][0], false, -1, -1, (int64_t)tokens->n - 1, &id, err);
		if (rc == TOAST_OK && id >= 0 && specials[k][1])
			json_object_set_new(cfg, specials[k][1], tg_token(tokens, off, id));
		if (rc == TOAST_OK && id >= 0 && k != 0 && k != 2 && k != 3) /* eos, eot, eom end generation */
			json_array_append_new(eos, json_integer(id));
	}
	if (rc == TOAST_OK && tmpl)
		json_object_set_new(cfg, "chat_template", tg_str(tmpl, tmpl_n));
	if (rc == TOAST_OK)
		rc = tok_build(root, cfg, NULL, eos, g->path, out, err);
done:
	free(off);
	json_decref(root);
	json_decref(mdl);
	json_decref(vocab);
	json_decref(jm);
	json_decref(added);
	json_decref(cfg);
	json_decref(eos);
	json_decref(pj);
	json_decref(nj);
	return rc;
}
