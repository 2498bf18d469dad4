/*
 * tok_load.c - toast_tok_load: read a model directory's tokenizer.json (+ tokenizer_config.json,
 * generation_config.json, config.json, chat_template.jinja) into an immutable struct
 * toast_tokenizer.
 *
 * Supported: model BPE with byte-level pre-tokenization (a ByteLevel pre-tokenizer or decoder);
 * normalizer null, NFC, NFD, NFKC, NFKD or a Sequence of them; pre_tokenizer Split (regex or
 * literal, any behaviour, invert), ByteLevel (add_prefix_space, use_regex), Digits, Sequence.
 * Anything else is refused with TOAST_ERR_UNSUPPORTED naming the field: a tokenizer that loads
 * encodes exactly as upstream.
 * Invariant: every size read from the files is bounded (vocabulary, piece length, file size).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/mem.h"

#define TOK_MAX_FILE ((size_t)512 << 20)
#define TOK_MAX_PIECE 4096

/* ---- added-token trie ---- */

enum toast_status tok_trie_add(struct tok_trie *t, const char *s, size_t n, int32_t added)
{
	if (!t->nodes) {
		for (int i = 0; i < 256; i++)
			t->root[i] = -1;
	}
	if (n == 0)
		return TOAST_OK;
	int32_t node = -1;
	for (size_t i = 0; i < n; i++) {
		unsigned char b = (unsigned char)s[i];
		int32_t *link = node < 0 ? &t->root[b] : &t->nodes[node].child;
		int32_t ch = *link;
		if (node >= 0)
			while (ch >= 0 && t->nodes[ch].byte != b)
				ch = t->nodes[ch].sibling;
		if (ch < 0) {
			if (t->n_nodes == t->cap) {
				int cap = t->cap ? t->cap * 2 : 256;
				struct tok_trie_node *nn = realloc(t->nodes, (size_t)cap * sizeof(*nn));
				if (!nn)
					return TOAST_ERR_NOMEM;
				t->nodes = nn;
				t->cap = cap;
				link = node < 0 ? &t->root[b] : &t->nodes[node].child; /* the array moved */
			}
			ch = t->n_nodes++;
			t->nodes[ch] = (struct tok_trie_node){-1, node < 0 ? -1 : *link, -1, b};
			*link = ch;
		}
		node = ch;
	}
	if (t->nodes[node].added < 0)
		t->nodes[node].added = added;
	return TOAST_OK;
}

void tok_trie_free(struct tok_trie *t)
{
	free(t->nodes);
	memset(t, 0, sizeof(*t));
}

/* ---- helpers ---- */

static int16_t load_cp_byte[324]; /* byte-level code point -> byte, -1: not in the alphabet */

static void load_init_alphabet(void)
{
	for (int i = 0; i < 324; i++)
		load_cp_byte[i] = -1;
	for (int b = 0; b < 256; b++)
		load_cp_byte[tok_byte_to_cp((unsigned char)b)] = (int16_t)b;
}

/* The bytes a token string stands for, as upstream's ByteLevel decoder gives them: every
 * character through the byte-level alphabet, or, if one is not in it, the string's own bytes.
 * Returns the length; *mapped tells which. out has room for n bytes. */
static size_t load_token_bytes(const char *s, size_t n, char *out, bool *mapped)
{
	size_t o = 0, i = 0;
	*mapped = true;
	while (i < n) {
		int l;
		uint32_t cp = toast_utf8_next(s + i, n - i, &l);
		if (cp >= 324 || load_cp_byte[cp] < 0) {
			*mapped = false;
			memcpy(out, s, n);
			return n;
		}
		out[o++] = (char)load_cp_byte[cp];
		i += (size_t)l;
	}
	return o;
}

static json_t *load_json(const char *dir, const char *name, bool required, struct toast_error *err,
			 enum toast_status *rc)
{
	char path[4096];
	*rc = TOAST_OK;
	if (!toast_path_join(path, sizeof(path), dir, name)) {
		*rc = toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
		return NULL;
	}
	if (!required && !toast_file_exists(path))
		return NULL;
	char *text = NULL;
	size_t len = 0;
	*rc = toast_read_file(path, TOK_MAX_FILE, &text, &len, err);
	if (*rc != TOAST_OK)
		return NULL;
	json_error_t je;
	json_t *j = json_loadb(text, len, 0, &je);
	free(text);
	if (!j)
		*rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
	return j;
}

