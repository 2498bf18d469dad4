/*
 * tok.h - tokenizer internals shared by the files of src/tokenizer/ (not part of the public API).
 *
 * The tokenizer is a Hugging Face `tokenizers` byte-level BPE pipeline, reproduced step by step:
 *   input bytes -> invalid UTF-8 replaced by U+FFFD (as String::from_utf8_lossy does)
 *   -> added tokens split out (leftmost-longest, on the raw text: tok_encode.c)
 *   -> normaliser on the rest (NFC/NFD/NFKC/NFKD, Sequence of them: tok_pretok.c)
 *   -> pre-tokenizer steps (Split regex, ByteLevel, Digits: tok_pretok.c)
 *   -> BPE with merge ranks on each piece, on raw bytes (tok_bpe.c).
 * Everything is kept in raw bytes: the GPT-2 byte<->unicode mapping is applied once, when the
 * vocabulary is loaded (tok_load.c), so no step ever sees the mapped characters.
 *
 * Invariant: a loaded tokenizer is immutable; encoding keeps all scratch state in a per-call
 * context, so one tokenizer may be used from several threads at once.
 */
#ifndef TOAST_TOKENIZER_TOK_H
#define TOAST_TOKENIZER_TOK_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "toasted.h"
#include "util/strmap.h"
#include "util/utf8.h"

#define TOK_MAX_VOCAB (1 << 22)      /* ids beyond this are refused */
#define TOK_MAX_INPUT ((size_t)1 << 30) /* bytes one encode call accepts */
#define TOK_MAX_PRETOK 8             /* pre-tokenizer / normaliser steps */

/* One token added on top of the BPE vocabulary (`added_tokens` of tokenizer.json). */
struct tok_added {
	const char *content; /* borrowed from the tokenizer's blob */
	uint32_t len;
	int32_t id;
	bool special, lstrip, rstrip, single_word, normalized;
};

/* A byte trie over added-token contents, for leftmost-longest matching. */
struct tok_trie {
	struct tok_trie_node {
		int32_t child, sibling; /* node indices, -1: none */
		int32_t added;          /* index into tok->added ending here, -1: none */
		unsigned char byte;
	} *nodes;
	int n_nodes, cap;
	int32_t root[256]; /* first-level nodes by byte, -1: none */
};

enum tok_norm { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD };

enum tok_split_behavior {
	TOK_SPLIT_REMOVED,
	TOK_SPLIT_ISOLATED,
	TOK_SPLIT_MERGED_PREV,
	TOK_SPLIT_MERGED_NEXT,
	TOK_SPLIT_CONTIGUOUS,
};

enum tok_pretok_kind { TOK_PRETOK_SPLIT, TOK_PRETOK_BYTELEVEL, TOK_PRETOK_DIGITS };

struct tok_pretok {
	enum tok_pretok_kind kind;
	enum tok_split_behavior behavior;
	bool invert;
	pcre2_code *re;          /* Split with a regex, or ByteLevel with use_regex */
	char *literal;           /* Split with a {"String": ...} pattern */
	size_t literal_len;
	bool add_prefix_space;   /* ByteLevel */
	bool individual_digits;  /* Digits */
};

struct toast_tokenizer {
	int n_vocab;                 /* max id + 1 over the vocabulary and the added tokens */
	char *blob;                  /* every piece's bytes, back to back */
	uint32_t *piece_off;         /* [n_vocab] */
	uint32_t *piece_len;         /* [n_vocab]; UINT32_MAX: no token has this id */
	struct toast_strmap bpe_ids; /* raw bytes -> id, for the BPE vocabulary (keys in blob) */
	struct toast_strmap added_ids; /* added-token content -> index into added */
	int32_t byte_id[256];        /* the id of each single byte; -1: none (the byte is dropped) */
	bool ignore_merges;

	/* merges: open addressing on (left << 32 | right) */
	uint64_t *merge_key;
	uint32_t *merge_rank;
	int32_t *merge_result;
	size_t merge_cap; /* a power of two; key UINT64_MAX: empty */

	struct tok_added *added;
	int n_added;
	char *added_blob;
	struct tok_trie trie_raw;  /* added tokens with normalized = false */
	struct tok_trie trie_norm; /* added tokens with normalized = true (matched after normalising) */
	bool has_norm_added;

	enum tok_norm norm[TOK_MAX_PRETOK];
	int n_norm;
	struct tok_pretok pretok[TOK_MAX_PRETOK];
	int n_pretok;

