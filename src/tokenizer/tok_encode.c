/*
 * tok_encode.c - toast_tok_encode: text in, ids out.
 *
 * Order of operations (Hugging Face `tokenizers`, encode without special-token post-processing):
 * input bytes are made valid UTF-8 (each maximal invalid subsequence -> U+FFFD, exactly what
 * String::from_utf8_lossy or Python's bytes.decode("utf-8", "replace") gives upstream, whose API
 * only accepts valid strings); added tokens are found in the raw text, leftmost-longest; every
 * stretch between them is normalised (then searched for normalised added tokens), pre-tokenized
 * and BPE-encoded. A per-call word -> ids cache skips BPE for repeated pieces.
 * Invariant: the tokenizer is only read; all state is in struct tok_enc, freed before returning.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok.h"
#include "util/err.h"

#define TOK_CACHE_SIZE 8192    /* entries, a power of two */
#define TOK_CACHE_MAX_WORD 64  /* longer pieces are not cached */

static uint64_t enc_hash(const char *p, size_t n)
{
	uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	uint64_t w = 0;
	memcpy(&w, p + i, n - i);
	h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 29);
}

enum toast_status tok_enc_word(struct tok_enc *c, const char *p, size_t n, struct toast_error *err)
{
	if (n > TOK_CACHE_MAX_WORD || n == 1)
		return tok_bpe_piece(c->tok, &c->bpe, p, n, &c->ids, err);
	uint64_t h = enc_hash(p, n);
	struct tok_cache_entry *e = &c->cache[h & (TOK_CACHE_SIZE - 1)];
	if (e->key_len == n && e->hash == h && memcmp(c->cache_keys + e->key_off, p, n) == 0) {
		for (uint32_t k = 0; k < e->ids_len; k++)
			if (!tok_ids_push(&c->ids, c->cache_ids.v[e->ids_off + k]))
				return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		return TOAST_OK;
	}
	size_t first = c->ids.n;
	enum toast_status rc = tok_bpe_piece(c->tok, &c->bpe, p, n, &c->ids, err);
	if (rc != TOAST_OK)
		return rc;
	/* remember it (the pools only grow within one call; a failure to grow just skips caching) */
	if (c->cache_keys_n + n > c->cache_keys_cap) {
		size_t cap = (c->cache_keys_cap + n) * 2;
		char *k = realloc(c->cache_keys, cap);
		if (!k)
			return TOAST_OK;
		c->cache_keys = k;
		c->cache_keys_cap = cap;
	}
	if (c->cache_keys_n + n > UINT32_MAX || c->cache_ids.n + (c->ids.n - first) > UINT32_MAX)
		return TOAST_OK;
	size_t ids_off = c->cache_ids.n;
	for (size_t k = first; k < c->ids.n; k++)
		if (!tok_ids_push(&c->cache_ids, c->ids.v[k])) {
			c->cache_ids.n = ids_off;
			return TOAST_OK;
		}
	memcpy(c->cache_keys + c->cache_keys_n, p, n);
	*e = (struct tok_cache_entry){h, (uint32_t)c->cache_keys_n, (uint32_t)n, (uint32_t)ids_off,
				      (uint32_t)(c->ids.n - first)};
	c->cache_keys_n += n;
	return TOAST_OK;
}