/* A special-token entry of tokenizer_config.json: a string or {"content": ...}; NULL if unset. */
static char *load_special(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	if (json_is_object(v))
		v = json_object_get(v, "content");
	return json_is_string(v) ? toast_strdup(json_string_value(v)) : NULL;
}

static void load_mark_eog(struct toast_tokenizer *tok, json_t *v)
{
	if (json_is_integer(v)) {
		json_int_t id = json_integer_value(v);
		if (id >= 0 && id < tok->n_vocab)
			tok->eog[id] = 1;
	} else if (json_is_array(v)) {
		size_t i;
		json_t *x;
		json_array_foreach(v, i, x) load_mark_eog(tok, x);
	}
}

/* ---- pipeline configuration ---- */

static enum toast_status load_normalizer(struct toast_tokenizer *tok, json_t *n, struct toast_error *err)
{
	if (!n || json_is_null(n))
		return TOAST_OK;
	const char *type = json_string_value(json_object_get(n, "type"));
	if (!type)
		return toast_err_set(err, TOAST_ERR_FORMAT, "normalizer without a type");
	if (strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(n, "normalizers"), *x;
		size_t i;
		json_array_foreach(list, i, x)
		{
			enum toast_status rc = load_normalizer(tok, x, err);
			if (rc != TOAST_OK)
				return rc;
		}
		return TOAST_OK;
	}
	static const char *names[] = {"NFC", "NFD", "NFKC", "NFKD"};
	for (int k = 0; k < 4; k++) {
		if (strcmp(type, names[k]) == 0) {
			if (tok->n_norm == TOK_MAX_PRETOK)
				return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "more than %d normalizers", TOK_MAX_PRETOK);
			tok->norm[tok->n_norm++] = (enum tok_norm)k;
			return TOAST_OK;
		}
	}
	return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "normalizer type \"%s\" (supported: NFC, NFD, NFKC, NFKD, Sequence)",
			     type);
}

static enum toast_status load_pretok(struct toast_tokenizer *tok, json_t *p, bool *bytelevel, struct toast_error *err)
{
	if (!p || json_is_null(p))
		return TOAST_OK;
	const char *type = json_string_value(json_object_get(p, "type"));
	if (!type)
		return toast_err_set(err, TOAST_ERR_FORMAT, "pre_tokenizer without a type");
	if (strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(p, "pretokenizers"), *x;
		size_t i;
		json_array_foreach(list, i, x)
		{
			enum toast_status rc = load_pretok(tok, x, bytelevel, err);
			if (rc != TOAST_OK)
				return rc;
		}
		return TOAST_OK;
	}
	if (tok->n_pretok == TOK_MAX_PRETOK)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "more than %d pre-tokenizers", TOK_MAX_PRETOK);
	struct tok_pretok *pt = &tok->pretok[tok->n_pretok];
	memset(pt, 0, sizeof(*pt));
	pt->behavior = TOK_SPLIT_ISOLATED;
	if (strcmp(type, "ByteLevel") == 0) {
		pt->kind = TOK_PRETOK_BYTELEVEL;
		pt->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
		json_t *ur = json_object_get(p, "use_regex");
		if (!ur || json_is_true(ur)) {
			enum toast_status rc = tok_regex_compile(tok_gpt2_pattern, &pt->re, err);
			if (rc != TOAST_OK)
				return rc;
		}
		*bytelevel = true;
	} else if (strcmp(type, "Digits") == 0) {
		pt->kind = TOK_PRETOK_DIGITS;
		pt->individual_digits = json_is_true(json_object_get(p, "individual_digits"));
		pt->behavior = pt->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
	} else if (strcmp(type, "Split") == 0) {
		pt->kind = TOK_PRETOK_SPLIT;
		json_t *pat = json_object_get(p, "pattern");
		const char *re = json_string_value(json_object_get(pat, "Regex"));
		json_t *lit = json_object_get(pat, "String");
		const char *beh = json_string_value(json_object_get(p, "behavior"));
		static const char *bnames[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
		int b = -1;
		for (int k = 0; beh && k < 5; k++)
			if (strcmp(beh, bnames[k]) == 0)
				b = k;
		if (b < 0)
			return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "Split pre-tokenizer behavior \"%s\"", beh ? beh : "(none)");
		pt->behavior = (enum tok_split_behavior)b;
		pt->invert = json_is_true(json_object_get(p, "invert"));
		if (re) {
			enum toast_status rc = tok_regex_compile(re, &pt->re, err);
			if (rc != TOAST_OK)
				return rc;
		} else if (json_is_string(lit)) {
			pt->literal_len = json_string_length(lit);
			pt->literal = malloc(pt->literal_len + 1);
			if (!pt->literal)
				return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			memcpy(pt->literal, json_string_value(lit), pt->literal_len + 1);
		} else {
			return toast_err_set(err, TOAST_ERR_FORMAT, "Split pre-tokenizer without a Regex or String pattern");
		}
	} else {
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				     "pre_tokenizer type \"%s\" (supported: Split, ByteLevel, Digits, Sequence)", type);
	}
	tok->n_pretok++;
	return TOAST_OK;
}

