/*
 * tok_pretok.c - the text side of encoding: UTF-8 validation and repair, the normaliser, and the
 * pre-tokenizer steps (Split by regex or literal, ByteLevel, Digits) with Hugging Face's split
 * behaviours.
 *
 * Regexes come from tokenizer.json and were written for Oniguruma; PCRE2 (UTF + UCP, JIT when
 * available) runs them. The one semantic difference that matters is \s: PCRE2 also counts
 * U+180E as space, Oniguruma does not, so \s and \S are rewritten into Oniguruma's explicit set.
 * Unicode properties (\p{L}, \p{N}) follow the system PCRE2's Unicode tables.
 * Invariant: every function here sees valid UTF-8 (tok_encode.c repairs input first).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok.h"
#include "util/err.h"

/* GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex splits with */
const char tok_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Oniguruma's (and Rust's) white space, as the body of a character class */
#define TOK_SPACE_CLASS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

bool tok_is_space(uint32_t c)
{
	return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
	       c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- regex ---- */

enum toast_status tok_regex_compile(const char *pattern, pcre2_code **out, struct toast_error *err)
{
	size_t n = strlen(pattern), cap = n * 4 + sizeof(TOK_SPACE_CLASS) * 8 + 16, o = 0;
	char *t = malloc(cap);
	if (!t)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	bool in_class = false;
	enum toast_status rc = TOAST_OK;
	for (size_t i = 0; i < n; i++) {
		if (o + sizeof(TOK_SPACE_CLASS) + 8 > cap) {
			cap *= 2;
			char *nt = realloc(t, cap);
			if (!nt) {
				free(t);
				return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			}
			t = nt;
		}
		char ch = pattern[i];
		if (ch == '\\' && i + 1 < n) {
			char e = pattern[++i];
			if (e == 's') {
				o += (size_t)sprintf(t + o, in_class ? "%s" : "[%s]", TOK_SPACE_CLASS);
			} else if (e == 'S') {
				if (in_class) {
					rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "regex \"%s\": \\S inside a character class",
							   pattern);
					break;
				}
				o += (size_t)sprintf(t + o, "[^%s]", TOK_SPACE_CLASS);
			} else {
				t[o++] = '\\';
				t[o++] = e;
			}
			continue;
		}
		if (!in_class && ch == '[') {
			in_class = true;
			t[o++] = ch;
			/* a ']' right after '[' or '[^' is a literal */
			if (i + 1 < n && pattern[i + 1] == '^')
				t[o++] = pattern[++i];
			if (i + 1 < n && pattern[i + 1] == ']')
				t[o++] = pattern[++i];
			continue;
		}
		if (in_class && ch == '[' && i + 1 < n && pattern[i + 1] == ':') { /* [:alpha:] */
			const char *end = strstr(pattern + i, ":]");
			size_t l = end ? (size_t)(end - (pattern + i)) + 2 : 1;
			if (o + l + 8 > cap) {
				rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "regex \"%s\": POSIX class too long", pattern);
				break;
			}
			memcpy(t + o, pattern + i, l);
			o += l;
			i += l - 1;
			continue;
		}
		if (in_class && ch == ']')
			in_class = false;
		t[o++] = ch;
	}
	if (rc != TOAST_OK) {
		free(t);
		return rc;
	}
	int ec;
	PCRE2_SIZE eo;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)t, o, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
	free(t);
	if (!re) {
		PCRE2_UCHAR msg[128];
		pcre2_get_error_message(ec, msg, sizeof(msg));
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "regex \"%s\": %s", pattern, (char *)msg);
	}
	pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* no JIT: the interpreter runs it */
	*out = re;
	return TOAST_OK;
}

/* ---- normaliser ---- */

static enum toast_status norm_map1(const char *p, size_t n, int opts, char **out, size_t *out_n,
				   struct toast_error *err)
{
	utf8proc_uint8_t *dst = NULL;
	utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &dst,
					  (utf8proc_option_t)(opts | UTF8PROC_STABLE));
	if (r < 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "normalising text: %s", utf8proc_errmsg(r));
	*out = (char *)dst;
	*out_n = (size_t)r;
	return TOAST_OK;
}