/* Rust regex's \w, for single_word added tokens */
static bool enc_is_word(uint32_t cp)
{
	if (cp == '_' || cp == 0x200C || cp == 0x200D)
		return true;
	utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
	return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
	       k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

static uint32_t enc_last_cp(const char *p, size_t n)
{
	size_t i = n - 1;
	while (i > 0 && ((unsigned char)p[i] & 0xC0) == 0x80)
		i--;
	int l;
	return toast_utf8_next(p + i, n - i, &l);
}

/* Longest added token of trie t starting at p[0]; its index into tok->added, or -1. */
static int enc_trie_longest(const struct tok_trie *t, const unsigned char *p, size_t n, size_t *len)
{
	int best = -1;
	int32_t node = t->root[p[0]];
	size_t i = 1;
	while (node >= 0) {
		if (t->nodes[node].added >= 0) {
			best = t->nodes[node].added;
			*len = i;
		}
		if (i >= n)
			break;
		int32_t ch = t->nodes[node].child;
		while (ch >= 0 && t->nodes[ch].byte != p[i])
			ch = t->nodes[ch].sibling;
		node = ch;
		i++;
	}
	return best;
}

typedef enum toast_status (*enc_gap_fn)(struct tok_enc *c, const char *p, size_t n, struct toast_error *err);

/* Split [p, p+n) on the added tokens of trie t as upstream's AddedVocabulary does; gaps go to fn. */
static enum toast_status enc_split_added(struct tok_enc *c, const struct tok_trie *t, const char *p, size_t n,
					 enc_gap_fn fn, struct toast_error *err)
{
	const struct toast_tokenizer *tok = c->tok;
	const unsigned char *u = (const unsigned char *)p;
	size_t start_offset = 0, pos = 0;
	enum toast_status rc = TOAST_OK;
	while (pos < n && rc == TOAST_OK) {
		if (t->root[u[pos]] < 0) {
			pos++;
			continue;
		}
		size_t len = 0;
		int a = enc_trie_longest(t, u + pos, n - pos, &len);
		if (a < 0) {
			pos++;
			continue;
		}
		const struct tok_added *ad = &tok->added[a];
		size_t start = pos, stop = pos + len;
		pos = stop;
		if (ad->single_word) {
			bool before = start > 0 && enc_is_word(enc_last_cp(p, start));
			int l;
			bool after = stop < n && enc_is_word(toast_utf8_next(p + stop, n - stop, &l));
			if (before || after)
				continue;
		}
		if (ad->lstrip) {
			while (start > start_offset) {
				size_t k = start - 1;
				while (k > 0 && (u[k] & 0xC0) == 0x80)
					k--;
				int l;
				if (!tok_is_space(toast_utf8_next(p + k, n - k, &l)))
					break;
				start = k;
			}
		}
		if (ad->rstrip) {
			while (stop < n) {
				int l;
				if (!tok_is_space(toast_utf8_next(p + stop, n - stop, &l)))
					break;
				stop += (size_t)l;
			}
			pos = stop;
		}
		if (start > start_offset)
			rc = fn(c, p + start_offset, start - start_offset, err);
		if (rc == TOAST_OK && !tok_ids_push(&c->ids, ad->id))
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		start_offset = stop;
	}
	if (rc == TOAST_OK && start_offset < n)
		rc = fn(c, p + start_offset, n - start_offset, err);
	return rc;
}

static enum toast_status enc_pretok(struct tok_enc *c, const char *p, size_t n, struct toast_error *err)
{
	return tok_pretok_run(c, 0, p, n, err);
}

/* A stretch between raw added tokens: normalise, split on normalised added tokens, pre-tokenize. */
static enum toast_status enc_segment(struct tok_enc *c, const char *p, size_t n, struct toast_error *err)
{
	char *norm;
	size_t nn;
	enum toast_status rc = tok_normalize(c->tok, p, n, &norm, &nn, err);
	if (rc != TOAST_OK)
		return rc;
	if (c->tok->has_norm_added)
		rc = enc_split_added(c, &c->tok->trie_norm, norm, nn, enc_pretok, err);
	else
		rc = tok_pretok_run(c, 0, norm, nn, err);
	if (norm != p)
		free(norm);
	return rc;
}

static void enc_free(struct tok_enc *c)
{
	free(c->ids.v);
	tok_bpe_free(&c->bpe);
	pcre2_match_data_free(c->md);
	pcre2_match_context_free(c->mctx);
	pcre2_jit_stack_free(c->jit_stack);
	free(c->cache);
	free(c->cache_keys);
	free(c->cache_ids.v);
	for (int i = 0; i < TOK_MAX_PRETOK; i++) {
		free(c->spans[i]);
		free(c->prefix_buf[i]);
	}
}

enum toast_status toast_tok_encode(const struct toast_tokenizer *tok, const char *text, size_t n, int32_t **ids,
				   int *n_ids, struct toast_error *err)
{
	*ids = NULL;
	*n_ids = 0;
	if (n > TOK_MAX_INPUT)
		return toast_err_set(err, TOAST_ERR_INVALID, "text of %zu bytes is over the %zu-byte limit", n, TOK_MAX_INPUT);
	if (n && !text)
		return toast_err_set(err, TOAST_ERR_INVALID, "no text");
	struct tok_enc c = {.tok = tok};
	char *clean = NULL;
	enum toast_status rc = TOAST_OK;
	c.cache = calloc(TOK_CACHE_SIZE, sizeof(*c.cache));
	c.md = pcre2_match_data_create(4, NULL);
	c.mctx = pcre2_match_context_create(NULL);
	c.jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
	if (!c.cache || !c.md || !c.mctx || !c.jit_stack) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto out;
	}
	pcre2_jit_stack_assign(c.mctx, NULL, c.jit_stack);
	/* bounded work per match, whatever the pattern a tokenizer file brings */
	pcre2_set_match_limit(c.mctx, 50 * 1000 * 1000);
	if (!toast_utf8_valid(text, n)) {
		size_t cn;
		clean = toast_utf8_sanitize(text, n, &cn);
		if (!clean) {
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			goto out;
		}
		text = clean;
		n = cn;
	}
	rc = enc_split_added(&c, &tok->trie_raw, text, n, enc_segment, err);
	if (rc == TOAST_OK && c.ids.n > INT_MAX)
		rc = toast_err_set(err, TOAST_ERR_INVALID, "text makes more than %d tokens", INT_MAX);
	if (rc == TOAST_OK) {
		*ids = c.ids.v ? c.ids.v : malloc(sizeof(int32_t));
		*n_ids = (int)c.ids.n;
		c.ids.v = NULL;
		if (!*ids)
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
out:
	free(clean);
	enc_free(&c);
	return rc;
}
