/*
 * jinja_lex.c - Jinja2 source -> tokens, with Jinja's whitespace rules as transformers configures
 * them: newlines normalised to \n and one trailing newline dropped (keep_trailing_newline off);
 * "{%-"/"-%}" strip all whitespace on that side; trim_blocks drops the first newline after a
 * block or comment tag; lstrip_blocks drops spaces and tabs from the start of a line up to a
 * block or comment tag; "+" on a tag disables either. {% raw %} ... {% endraw %} is text.
 * Invariant: token strings point into the arena (string literals are unescaped copies).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "util/err.h"

struct lex {
	struct jarena *ar;
	struct jtok *t;
	int n, cap;
	int line;
	struct toast_error *err;
};

static bool lex_push(struct lex *L, struct jtok tk)
{
	if (L->n == L->cap) {
		int cap = L->cap ? L->cap * 2 : 256;
		struct jtok *t = realloc(L->t, (size_t)cap * sizeof(*t));
		if (!t)
			return false;
		L->t = t;
		L->cap = cap;
	}
	tk.line = L->line;
	L->t[L->n++] = tk;
	return true;
}

static int lex_count_lines(const char *p, size_t n)
{
	int k = 0;
	for (size_t i = 0; i < n; i++)
		k += p[i] == '\n';
	return k;
}

static bool lex_is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool lex_text(struct lex *L, const char *p, size_t n)
{
	if (n == 0)
		return true;
	struct jtok tk = {.t = JT_TEXT};
	tk.s = jstr_dup(L->ar, p, n);
	return tk.s.p && lex_push(L, tk);
}

/* Python-style escapes of a string literal body into the arena. */
static bool lex_unescape(struct lex *L, const char *p, size_t n, struct jstr *out)
{
	char *o = jarena_alloc(L->ar, n + 1);
	if (!o)
		return false;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (p[i] != '\\' || i + 1 == n) {
			o[k++] = p[i];
			continue;
		}
		char e = p[++i];
		uint32_t cp = 0;
		int hex = 0;
		switch (e) {
		case 'n': o[k++] = '\n'; break;
		case 't': o[k++] = '\t'; break;
		case 'r': o[k++] = '\r'; break;
		case '0': o[k++] = '\0'; break;
		case 'a': o[k++] = '\a'; break;
		case 'b': o[k++] = '\b'; break;
		case 'f': o[k++] = '\f'; break;
		case 'v': o[k++] = '\v'; break;
		case '\\': o[k++] = '\\'; break;
		case '\'': o[k++] = '\''; break;
		case '"': o[k++] = '"'; break;
		case '\n': break; /* line continuation */
		case 'x': hex = 2; break;
		case 'u': hex = 4; break;
		case 'U': hex = 8; break;
		default: o[k++] = '\\'; o[k++] = e; break;
		}
		if (!hex)
			continue;
		if (i + (size_t)hex >= n) { /* too short: keep it literally */
			o[k++] = '\\';
			o[k++] = e;
			continue;
		}
		for (int h = 0; h < hex; h++) {
			char c = p[i + 1 + h];
			if (!isxdigit((unsigned char)c)) {
				cp = UINT32_MAX;
				break;
			}
			cp = cp * 16 + (uint32_t)(isdigit((unsigned char)c) ? c - '0' : (tolower((unsigned char)c) - 'a' + 10));
		}
		if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) { /* keep it literally */
			o[k++] = '\\';
			o[k++] = e;
			continue;
		}
		i += (size_t)hex;
		if (cp < 0x80) {
			o[k++] = (char)cp;
		} else if (cp < 0x800) {
			o[k++] = (char)(0xC0 | cp >> 6);
			o[k++] = (char)(0x80 | (cp & 0x3F));
		} else if (cp < 0x10000) {
			o[k++] = (char)(0xE0 | cp >> 12);
			o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			o[k++] = (char)(0x80 | (cp & 0x3F));
		} else {
			o[k++] = (char)(0xF0 | cp >> 18);
			o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
			o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			o[k++] = (char)(0x80 | (cp & 0x3F));
		}
	}
	out->p = o;
	out->n = k;
	return true;
}

static const char *lex_ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
				"=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};

/* Tokens of one tag from s[*i], up to and including its end ("}}" or "%}"); returns the strip
 * sign before the end ('-', '+' or 0), or -1 on error. */