/* utf8proc (2.8 at least) composes a Hangul LV syllable with U+11A7, which is not a trailing
 * consonant, and so drops the U+11A7. It is a starter that composes with nothing, so the text
 * is normalised in pieces that each begin at a U+11A7. */
static enum toast_status norm_map(const char *p, size_t n, int opts, char **out, size_t *out_n,
				  struct toast_error *err)
{
	static const char t0[] = "\xE1\x86\xA7";
	size_t k = 1;
	while (k + 3 <= n && memcmp(p + k, t0, 3) != 0)
		k++;
	if (!(opts & UTF8PROC_COMPOSE) || k + 3 > n)
		return norm_map1(p, n, opts, out, out_n, err);
	char *buf = NULL;
	size_t o = 0, i = 0;
	while (i < n) {
		size_t e = i + 1;
		while (e + 3 <= n && memcmp(p + e, t0, 3) != 0)
			e++;
		if (e + 3 > n)
			e = n;
		char *m = NULL;
		size_t mn = 0;
		enum toast_status rc = norm_map1(p + i, e - i, opts, &m, &mn, err);
		if (rc != TOAST_OK) {
			free(buf);
			return rc;
		}
		char *nb = realloc(buf, o + mn + 1);
		if (!nb) {
			free(m);
			free(buf);
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		}
		buf = nb;
		memcpy(buf + o, m, mn);
		o += mn;
		free(m);
		i = e;
	}
	buf[o] = 0;
	*out = buf;
	*out_n = o;
	return TOAST_OK;
}

/* NFC, working only on the stretches that can change: a code point below U+0300 is a starter
 * that composes with nothing before it, so the text splits into independent runs there. */
static enum toast_status norm_nfc(const char *p, size_t n, char **out, size_t *out_n, struct toast_error *err)
{
	size_t i = 0, o = 0, cap = 0;
	char *buf = NULL;
	const unsigned char *u = (const unsigned char *)p;
	while (i < n) {
		size_t q = i;
		while (q < n && u[q] < 0xCC)
			q++;
		if (q == n)
			break;
		/* [a, b): the starter before the run of >= U+0300 code points, and the run */
		size_t a = q;
		if (a > i) {
			a--;
			while (a > i && (u[a] & 0xC0) == 0x80)
				a--;
		}
		size_t b = q;
		while (b < n) {
			int l;
			uint32_t c = toast_utf8_next(p + b, n - b, &l);
			if (c < 0x300)
				break;
			b += (size_t)l;
		}
		char *m = NULL;
		size_t mn = 0;
		enum toast_status rc = norm_map(p + a, b - a, UTF8PROC_COMPOSE, &m, &mn, err);
		if (rc != TOAST_OK) {
			free(buf);
			return rc;
		}
		if (!buf && mn == b - a && memcmp(m, p + a, mn) == 0) { /* still identical: no copy yet */
			free(m);
			i = b;
			continue;
		}
		if (!buf) { /* [0, i) is identical to the input */
			cap = n + mn + 64;
			buf = malloc(cap);
			if (buf)
				memcpy(buf, p, i);
			o = i;
		} else if (o + (a - i) + mn + 1 > cap) {
			cap = (o + (a - i) + mn + 1) * 2;
			char *nb = realloc(buf, cap);
			if (!nb)
				free(buf);
			buf = nb;
		}
		if (!buf) {
			free(m);
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		}
		memcpy(buf + o, p + i, a - i);
		o += a - i;
		memcpy(buf + o, m, mn);
		o += mn;
		free(m);
		i = b;
	}
	if (!buf) {
		*out = (char *)p;
		*out_n = n;
		return TOAST_OK;
	}
	if (o + (n - i) + 1 > cap) {
		char *nb = realloc(buf, o + (n - i) + 1);
		if (!nb) {
			free(buf);
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		}
		buf = nb;
	}
	memcpy(buf + o, p + i, n - i);
	o += n - i;
	buf[o] = 0;
	*out = buf;
	*out_n = o;
	return TOAST_OK;
}

