/*
 * test_tokenizer.c - the tokenizer against upstream and against hand-derived expectations:
 * - every case of tokenizer/qwen3-cases.jsonl (Hugging Face `tokenizers` on the real Qwen3
 *   tokenizer.json) encodes to its ids and decodes to its text;
 * - tokenizer/llama3-style (another vocabulary, another split regex, NFKC, ignore_merges,
 *   lstrip/rstrip/single_word/normalized added tokens) matches its upstream cases.jsonl;
 * - tokenizer/tiny-bpe (a hand-made GPT-2-style BPE) gives the ids worked out by hand, so
 *   merge ranks, the built-in ByteLevel regex and added tokens are each pinned;
 * - invalid UTF-8 becomes U+FFFD exactly as Python's bytes.decode("utf-8", "replace") does;
 * - fuzz: random bytes, lone surrogates, megabyte inputs and long runs of one character neither
 *   crash nor take long, and nothing is dropped (decode(encode(x)) is x made valid);
 * - the streaming detokenizer equals whole-sequence decoding and only emits whole characters;
 * - malformed and unsupported tokenizer files are refused with a message.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tok.h"
#include "toasted.h"
#include "util/timeutil.h"

static struct toast_tokenizer *load(const char *rel)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/%s", test_data_dir(), rel);
	struct toast_error err = {0};
	struct toast_tokenizer *tok = NULL;
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_OK, "loading %s: %s", dir, err.msg);
	return tok;
}

/* Encode text and compare with want[0..n_want); returns whether equal. */
static bool encodes_to(const struct toast_tokenizer *tok, const char *text, size_t n, const int32_t *want, int n_want)
{
	int32_t *ids = NULL;
	int n_ids = 0;
	struct toast_error err = {0};
	if (toast_tok_encode(tok, text, n, &ids, &n_ids, &err) != TOAST_OK) {
		fprintf(stderr, "encode failed: %s\n", err.msg);
		return false;
	}
	bool same = n_ids == n_want && (n_ids == 0 || memcmp(ids, want, (size_t)n_ids * sizeof(int32_t)) == 0);
	free(ids);
	return same;
}

/* Upstream cases: {"text", "ids"[, "decoded"]} per line. */
static void check_cases(const struct toast_tokenizer *tok, const char *rel, int min_cases)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", test_data_dir(), rel);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "%s is missing", path);
	if (!f || !tok) {
		if (f)
			fclose(f);
		return;
	}
	char *line = NULL;
	size_t cap = 0;
	int n = 0, bad = 0;
	while (getline(&line, &cap, f) > 0) {
		json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
		json_t *t = json_object_get(j, "text"), *ids = json_object_get(j, "ids"), *dec = json_object_get(j, "decoded");
		CHECK(json_is_string(t) && json_is_array(ids), "%s: bad line %d", rel, n + 1);
		if (!json_is_string(t) || !json_is_array(ids)) {
			json_decref(j);
			continue;
		}
		int nw = (int)json_array_size(ids);
		int32_t *want = malloc(((size_t)nw + 1) * sizeof(int32_t));
		for (int i = 0; i < nw; i++)
			want[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
		bool ok = encodes_to(tok, json_string_value(t), json_string_length(t), want, nw);
		CHECK(ok, "%s case %d: %s", rel, n, json_string_value(t));
		if (dec) {
			char *text = NULL;
			size_t len = 0;
			struct toast_error err = {0};
			CHECK(toast_tok_decode(tok, want, nw, &text, &len, &err) == TOAST_OK && len == json_string_length(dec) &&
				      memcmp(text, json_string_value(dec), len) == 0,
			      "%s case %d decodes to \"%s\", want \"%s\"", rel, n, text ? text : err.msg, json_string_value(dec));
			free(text);
		}
		bad += !ok;
		n++;
		free(want);
		json_decref(j);
	}
	free(line);
	fclose(f);
	CHECK(n >= min_cases && bad == 0, "%s: %d of %d cases differ (at least %d expected)", rel, bad, n, min_cases);
}