static bool load_decoder_bytelevel(json_t *d)
{
	const char *type = json_string_value(json_object_get(d, "type"));
	if (!type)
		return false;
	if (strcmp(type, "ByteLevel") == 0)
		return true;
	if (strcmp(type, "Sequence") == 0) {
		json_t *x;
		size_t i;
		json_array_foreach(json_object_get(d, "decoders"), i, x) if (load_decoder_bytelevel(x)) return true;
	}
	return false;
}

/* ---- vocabulary ---- */

struct load_blob {
	char *p;
	size_t n, cap;
};

static bool blob_put(struct load_blob *b, const char *s, size_t n, uint32_t *off)
{
	if (b->n + n > b->cap) {
		size_t cap = (b->n + n) * 2 + 4096;
		char *p = realloc(b->p, cap);
		if (!p)
			return false;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	*off = (uint32_t)b->n;
	b->n += n;
	return b->n < UINT32_MAX;
}

static enum toast_status load_model(struct toast_tokenizer *tok, json_t *root, const char *path,
				    struct toast_error *err)
{
	json_t *model = json_object_get(root, "model");
	json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
	json_t *added = json_object_get(root, "added_tokens");
	const char *type = json_string_value(json_object_get(model, "type"));
	if ((type && strcmp(type, "BPE") != 0) || !json_is_object(vocab) || !json_is_array(merges))
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: model type \"%s\": only BPE is supported", path,
				     type ? type : "?");
	const char *pre = json_string_value(json_object_get(model, "continuing_subword_prefix"));
	const char *suf = json_string_value(json_object_get(model, "end_of_word_suffix"));
	json_t *dropout = json_object_get(model, "dropout");
	if ((pre && *pre) || (suf && *suf) || json_is_true(json_object_get(model, "byte_fallback")) ||
	    (json_is_number(dropout) && json_number_value(dropout) > 0))
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				     "%s: BPE with a subword prefix/suffix, byte fallback or dropout", path);
	tok->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

	/* ids and n_vocab */
	json_int_t max_id = -1;
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v)
	{
		json_int_t id = json_integer_value(v);
		if (!json_is_integer(v) || id < 0 || id >= TOK_MAX_VOCAB)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: vocab \"%s\": id outside [0, %d)", path, key, TOK_MAX_VOCAB);
		if (id > max_id)
			max_id = id;
	}
	size_t i;
	json_array_foreach(added, i, v)
	{
		json_int_t id = json_integer_value(json_object_get(v, "id"));
		if (!json_is_string(json_object_get(v, "content")) || id < 0 || id >= TOK_MAX_VOCAB)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: added_tokens[%zu]: bad id or content", path, i);
		if (id > max_id)
			max_id = id;
	}
	tok->n_vocab = (int)(max_id + 1);
	tok->piece_off = calloc((size_t)tok->n_vocab + 1, sizeof(uint32_t));
	tok->piece_len = malloc(((size_t)tok->n_vocab + 1) * sizeof(uint32_t));
	tok->eog = calloc((size_t)tok->n_vocab + 1, 1);
	if (!tok->piece_off || !tok->piece_len || !tok->eog)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	memset(tok->piece_len, 0xff, ((size_t)tok->n_vocab + 1) * sizeof(uint32_t));

	/* pieces: vocabulary first, then added tokens (whose text wins for decoding) */
	struct load_blob b = {0};
	char buf[TOK_MAX_PIECE];
	uint8_t *bpe_ok = calloc((size_t)tok->n_vocab + 1, 1);
	if (!bpe_ok)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = TOAST_OK;
	json_object_foreach(vocab, key, v)
	{
		size_t n = strlen(key);
		json_int_t id = json_integer_value(v);
		bool mapped;
		if (n == 0 || n > TOK_MAX_PIECE) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: vocab entry %lld of %zu bytes", path, (long long)id, n);
			break;
		}
		size_t bn = load_token_bytes(key, n, buf, &mapped);
		if (!blob_put(&b, buf, bn, &tok->piece_off[id])) {
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			break;
		}
		tok->piece_len[id] = (uint32_t)bn;
		bpe_ok[id] = mapped;
	}
	tok->n_added = (int)json_array_size(added);
	tok->added = calloc((size_t)tok->n_added + 1, sizeof(*tok->added));
	if (rc == TOAST_OK && !tok->added)
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	json_array_foreach(added, i, v)
	{
		if (rc != TOAST_OK)
			break;
		json_t *c = json_object_get(v, "content");
		size_t n = json_string_length(c);
		int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
		bool mapped;
		if (n == 0 || n > TOK_MAX_PIECE) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: added token %d of %zu bytes", path, id, n);
			break;
		}
		size_t bn = load_token_bytes(json_string_value(c), n, buf, &mapped);
		uint32_t off;
		if (!blob_put(&b, buf, bn, &tok->piece_off[id]) || !blob_put(&b, json_string_value(c), n, &off)) {
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			break;
		}
		tok->piece_len[id] = (uint32_t)bn;
		bpe_ok[id] = 0;
		tok->added[i] = (struct tok_added){
			.content = (const char *)(uintptr_t)off, /* an offset until the blob is final */
			.len = (uint32_t)n,
			.id = id,
			.special = json_is_true(json_object_get(v, "special")),
			.lstrip = json_is_true(json_object_get(v, "lstrip")),
			.rstrip = json_is_true(json_object_get(v, "rstrip")),
			.single_word = json_is_true(json_object_get(v, "single_word")),
			.normalized = json_is_true(json_object_get(v, "normalized")),
		};
	}
	tok->blob = b.p;
	if (rc == TOAST_OK && (toast_strmap_init(&tok->bpe_ids, (size_t)tok->n_vocab) != 0 ||
			       toast_strmap_init(&tok->added_ids, (size_t)tok->n_added + 1) != 0))
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	for (int id = 0; rc == TOAST_OK && id < tok->n_vocab; id++) {
		if (tok->piece_len[id] != UINT32_MAX && tok->piece_len[id] > tok->max_piece)
			tok->max_piece = tok->piece_len[id];
		if (bpe_ok[id] && toast_strmap_put(&tok->bpe_ids, tok->blob + tok->piece_off[id], tok->piece_len[id], id) != 0)
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	free(bpe_ok);
	for (int k = 0; rc == TOAST_OK && k < tok->n_added; k++) {
		tok->added[k].content = tok->blob + (uintptr_t)tok->added[k].content;
		if (toast_strmap_put(&tok->added_ids, tok->added[k].content, tok->added[k].len, k) != 0)
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	for (int c = 0; rc == TOAST_OK && c < 256; c++) {
		char s[4];
		int l = 0;
		uint32_t cp = tok_byte_to_cp((unsigned char)c);
		if (cp < 0x80)
			s[l++] = (char)cp;
		else {
			s[l++] = (char)(0xC0 | cp >> 6);
			s[l++] = (char)(0x80 | (cp & 0x3F));
		}
		s[l] = 0;
		json_t *idv = json_object_get(vocab, s);
		/* some vocabularies (SmolLM2's) lack tokens for control bytes: those bytes are dropped */
		if (!json_is_integer(idv) && c > 0x20 && c < 0x7f)
			rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: not a byte-level vocabulary (byte 0x%02x has no token)",
					   path, c);
		else
			tok->byte_id[c] = json_is_integer(idv) ? (int32_t)json_integer_value(idv) : -1;
	}
	if (rc != TOAST_OK)
		return rc;

	/* merges */
	rc = tok_merges_init(tok, json_array_size(merges), err);
	json_array_foreach(merges, i, v)
	{
		if (rc != TOAST_OK)
			break;
		char l[TOK_MAX_PIECE + 1], r[TOK_MAX_PIECE + 1], lr[2 * TOK_MAX_PIECE + 1];
		const char *a = NULL, *bb = NULL;
		size_t an = 0, bn = 0;
		if (json_is_string(v)) {
			const char *s = json_string_value(v), *sp = strchr(s, ' ');
			if (sp && !strchr(sp + 1, ' ')) {
				a = s;
				an = (size_t)(sp - s);
				bb = sp + 1;
				bn = strlen(bb);
			}
		} else if (json_is_array(v) && json_array_size(v) == 2) {
			a = json_string_value(json_array_get(v, 0));
			bb = json_string_value(json_array_get(v, 1));
			an = a ? strlen(a) : 0;
			bn = bb ? strlen(bb) : 0;
		}
		if (!a || !bb || an == 0 || bn == 0 || an > TOK_MAX_PIECE || bn > TOK_MAX_PIECE) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: merges[%zu] is not a pair of tokens", path, i);
			break;
		}
		memcpy(l, a, an);
		l[an] = 0;
		memcpy(r, bb, bn);
		r[bn] = 0;
		memcpy(lr, a, an);
		memcpy(lr + an, bb, bn);
		lr[an + bn] = 0;
		json_t *li = json_object_get(vocab, l), *ri = json_object_get(vocab, r), *mi = json_object_get(vocab, lr);
		if (!li || !ri || !mi) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: merges[%zu] \"%s %s\": token not in the vocabulary", path, i,
					   l, r);
			break;
		}
		tok_merges_put(tok, (int32_t)json_integer_value(li), (int32_t)json_integer_value(ri), (uint32_t)i,
			       (int32_t)json_integer_value(mi));
	}
	return rc;
}