enum toast_status tok_normalize(const struct toast_tokenizer *tok, const char *p, size_t n, char **out, size_t *out_n,
				struct toast_error *err)
{
	char *cur = (char *)p;
	size_t cur_n = n;
	for (int s = 0; s < tok->n_norm; s++) {
		char *next = NULL;
		size_t next_n = 0;
		enum toast_status rc;
		bool ascii = true;
		for (size_t i = 0; i < cur_n && ascii; i++)
			ascii = (unsigned char)cur[i] < 0x80;
		if (ascii) /* every normal form leaves ASCII alone */
			continue;
		switch (tok->norm[s]) {
		case TOK_NORM_NFC: rc = norm_nfc(cur, cur_n, &next, &next_n, err); break;
		case TOK_NORM_NFD: rc = norm_map(cur, cur_n, UTF8PROC_DECOMPOSE, &next, &next_n, err); break;
		case TOK_NORM_NFKC: rc = norm_map(cur, cur_n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &next, &next_n, err); break;
		default: rc = norm_map(cur, cur_n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &next, &next_n, err); break;
		}
		if (rc != TOAST_OK) {
			if (cur != p)
				free(cur);
			return rc;
		}
		if (next != cur && cur != p)
			free(cur);
		cur = next;
		cur_n = next_n;
	}
	*out = cur;
	*out_n = cur_n;
	return TOAST_OK;
}

/* ---- pre-tokenizer ---- */