static int lex_tag(struct lex *L, const char *s, size_t n, size_t *i, bool block)
{
	const char *end = block ? "%}" : "}}";
	size_t p = *i;
	for (;;) {
		while (p < n && lex_is_ws(s[p])) {
			L->line += s[p] == '\n';
			p++;
		}
		if (p >= n) {
			toast_err_set(L->err, TOAST_ERR_FORMAT, "template line %d: unclosed tag", L->line);
			return -1;
		}
		for (int sign = 0; sign < 3; sign++) {
			const char *pre = sign == 0 ? "" : sign == 1 ? "-" : "+";
			size_t pl = strlen(pre);
			if (p + pl + 2 <= n && memcmp(s + p, pre, pl) == 0 && memcmp(s + p + pl, end, 2) == 0) {
				*i = p + pl + 2;
				if (!lex_push(L, (struct jtok){.t = block ? JT_BLOCK_END : JT_VAR_END}))
					return -1;
				return sign == 0 ? 0 : pre[0];
			}
		}
		struct jtok tk = {0};
		char c = s[p];
		if (isalpha((unsigned char)c) || c == '_') {
			size_t q = p;
			while (q < n && (isalnum((unsigned char)s[q]) || s[q] == '_'))
				q++;
			tk.t = JT_NAME;
			tk.s = (struct jstr){s + p, q - p};
			p = q;
		} else if (isdigit((unsigned char)c)) {
			bool after_dot = L->n > 0 && L->t[L->n - 1].t == JT_OP && L->t[L->n - 1].s.n == 1 &&
					 L->t[L->n - 1].s.p[0] == '.';
			size_t q = p;
			while (q < n && (isdigit((unsigned char)s[q]) || s[q] == '_'))
				q++;
			bool is_float = false;
			if (!after_dot && q + 1 < n && s[q] == '.' && isdigit((unsigned char)s[q + 1])) {
				is_float = true;
				q++;
				while (q < n && (isdigit((unsigned char)s[q]) || s[q] == '_'))
					q++;
			}
			if (!after_dot && q < n && (s[q] == 'e' || s[q] == 'E')) {
				size_t r = q + 1;
				if (r < n && (s[r] == '+' || s[r] == '-'))
					r++;
				if (r < n && isdigit((unsigned char)s[r])) {
					is_float = true;
					q = r;
					while (q < n && isdigit((unsigned char)s[q]))
						q++;
				}
			}
			char num[64];
			size_t k = 0;
			for (size_t j = p; j < q && k < sizeof(num) - 1; j++)
				if (s[j] != '_')
					num[k++] = s[j];
			num[k] = 0;
			if (is_float) {
				tk.t = JT_FLOAT;
				tk.f = strtod(num, NULL);
			} else {
				tk.t = JT_INT;
				tk.i = strtoll(num, NULL, 10);
			}
			p = q;
		} else if (c == '\'' || c == '"') {
			size_t q = p + 1;
			while (q < n && s[q] != c) {
				if (s[q] == '\\' && q + 1 < n)
					q++;
				q++;
			}
			if (q >= n) {
				toast_err_set(L->err, TOAST_ERR_FORMAT, "template line %d: unterminated string", L->line);
				return -1;
			}
			tk.t = JT_STRING;
			if (!lex_unescape(L, s + p + 1, q - p - 1, &tk.s))
				goto nomem;
			L->line += lex_count_lines(s + p, q - p);
			p = q + 1;
		} else {
			size_t k;
			for (k = 0; k < sizeof(lex_ops) / sizeof(lex_ops[0]); k++) {
				size_t l = strlen(lex_ops[k]);
				if (p + l <= n && memcmp(s + p, lex_ops[k], l) == 0)
					break;
			}
			if (k == sizeof(lex_ops) / sizeof(lex_ops[0])) {
				toast_err_set(L->err, TOAST_ERR_FORMAT, "template line %d: unexpected character '%c'", L->line, c);
				return -1;
			}
			tk.t = JT_OP;
			tk.s = (struct jstr){lex_ops[k], strlen(lex_ops[k])};
			p += tk.s.n;
		}
		if (!lex_push(L, tk))
			goto nomem;
	}
nomem:
	toast_err_set(L->err, TOAST_ERR_NOMEM, "out of memory");
	return -1;
}

/* After a tag's end at s[*i]: strip per the sign; returns whether the consumed part ends a line. */
static bool lex_after_tag(struct lex *L, const char *s, size_t n, size_t *i, int sign, bool trim)
{
	size_t p = *i;
	if (sign == '-') {
		while (p < n && lex_is_ws(s[p])) {
			L->line += s[p] == '\n';
			p++;
		}
	} else if (sign != '+' && trim && p < n && s[p] == '\n') {
		L->line++;
		p++;
	}
	*i = p;
	return p > 0 && s[p - 1] == '\n';
}