static enum toast_status load_added_tries(struct toast_tokenizer *tok, struct toast_error *err)
{
	tok_trie_add(&tok->trie_raw, NULL, 0, -1);
	tok_trie_add(&tok->trie_norm, NULL, 0, -1);
	for (int k = 0; k < tok->n_added; k++) {
		struct tok_added *a = &tok->added[k];
		enum toast_status rc;
		if (a->normalized) {
			/* matched in normalised text: normalise the token's content the same way */
			char *nc;
			size_t nn;
			rc = tok_normalize(tok, a->content, a->len, &nc, &nn, err);
			if (rc != TOAST_OK)
				return rc;
			rc = tok_trie_add(&tok->trie_norm, nc, nn, k);
			if (nc != a->content)
				free(nc);
			tok->has_norm_added = true;
		} else {
			rc = tok_trie_add(&tok->trie_raw, a->content, a->len, k);
		}
		if (rc != TOAST_OK)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	return TOAST_OK;
}

/* special tokens, chat template (jinja overrides cfg's), end-of-generation ids (eos_ids: an id
 * or a list of ids, extra to the tokenizer's own) */
static enum toast_status load_config_apply(struct toast_tokenizer *tok, json_t *cfg, const char *jinja,
					   json_t *eos_ids, struct toast_error *err)
{
	enum toast_status rc = TOAST_OK;
	tok->bos_token = load_special(cfg, "bos_token");
	tok->eos_token = load_special(cfg, "eos_token");
	tok->pad_token = load_special(cfg, "pad_token");
	tok->unk_token = load_special(cfg, "unk_token");
	json_t *ct = json_object_get(cfg, "chat_template");
	if (json_is_array(ct)) { /* named templates: the "default" one, else the first */
		json_t *x, *pick = json_array_get(ct, 0);
		size_t i;
		json_array_foreach(ct, i, x) if (json_is_string(json_object_get(x, "name")) &&
						 strcmp(json_string_value(json_object_get(x, "name")), "default") == 0) pick = x;
		ct = json_object_get(pick, "template");
	}
	if (jinja || json_is_string(ct)) {
		tok->chat_template = toast_strdup(jinja ? jinja : json_string_value(ct));
		if (!tok->chat_template)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	if (tok->chat_template) { /* a template we cannot run fails at render time, not here */
		struct toast_error perr = {0};
		if (jinja_parse(tok->chat_template, &tok->chat_tmpl, &perr) != TOAST_OK &&
		    !(tok->chat_tmpl_error = toast_strdup(perr.msg)))
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	/* end of generation: what the model's files say, plus the usual end-of-turn tokens */
	load_mark_eog(tok, eos_ids);
	static const char *eot[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
				    "<end_of_turn>", "<|end|>"};
	for (size_t k = 0; k < sizeof(eot) / sizeof(eot[0]); k++) {
		int a = toast_strmap_get(&tok->added_ids, eot[k], strlen(eot[k]));
		if (a >= 0)
			tok->eog[tok->added[a].id] = 1;
	}
	if (tok->eos_token) {
		int32_t id = toast_tok_lookup(tok, tok->eos_token);
		if (id >= 0)
			tok->eog[id] = 1;
	}
	return rc;
}

static enum toast_status load_config(struct toast_tokenizer *tok, const char *dir, struct toast_error *err)
{
	enum toast_status rc;
	json_t *cfg = load_json(dir, "tokenizer_config.json", false, err, &rc);
	char *jinja = NULL, path[4096];
	json_t *eos = json_array(), *gen = NULL, *mc = NULL;
	if (rc == TOAST_OK && toast_path_join(path, sizeof(path), dir, "chat_template.jinja") && toast_file_exists(path))
		rc = toast_read_file(path, 1 << 20, &jinja, NULL, err);
	if (rc == TOAST_OK)
		gen = load_json(dir, "generation_config.json", false, err, &rc);
	if (rc == TOAST_OK)
		mc = load_json(dir, "config.json", false, err, &rc);
	if (rc == TOAST_OK && !eos)
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (rc == TOAST_OK) {
		json_array_append(eos, json_object_get(gen, "eos_token_id"));
		json_array_append(eos, json_object_get(mc, "eos_token_id"));
		json_array_append(eos, json_object_get(json_object_get(mc, "text_config"), "eos_token_id"));
		rc = load_config_apply(tok, cfg, jinja, eos, err);
	}
	free(jinja);
	json_decref(eos);
	json_decref(gen);
	json_decref(mc);
	json_decref(cfg);
	return rc;
}

enum toast_status tok_build(json_t *root, json_t *cfg, const char *jinja, json_t *eos_ids, const char *what,
			    struct toast_tokenizer **out, struct toast_error *err)
{
	*out = NULL;
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, load_init_alphabet);
	struct toast_tokenizer *tok = calloc(1, sizeof(*tok));
	if (!tok)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	bool bytelevel = false;
	enum toast_status rc = load_normalizer(tok, json_object_get(root, "normalizer"), err);
	if (rc == TOAST_OK)
		rc = load_pretok(tok, json_object_get(root, "pre_tokenizer"), &bytelevel, err);
	if (rc == TOAST_OK && !bytelevel && !load_decoder_bytelevel(json_object_get(root, "decoder")))
		rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: not a byte-level BPE tokenizer (no ByteLevel step)", what);
	if (rc == TOAST_OK)
		rc = load_model(tok, root, what, err);
	if (rc == TOAST_OK)
		rc = load_added_tries(tok, err);
	if (rc == TOAST_OK && (cfg || jinja || eos_ids))
		rc = load_config_apply(tok, cfg, jinja, eos_ids, err);
	if (rc != TOAST_OK) {
		toast_tok_free(tok);
		return rc;
	}
	*out = tok;
	return TOAST_OK;
}

enum toast_status toast_tok_load(const char *model_dir, struct toast_tokenizer **out, struct toast_error *err)
{
	*out = NULL;
	enum toast_status rc;
	json_t *root = load_json(model_dir, "tokenizer.json", true, err, &rc);
	char path[4096];
	toast_path_join(path, sizeof(path), model_dir, "tokenizer.json");
	if (rc == TOAST_OK)
		rc = tok_build(root, NULL, NULL, NULL, path, out, err);
	json_decref(root);
	if (rc == TOAST_OK && (rc = load_config(*out, model_dir, err)) != TOAST_OK) {
		toast_tok_free(*out);
		*out = NULL;
	}
	return rc;
}

void toast_tok_free(struct toast_tokenizer *tok)
{
	if (!tok)
		return;
	for (int i = 0; i < tok->n_pretok; i++) {
		pcre2_code_free(tok->pretok[i].re);
		free(tok->pretok[i].literal);
	}
	tok_trie_free(&tok->trie_raw);
	tok_trie_free(&tok->trie_norm);
	toast_strmap_deinit(&tok->bpe_ids);
	toast_strmap_deinit(&tok->added_ids);
	free(tok->merge_key);
	free(tok->merge_rank);
	free(tok->merge_result);
	free(tok->added);
	free(tok->blob);
	free(tok->piece_off);
	free(tok->piece_len);
	free(tok->eog);
	free(tok->chat_template);
	jinja_free(tok->chat_tmpl);
	free(tok->chat_tmpl_error);
	free(tok->bos_token);
	free(tok->eos_token);
	free(tok->pad_token);
	free(tok->unk_token);
	free(tok);
}