static bool pretok_is_numeric(uint32_t cp)
{
	if (cp < 0x80)
		return cp >= '0' && cp <= '9';
	utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
	return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool spans_push(struct tok_enc *c, int step, size_t *n, size_t start, size_t end, bool match)
{
	if (*n == c->spans_cap[step]) {
		size_t cap = c->spans_cap[step] ? c->spans_cap[step] * 2 : 64;
		struct tok_span *s = realloc(c->spans[step], cap * sizeof(*s));
		if (!s)
			return false;
		c->spans[step] = s;
		c->spans_cap[step] = cap;
	}
	c->spans[step][(*n)++] = (struct tok_span){start, end, match};
	return true;
}

/* Matches of the step's pattern over [p, p+n) as spans covering it: gaps (false) and matches (true). */
static enum toast_status split_find(struct tok_enc *c, int step, const char *p, size_t n, size_t *n_spans,
				    struct toast_error *err)
{
	const struct tok_pretok *pt = &c->tok->pretok[step];
	size_t prev = 0, pos = 0;
	*n_spans = 0;
	while (pos <= n) {
		size_t ms, me;
		if (pt->kind == TOK_PRETOK_DIGITS) { /* every numeric character (Rust's char::is_numeric) */
			int l = 0;
			while (pos < n && !pretok_is_numeric(toast_utf8_next(p + pos, n - pos, &l)))
				pos += (size_t)l;
			if (pos >= n)
				break;
			ms = pos;
			me = pos + (size_t)l;
		} else if (pt->literal) {
			if (pt->literal_len == 0 || pos + pt->literal_len > n)
				break;
			const char *f = NULL;
			for (size_t k = pos; k + pt->literal_len <= n && !f; k++)
				if (p[k] == pt->literal[0] && memcmp(p + k, pt->literal, pt->literal_len) == 0)
					f = p + k;
			if (!f)
				break;
			ms = (size_t)(f - p);
			me = ms + pt->literal_len;
		} else {
			int r = pcre2_match(pt->re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
			if (r == PCRE2_ERROR_NOMATCH)
				break;
			if (r < 0) {
				PCRE2_UCHAR msg[128];
				pcre2_get_error_message(r, msg, sizeof(msg));
				return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "pre-tokenizer regex failed on a %zu-byte piece: %s",
						     n, (char *)msg);
			}
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
			ms = ov[0];
			me = ov[1];
		}
		if (ms > prev && !spans_push(c, step, n_spans, prev, ms, false))
			goto nomem;
		if (!spans_push(c, step, n_spans, ms, me, true))
			goto nomem;
		prev = me;
		if (me > ms) {
			pos = me;
		} else { /* an empty match: step over one character */
			if (me >= n)
				break;
			int l;
			toast_utf8_next(p + me, n - me, &l);
			pos = me + (size_t)l;
		}
	}
	if (prev < n && !spans_push(c, step, n_spans, prev, n, false))
		goto nomem;
	return TOAST_OK;
nomem:
	return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
}

/* Hugging Face's SplitDelimiterBehavior applied to the spans, in place; returns the new count. */
static size_t split_behave(struct tok_span *s, size_t n, enum tok_split_behavior b, bool invert)
{
	if (invert)
		for (size_t i = 0; i < n; i++)
			s[i].match = !s[i].match;
	size_t o = 0;
	bool prev_match = false;
	switch (b) {
	case TOK_SPLIT_ISOLATED:
		return n;
	case TOK_SPLIT_REMOVED:
		for (size_t i = 0; i < n; i++)
			if (!s[i].match)
				s[o++] = s[i];
		return o;
	case TOK_SPLIT_MERGED_PREV:
		for (size_t i = 0; i < n; i++) {
			bool m = s[i].match;
			if (m && !prev_match && o > 0)
				s[o - 1].end = s[i].end;
			else
				s[o++] = (struct tok_span){s[i].start, s[i].end, m && !prev_match};
			prev_match = m;
		}
		return o;
	case TOK_SPLIT_MERGED_NEXT: /* folded from the right */
		o = n;
		for (size_t k = n; k-- > 0;) {
			bool m = s[k].match;
			if (m && !prev_match && o < n)
				s[o].start = s[k].start;
			else
				s[--o] = s[k];
			prev_match = m;
		}
		memmove(s, s + o, (n - o) * sizeof(*s));
		return n - o;
	case TOK_SPLIT_CONTIGUOUS:
		for (size_t i = 0; i < n; i++) {
			bool m = s[i].match;
			if (m == prev_match && o > 0)
				s[o - 1].end = s[i].end;
			else
				s[o++] = s[i];
			prev_match = m;
		}
		return o;
	}
	return n;
}

enum toast_status tok_pretok_run(struct tok_enc *c, int step, const char *p, size_t n, struct toast_error *err)
{
	const struct toast_tokenizer *tok = c->tok;
	if (n == 0)
		return TOAST_OK;
	if (step == tok->n_pretok)
		return tok_enc_word(c, p, n, err);
	const struct tok_pretok *pt = &tok->pretok[step];
	enum tok_split_behavior behavior = pt->behavior;
	if (pt->kind == TOK_PRETOK_BYTELEVEL) {
		if (pt->add_prefix_space && p[0] != ' ') {
			if (n + 1 > c->prefix_cap[step]) {
				char *b = realloc(c->prefix_buf[step], n + 1);
				if (!b)
					return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
				c->prefix_buf[step] = b;
				c->prefix_cap[step] = n + 1;
			}
			c->prefix_buf[step][0] = ' ';
			memcpy(c->prefix_buf[step] + 1, p, n);
			p = c->prefix_buf[step];
			n++;
		}
		if (!pt->re)
			return tok_pretok_run(c, step + 1, p, n, err);
		behavior = TOK_SPLIT_ISOLATED;
	}
	size_t n_spans;
	enum toast_status rc = split_find(c, step, p, n, &n_spans, err);
	if (rc != TOAST_OK)
		return rc;
	n_spans = split_behave(c->spans[step], n_spans, behavior, pt->kind == TOK_PRETOK_SPLIT && pt->invert);
	for (size_t i = 0; i < n_spans && rc == TOAST_OK; i++) {
		/* re-read: a deeper step never touches this level's spans, but realloc may move them */
		struct tok_span sp = c->spans[step][i];
		rc = tok_pretok_run(c, step + 1, p + sp.start, sp.end - sp.start, err);
	}
	return rc;
}