	uint8_t *eog; /* [n_vocab] nonzero: ends generation */
	char *chat_template;                 /* NULL: none (ChatML fallback) */
	struct jinja_template *chat_tmpl;    /* chat_template parsed, or NULL */
	char *chat_tmpl_error;               /* why it did not parse, or NULL */
	char *bos_token, *eos_token, *pad_token, *unk_token; /* NULL when unset */
	size_t max_piece;                    /* longest piece in bytes */
};

/* ---- tok_bpe.c ---- */
/* The GPT-2 byte-level alphabet: the code point that stands for byte b. */
uint32_t tok_byte_to_cp(unsigned char b);
/* Build the merge table from pairs of ids (rank = index). */
enum toast_status tok_merges_init(struct toast_tokenizer *tok, size_t n_merges, struct toast_error *err);
/* Add merge (left, right) -> result with rank; a later duplicate replaces an earlier one. */
void tok_merges_put(struct toast_tokenizer *tok, int32_t left, int32_t right, uint32_t rank, int32_t result);
bool tok_merges_get(const struct toast_tokenizer *tok, int32_t left, int32_t right, uint32_t *rank, int32_t *result);

/* Scratch for BPE on one piece; grows as needed (zero-initialise, free with tok_bpe_free). */
struct tok_bpe_scratch {
	struct tok_bpe_sym { int32_t id, prev, next; uint32_t len; } *sym;
	struct tok_bpe_merge { uint32_t rank, pos; int32_t result; } *heap;
	size_t sym_cap, heap_cap;
};
void tok_bpe_free(struct tok_bpe_scratch *s);
/* BPE-encode one pre-tokenized piece (n >= 1 bytes), appending ids to *out (a growable vector). */
struct tok_ids {
	int32_t *v;
	size_t n, cap;
};
bool tok_ids_push(struct tok_ids *ids, int32_t id);
enum toast_status tok_bpe_piece(const struct toast_tokenizer *tok, struct tok_bpe_scratch *s, const char *p, size_t n,
				struct tok_ids *out, struct toast_error *err);

/* ---- tok_pretok.c ---- */
/* Compile a tokenizer.json regex for PCRE2 (UTF, UCP; Oniguruma's \s translated). */
enum toast_status tok_regex_compile(const char *pattern, pcre2_code **out, struct toast_error *err);
/* The regex of a ByteLevel pre-tokenizer with use_regex (GPT-2's). */
extern const char tok_gpt2_pattern[];
/* Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s). */
bool tok_is_space(uint32_t cp);
/* Apply the normaliser steps to valid UTF-8; *out is p itself when nothing changed, else malloc'd. */
enum toast_status tok_normalize(const struct toast_tokenizer *tok, const char *p, size_t n, char **out, size_t *out_n,
				struct toast_error *err);

/* Per-call encoding context (tok_encode.c owns it; tok_pretok.c runs the pre-tokenizer with it). */
struct tok_cache_entry {
	uint64_t hash;
	uint32_t key_off, key_len, ids_off, ids_len;
};
struct tok_enc {
	const struct toast_tokenizer *tok;
	struct tok_ids ids;
	struct tok_bpe_scratch bpe;
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jit_stack;
	struct tok_cache_entry *cache; /* direct-mapped word -> ids cache, TOK_CACHE_SIZE entries */
	char *cache_keys;
	size_t cache_keys_n, cache_keys_cap;
	struct tok_ids cache_ids;
	struct tok_span { size_t start, end; bool match; } *spans[TOK_MAX_PRETOK];
	size_t spans_cap[TOK_MAX_PRETOK];
	char *prefix_buf[TOK_MAX_PRETOK]; /* ByteLevel add_prefix_space copies */
	size_t prefix_cap[TOK_MAX_PRETOK];
};
/* Run pre-tokenizer steps from `step` on piece [p, p+n), BPE-encoding every final piece. */
enum toast_status tok_pretok_run(struct tok_enc *c, int step, const char *p, size_t n, struct toast_error *err);
/* BPE through the per-call cache (tok_encode.c). */
enum toast_status tok_enc_word(struct tok_enc *c, const char *p, size_t n, struct toast_error *err);

/* ---- tok_load.c ---- */
/* A tokenizer from a tokenizer.json document (root), with tokenizer_config.json's (cfg, may be
 * NULL), a chat template overriding cfg's (jinja, may be NULL) and extra end-of-generation ids
 * (eos_ids: an id or a list, may be NULL); `what` names the source in messages. */
enum toast_status tok_build(json_t *root, json_t *cfg, const char *jinja, json_t *eos_ids, const char *what,
			    struct toast_tokenizer **out, struct toast_error *err);
enum toast_status tok_trie_add(struct tok_trie *t, const char *s, size_t n, int32_t added);
void tok_trie_free(struct tok_trie *t);

#endif
