/*
 * tok_gguf.h - tokenizers and GGUF: the pre-tokenizer names of tokenizer.ggml.pre, and the
 * tokenizer stored in a GGUF's metadata.
 */
#ifndef TOAST_TOKENIZER_TOK_GGUF_H
#define TOAST_TOKENIZER_TOK_GGUF_H

#include <jansson.h>
#include <stddef.h>

#include "format/gguf.h"
#include "toasted.h"

/* A tokenizer.ggml.pre name and the tokenizer.json pipeline it stands for (JSON text). */
struct toast_tok_pre {
	const char *name;
	const char *pre_json;  /* a tokenizer.json "pre_tokenizer" */
	const char *norm_json; /* a tokenizer.json "normalizer", or NULL for none */
};

/* The entry for a tokenizer.ggml.pre name (len bytes), or NULL. */
const struct toast_tok_pre *toast_tok_pre_by_name(const char *name, size_t len);
/* The entry whose pipeline does what tokenizer.json's pre_tokenizer and normalizer do, or NULL. */
const struct toast_tok_pre *toast_tok_pre_match(const json_t *pre_tokenizer, const json_t *normalizer);

/* The tokenizer of a GGUF file (tokenizer.ggml.*, tokenizer.chat_template): the same pipeline as
 * the tokenizer.json it was converted from. TOAST_ERR_UNSUPPORTED for tokenizer models other
 * than byte-level BPE ("gpt2") or an unknown pre-tokenizer name. */
enum toast_status toast_tok_from_gguf(const struct toast_gguf *g, struct toast_tokenizer **out,
				      struct toast_error *err);

#endif