static void test_tiny_bpe(void)
{
	struct toast_tokenizer *tok = load("tokenizer/tiny-bpe");
	if (!tok)
		return;
	static const struct {
		const char *text;
		int32_t ids[12];
		int n;
	} cases[] = {
		{"hello", {262}, 1},                            /* h+e, l+l, he+ll, hell+o */
		{" the", {258}, 1},                             /* Ġ+t, h+e, Ġt+he */
		{"hello world", {262, 272}, 2},                 /* "hello" | " world" */
		{"yell", {121, 260}, 2},                        /* l+l (rank 3) beats e+l (rank 17): y, e+ll */
		{"aaaaa", {267, 97}, 2},                        /* leftmost a+a first: aa aa a -> aaaa a */
		{"it's 123", {105, 116, 264, 32, 265, 51}, 6},  /* "it" "'s" " 123"; 1+2 */
		{"a  b", {97, 32, 32, 98}, 4},                  /* "a" " " " b": \s+(?!\S) */
		{"x<|im_end|>y", {120, 275, 121}, 3},           /* added token inside text */
		{"<|im_start|>user", {276, 117, 115, 101, 114}, 5},
		{"<|im_end", {60, 124, 105, 109, 95, 101, 110, 100}, 8}, /* not a whole added token */
		{"", {0}, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		CHECK(encodes_to(tok, cases[i].text, strlen(cases[i].text), cases[i].ids, cases[i].n), "tiny-bpe: \"%s\"",
		      cases[i].text);
	CHECK(toast_tok_n_vocab(tok) == 277, "n_vocab %d", toast_tok_n_vocab(tok));
	size_t len;
	const char *p = toast_tok_piece(tok, 272, &len);
	CHECK(p && len == 6 && memcmp(p, " world", 6) == 0, "piece 272");
	p = toast_tok_piece(tok, 275, &len);
	CHECK(p && len == 10 && memcmp(p, "<|im_end|>", 10) == 0, "piece of an added token");
	CHECK(!toast_tok_piece(tok, 277, &len) && !toast_tok_piece(tok, -1, &len), "pieces outside the vocabulary");
	CHECK(toast_tok_lookup(tok, " world") == 272 && toast_tok_lookup(tok, "<|im_start|>") == 276 &&
		      toast_tok_lookup(tok, "nope!") == -1,
	      "lookup");
	CHECK(toast_tok_is_eog(tok, 274) && toast_tok_is_eog(tok, 275) && !toast_tok_is_eog(tok, 276) &&
		      !toast_tok_is_eog(tok, 262),
	      "end of generation: eos <|endoftext|> and <|im_end|>, not <|im_start|>");
	int32_t bad[] = {262, 999};
	char *text = NULL;
	struct toast_error err = {0};
	CHECK(toast_tok_decode(tok, bad, 2, &text, &len, &err) == TOAST_ERR_INVALID && strstr(err.msg, "999"),
	      "decoding an unknown id: %s", err.msg);
	toast_tok_free(tok);
}

/* Invalid UTF-8 in: each maximal invalid subsequence -> U+FFFD, as Python's decode("replace"). */
static void test_invalid_utf8(void)
{
	struct toast_tokenizer *tok = load("tokenizer/tiny-bpe");
	if (!tok)
		return;
	static const struct {
		const char *in, *as;
	} cases[] = {
		{"\xff", "\xEF\xBF\xBD"},
		{"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* an encoded lone surrogate */
		{"\xed\xbf\xbf!", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!"},
		{"a\xe4\xb8", "a\xEF\xBF\xBD"},                      /* truncated at the end */
		{"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},            /* overlong */
		{"\xf0\x9f\x98x", "\xEF\xBF\xBDx"},
		{"\xe4\xb8\xe4\xb8\xad", "\xEF\xBF\xBD\xe4\xb8\xad"},
		{"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* above U+10FFFF */
		{"\xe0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
		{"<|im_end|>\x80<|im_end|>", "<|im_end|>\xEF\xBF\xBD<|im_end|>"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int32_t *want = NULL;
		int nw = 0;
		struct toast_error err = {0};
		CHECK(toast_tok_encode(tok, cases[i].as, strlen(cases[i].as), &want, &nw, &err) == TOAST_OK, "%s", err.msg);
		CHECK(encodes_to(tok, cases[i].in, strlen(cases[i].in), want, nw), "invalid UTF-8 case %zu", i);
		free(want);
	}
	/* NUL bytes are text like any other */
	int32_t nul[] = {97, 0, 98};
	CHECK(encodes_to(tok, "a\0b", 3, nul, 3), "NUL inside text");
	toast_tok_free(tok);
}

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

/* Encode, decode and check that decoding gives `expect` (NULL: only valid UTF-8 is required). */
static void roundtrip(const struct toast_tokenizer *tok, const char *what, const char *text, size_t n,
		      const char *expect, size_t n_expect)
{
	int32_t *ids = NULL;
	int n_ids = 0;
	char *dec = NULL;
	size_t len = 0;
	struct toast_error err = {0};
	double t0 = toast_now();
	enum toast_status st = toast_tok_encode(tok, text, n, &ids, &n_ids, &err);
	double dt = toast_now() - t0;
	CHECK(st == TOAST_OK, "%s: %s", what, err.msg);
	/* a hang or quadratic blow-up on a megabyte takes minutes; this bound only catches that */
	CHECK(dt < 10, "%s: encoding %zu bytes took %.1f s", what, n, dt);
	if (st == TOAST_OK)
		st = toast_tok_decode(tok, ids, n_ids, &dec, &len, &err);
	CHECK(st == TOAST_OK, "%s: decode: %s", what, err.msg);
	if (st == TOAST_OK && expect)
		CHECK(len == n_expect && memcmp(dec, expect, len) == 0, "%s: %zu bytes decode to %zu bytes, want %zu", what, n,
		      len, n_expect);
	if (st == TOAST_OK)
		CHECK(toast_utf8_valid(dec, len), "%s: decoded text is not valid UTF-8", what);
	free(ids);
	free(dec);
}

static void test_fuzz(void)
{
	struct toast_tokenizer *tiny = load("tokenizer/tiny-bpe"), *qwen = load("models/qwen3next-vocab");
	if (!tiny || !qwen) {
		toast_tok_free(tiny);
		toast_tok_free(qwen);
		return;
	}
	char *buf = malloc(1 << 20);
	/* random bytes, and random bytes biased to UTF-8 lead/continuation bytes and '<|' */
	for (int it = 0; it < 400; it++) {
		size_t n = rnd() % 3000;
		for (size_t i = 0; i < n; i++) {
			uint32_t r = rnd();
			buf[i] = (char)(it % 2 ? r : (r % 4 == 0 ? 0x80 | (r >> 8 & 0x3F) : r % 4 == 1 ? 0xE0 | (r >> 8 & 0xF) :
						      r % 4 == 2 ? (uint32_t)"<|>'s \n"[r >> 8 & 7] : 'a' + (r >> 8) % 26));
		}
		size_t cn;
		char *clean = toast_utf8_sanitize(buf, n, &cn);
		roundtrip(tiny, "random bytes (tiny-bpe)", buf, n, clean, cn); /* no normaliser: exact */
		roundtrip(qwen, "random bytes (qwen3)", buf, n, NULL, 0);
		free(clean);
	}
	/* long runs of one character, and a megabyte of mixed text */
	static const char *units[] = {"a", " ", "\n", "\xC3\xA9", "e\xCC\x81", "\xE4\xB8\xAD", "1", "!", "\t ", "'s",
				      "\xF0\x9F\x98\x80", "<|im_end|>", "\xed\xa0\x80"};
	for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
		size_t l = strlen(units[u]), n = 0;
		while (n + l <= (1 << 20)) {
			memcpy(buf + n, units[u], l);
			n += l;
		}
		char what[64];
		snprintf(what, sizeof(what), "1 MiB of \"%s\"", units[u]);
		size_t cn;
		char *clean = toast_utf8_sanitize(buf, n, &cn);
		roundtrip(tiny, what, buf, n, clean, cn);
		/* Qwen normalises to NFC: e + combining acute becomes é */
		roundtrip(qwen, what, buf, n, u == 4 ? NULL : clean, cn);
		free(clean);
	}
	size_t n = 0;
	static const char *words[] = {"int ", "main", "(void)", " {\n", "\treturn ", "0;", " the", " quick", "\xE4\xB8\xAD\xE6\x96\x87",
				      "  ", "\r\n", "'ll", " 12345", "\xF0\x9F\x8E\x89", "<think>", "\xC3\xA9t\xC3\xA9"};
	while (n < (1 << 20) - 16) {
		const char *w = words[rnd() % (sizeof(words) / sizeof(words[0]))];
		memcpy(buf + n, w, strlen(w));
		n += strlen(w);
	}
	roundtrip(qwen, "1 MiB of mixed text", buf, n, buf, n);
	free(buf);
	toast_tok_free(tiny);
	toast_tok_free(qwen);
}

static void test_detok(void)
{
	struct toast_tokenizer *tok = load("models/qwen3next-vocab");
	if (!tok)
		return;
	size_t cap = toast_detok_cap(tok);
	char *out = malloc(cap), *stream = malloc(1 << 16);
	for (int it = 0; it < 300; it++) {
		/* random ids: many tokens are fragments of multi-byte characters */
		int n = 1 + (int)(rnd() % 60);
		int32_t ids[64];
		for (int i = 0; i < n; i++)
			ids[i] = (int32_t)(rnd() % (uint32_t)toast_tok_n_vocab(tok));
		struct toast_detok d;
		toast_detok_init(&d);
		size_t sn = 0;
		bool whole = true;
		for (int i = 0; i < n; i++) {
			size_t k = toast_detok_push(&d, tok, ids[i], out, cap);
			whole = whole && toast_utf8_valid(out, k);
			memcpy(stream + sn, out, k);
			sn += k;
		}
		size_t k = toast_detok_flush(&d, out, cap);
		memcpy(stream + sn, out, k);
		sn += k;
		char *dec = NULL;
		size_t len;
		struct toast_error err = {0};
		CHECK(toast_tok_decode(tok, ids, n, &dec, &len, &err) == TOAST_OK, "%s", err.msg);
		CHECK(whole && dec && len == sn && memcmp(dec, stream, sn) == 0,
		      "streamed text differs from decoding (or split a character) at iteration %d", it);
		free(dec);
	}
	/* 中 is E4 B8 AD: its byte tokens one at a time come out only when complete */
	int32_t e4 = tok->byte_id[0xE4], b8 = tok->byte_id[0xB8], ad = tok->byte_id[0xAD];
	struct toast_detok d;
	toast_detok_init(&d);
	CHECK(toast_detok_push(&d, tok, e4, out, cap) == 0 && toast_detok_push(&d, tok, b8, out, cap) == 0 &&
		      toast_detok_push(&d, tok, ad, out, cap) == 3 && memcmp(out, "\xE4\xB8\xAD", 3) == 0,
	      "a character split over three tokens");
	CHECK(toast_detok_push(&d, tok, e4, out, cap) == 0 && toast_detok_flush(&d, out, cap) == 3 &&
		      memcmp(out, "\xEF\xBF\xBD", 3) == 0,
	      "an unfinished character at the end becomes U+FFFD");
	free(out);
	free(stream);
	toast_tok_free(tok);
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[1100];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void test_bad_files(void)
{
	char dir[] = "/tmp/toasted-tok-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	struct toast_error err = {0};
	struct toast_tokenizer *tok = NULL;
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_IO && strstr(err.msg, "tokenizer.json"), "missing file: %s",
	      err.msg);
	write_file(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ");
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_FORMAT, "truncated JSON: %s", err.msg);
	write_file(dir, "tokenizer.json",
		   "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_UNSUPPORTED && strstr(err.msg, "WordPiece"), "WordPiece: %s",
	      err.msg);
	write_file(dir, "tokenizer.json",
		   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}");
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_UNSUPPORTED && strstr(err.msg, "Metaspace"), "Metaspace: %s",
	      err.msg);
	write_file(dir, "tokenizer.json",
		   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_UNSUPPORTED && strstr(err.msg, "byte 0x"), "missing bytes: %s",
	      err.msg);
	write_file(dir, "tokenizer.json",
		   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}, \"merges\": []}, \"pre_tokenizer\": null, "
		   "\"decoder\": {\"type\": \"ByteLevel\"}}");
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_ERR_FORMAT, "huge id: %s", err.msg);
	CHECK(tok == NULL, "nothing returned on failure");
	char path[1100];
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	struct toast_tokenizer *qwen = load("models/qwen3next-vocab");
	check_cases(qwen, "tokenizer/qwen3-cases.jsonl", 200);
	toast_tok_free(qwen);
	struct toast_tokenizer *l3 = load("tokenizer/llama3-style");
	check_cases(l3, "tokenizer/llama3-style/cases.jsonl", 300);
	toast_tok_free(l3);
	test_tiny_bpe();
	test_invalid_utf8();
	test_fuzz();
	test_detok();
	test_bad_files();
	return test_done("test_tokenizer");
}