/* "{% endraw %}" (with optional signs and spaces) at or after p: its start, end and leading sign. */
static bool lex_find_endraw(const char *s, size_t n, size_t p, size_t *start, size_t *end, char *lsign, char *rsign)
{
	for (; p + 1 < n; p++) {
		if (s[p] != '{' || s[p + 1] != '%')
			continue;
		size_t q = p + 2;
		*lsign = (q < n && (s[q] == '-' || s[q] == '+')) ? s[q++] : 0;
		while (q < n && lex_is_ws(s[q]))
			q++;
		if (q + 6 > n || memcmp(s + q, "endraw", 6) != 0)
			continue;
		q += 6;
		while (q < n && lex_is_ws(s[q]))
			q++;
		*rsign = (q < n && (s[q] == '-' || s[q] == '+')) ? s[q++] : 0;
		if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') {
			*start = p;
			*end = q + 2;
			return true;
		}
	}
	return false;
}

enum toast_status jinja_lex(struct jarena *a, const char *src, struct jtok **toks, int *n_toks, struct toast_error *err)
{
	/* newlines -> \n, and one trailing newline dropped */
	size_t sn = strlen(src), n = 0;
	char *s = jarena_alloc(a, sn + 1);
	if (!s)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < sn; i++) {
		if (src[i] == '\r') {
			s[n++] = '\n';
			if (i + 1 < sn && src[i + 1] == '\n')
				i++;
		} else {
			s[n++] = src[i];
		}
	}
	if (n > 0 && s[n - 1] == '\n')
		n--;
	struct lex L = {.ar = a, .line = 1, .err = err};
	size_t pos = 0;
	bool line_starting = true;
	while (pos < n) {
		size_t start = pos;
		while (start + 1 < n && !(s[start] == '{' && (s[start + 1] == '{' || s[start + 1] == '%' || s[start + 1] == '#')))
			start++;
		if (start + 1 >= n) {
			if (!lex_text(&L, s + pos, n - pos))
				goto nomem;
			break;
		}
		char kind = s[start + 1];
		char sign = start + 2 < n && (s[start + 2] == '-' || s[start + 2] == '+') ? s[start + 2] : 0;
		size_t tn = start - pos;
		if (sign == '-') {
			while (tn > 0 && lex_is_ws(s[pos + tn - 1]))
				tn--;
		} else if (sign != '+' && kind != '{') { /* lstrip_blocks */
			size_t l = tn;
			while (l > 0 && s[pos + l - 1] != '\n')
				l--;
			bool only_ws = l < tn;
			for (size_t k = l; k < tn && only_ws; k++)
				only_ws = s[pos + k] == ' ' || s[pos + k] == '\t' || s[pos + k] == '\v' || s[pos + k] == '\f';
			if ((l > 0 || line_starting) && only_ws)
				tn = l;
		}
		if (!lex_text(&L, s + pos, tn))
			goto nomem;
		L.line += lex_count_lines(s + pos, start - pos);
		size_t i = start + 2 + (sign ? 1 : 0);
		if (kind == '#') {
			size_t e = i;
			while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
				e++;
			if (e + 1 >= n)
				return free(L.t), toast_err_set(err, TOAST_ERR_FORMAT, "template line %d: unclosed comment", L.line);
			int esign = e > i && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
			L.line += lex_count_lines(s + i, e - i);
			i = e + 2;
			line_starting = lex_after_tag(&L, s, n, &i, esign, true);
			pos = i;
			continue;
		}
		bool block = kind == '%';
		int first = L.n;
		if (!lex_push(&L, (struct jtok){.t = block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN}))
			goto nomem;
		int esign = lex_tag(&L, s, n, &i, block);
		if (esign < 0) {
			free(L.t);
			return err && err->code ? err->code : TOAST_ERR_FORMAT;
		}
		line_starting = lex_after_tag(&L, s, n, &i, esign, block);
		if (block && L.n == first + 3 && L.t[first + 1].t == JT_NAME && L.t[first + 1].s.n == 3 &&
		    memcmp(L.t[first + 1].s.p, "raw", 3) == 0) {
			size_t rs, re;
			char ls, rsg;
			if (!lex_find_endraw(s, n, i, &rs, &re, &ls, &rsg))
				return free(L.t), toast_err_set(err, TOAST_ERR_FORMAT, "template line %d: raw without endraw", L.line);
			L.n = first; /* drop the raw tag itself */
			size_t rn = rs - i;
			if (ls == '-')
				while (rn > 0 && lex_is_ws(s[i + rn - 1]))
					rn--;
			if (!lex_text(&L, s + i, rn))
				goto nomem;
			L.line += lex_count_lines(s + i, re - i);
			i = re;
			line_starting = lex_after_tag(&L, s, n, &i, rsg, true);
		}
		pos = i;
	}
	if (!lex_push(&L, (struct jtok){.t = JT_EOF}))
		goto nomem;
	*toks = L.t;
	*n_toks = L.n;
	return TOAST_OK;
nomem:
	free(L.t);
	return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
}
