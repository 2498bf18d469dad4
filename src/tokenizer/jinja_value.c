/*
 * jinja_value.c - values of the Jinja interpreter: the arena they live in, strings, lists,
 * dicts, and their Python behaviour (truth, ==, str(), repr(), json.dumps with
 * ensure_ascii=False as transformers' tojson does).
 * Invariant: values are immutable once built, except namespace dicts; all memory comes from the
 * render's arena and is freed with it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok.h"

const struct jv jv_undef = {.k = JV_UNDEF}, jv_none = {.k = JV_NONE};

/* ---- arena ---- */

struct jchunk {
	struct jchunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};

void *jarena_alloc(struct jarena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (a->limit && a->used + n > a->limit) {
		a->failed = true;
		return NULL;
	}
	struct jchunk *c = a->head;
	if (!c || c->cap - c->used < n) {
		size_t cap = n > 65536 ? n : 65536;
		c = malloc(sizeof(*c) + cap);
		if (!c) {
			a->failed = true;
			return NULL;
		}
		c->used = 0;
		c->cap = cap;
		c->next = a->head;
		a->head = c;
	}
	void *p = c->data + c->used;
	c->used += n;
	a->used += n;
	memset(p, 0, n);
	return p;
}

void jarena_free(struct jarena *a)
{
	for (struct jchunk *c = a->head, *next; c; c = next) {
		next = c->next;
		free(c);
	}
	a->head = NULL;
	a->used = 0;
}

void jbuf_put(struct jbuf *b, const void *s, size_t n)
{
	if (b->failed || n == 0)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		if (cap < 256)
			cap = 256;
		/* buffers are heap memory but count against the arena's limit */
		char *p = NULL;
		if (!b->ar || !b->ar->limit || b->ar->used + (cap - b->cap) <= b->ar->limit)
			p = realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			if (b->ar)
				b->ar->failed = true;
			return;
		}
		if (b->ar)
			b->ar->used += cap - b->cap;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

void jbuf_puts(struct jbuf *b, const char *s)
{
	jbuf_put(b, s, strlen(s));
}

/* ---- construction ---- */

struct jstr jstr_dup(struct jarena *a, const char *s, size_t n)
{
	char *p = jarena_alloc(a, n + 1);
	if (!p)
		return (struct jstr){NULL, 0};
	memcpy(p, s, n);
	return (struct jstr){p, n};
}

struct jlist *jlist_new(struct jarena *a, size_t cap)
{
	struct jlist *l = jarena_alloc(a, sizeof(*l));
	if (l && cap) {
		l->v = jarena_alloc(a, cap * sizeof(*l->v));
		l->cap = l->v ? cap : 0;
	}
	return l;
}

bool jlist_push(struct jarena *a, struct jlist *l, struct jv v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		struct jv *nv = jarena_alloc(a, cap * sizeof(*nv));
		if (!nv)
			return false;
		if (l->n)
			memcpy(nv, l->v, l->n * sizeof(*nv));
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = v;
	return true;
}

struct jdict *jdict_new(struct jarena *a, size_t cap)
{
	struct jdict *d = jarena_alloc(a, sizeof(*d));
	if (d && cap) {
		d->keys = jarena_alloc(a, cap * sizeof(*d->keys));
		d->vals = jarena_alloc(a, cap * sizeof(*d->vals));
		d->cap = d->keys && d->vals ? cap : 0;
	}
	return d;
}

struct jv *jdict_get(const struct jdict *d, const char *key, size_t n)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->keys[i].n == n && memcmp(d->keys[i].p, key, n) == 0)
			return &d->vals[i];
	return NULL;
}

bool jdict_set(struct jarena *a, struct jdict *d, struct jstr key, struct jv v)
{
	struct jv *old = jdict_get(d, key.p, key.n);
	if (old) {
		*old = v;
		return true;
	}
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 8;
		struct jstr *k = jarena_alloc(a, cap * sizeof(*k));
		struct jv *nv = jarena_alloc(a, cap * sizeof(*nv));
		if (!k || !nv)
			return false;
		if (d->n) {
			memcpy(k, d->keys, d->n * sizeof(*k));
			memcpy(nv, d->vals, d->n * sizeof(*nv));
		}
		d->keys = k;
		d->vals = nv;
		d->cap = cap;
	}
	d->keys[d->n] = key;
	d->vals[d->n++] = v;
	return true;
}

struct jv jv_from_json(struct jarena *a, json_t *j)
{
	struct jv v = jv_none;
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		struct jdict *d = jdict_new(a, json_object_size(j));
		const char *k;
		json_t *x;
		if (!d)
			return jv_undef;
		json_object_foreach(j, k, x) jdict_set(a, d, jstr_dup(a, k, strlen(k)), jv_from_json(a, x));
		v.k = JV_DICT;
		v.d = d;
		break;
	}
	case JSON_ARRAY: {
		struct jlist *l = jlist_new(a, json_array_size(j));
		size_t i;
		json_t *x;
		if (!l)
			return jv_undef;
		json_array_foreach(j, i, x) jlist_push(a, l, jv_from_json(a, x));
		v.k = JV_LIST;
		v.l = l;
		break;
	}
	case JSON_STRING: v = jv_strv(jstr_dup(a, json_string_value(j), json_string_length(j))); break;
	case JSON_INTEGER: v = jv_int(json_integer_value(j)); break;
	case JSON_REAL: v = jv_float(json_real_value(j)); break;
	case JSON_TRUE: v = jv_bool(true); break;
	case JSON_FALSE: v = jv_bool(false); break;
	default: break;
	}
	return v;
}

/* ---- Python behaviour ---- */

const char *jv_kind_name(struct jv v)
{
	static const char *names[] = {"undefined", "none", "bool", "int", "float", "str", "list", "dict", "macro", "function"};
	return v.k == JV_DICT && v.d->ns ? "namespace" : names[v.k];
}

bool jv_py_space(uint32_t cp)
{
	return tok_is_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

bool jv_truthy(struct jv v)
{
	switch (v.k) {
	case JV_BOOL: return v.b;
	case JV_INT: return v.i != 0;
	case JV_FLOAT: return v.f != 0;
	case JV_STR: return v.s.n > 0;
	case JV_LIST: return v.l->n > 0;
	case JV_DICT: return v.d->ns || v.d->n > 0;
	case JV_MACRO:
	case JV_FUNC: return true;
	default: return false;
	}
}

static bool jv_is_num(struct jv v, double *d)
{
	if (v.k == JV_BOOL)
		*d = v.b;
	else if (v.k == JV_INT)
		*d = (double)v.i;
	else if (v.k == JV_FLOAT)
		*d = v.f;
	else
		return false;
	return true;
}

bool jv_equal(struct jv a, struct jv b)
{
	double x, y;
	if (jv_is_num(a, &x) && jv_is_num(b, &y)) {
		if ((a.k == JV_INT || a.k == JV_BOOL) && (b.k == JV_INT || b.k == JV_BOOL))
			return (a.k == JV_INT ? a.i : a.b) == (b.k == JV_INT ? b.i : b.b);
		return x == y;
	}
	if (a.k != b.k)
		return false;
	switch (a.k) {
	case JV_UNDEF:
	case JV_NONE: return true;
	case JV_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
	case JV_LIST:
		if (a.l->n != b.l->n)
			return false;
		for (size_t i = 0; i < a.l->n; i++)
			if (!jv_equal(a.l->v[i], b.l->v[i]))
				return false;
		return true;
	case JV_DICT:
		if (a.d == b.d)
			return true;
		if (a.d->n != b.d->n || a.d->ns || b.d->ns)
			return false;
		for (size_t i = 0; i < a.d->n; i++) {
			struct jv *o = jdict_get(b.d, a.d->keys[i].p, a.d->keys[i].n);
			if (!o || !jv_equal(a.d->vals[i], *o))
				return false;
		}
		return true;
	case JV_MACRO: return a.macro == b.macro;
	case JV_FUNC: return a.func == b.func;
	default: return false;
	}
}

/* Python's repr(float): the shortest digits that read back to the same double. */
static void jv_float_repr(struct jbuf *b, double x, bool json)
{
	if (isnan(x)) {
		jbuf_puts(b, json ? "NaN" : "nan");
		return;
	}
	if (isinf(x)) {
		jbuf_puts(b, x > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
		return;
	}
	char e[40];
	for (int p = 1; p <= 17; p++) {
		snprintf(e, sizeof(e), "%.*e", p - 1, x);
		if (strtod(e, NULL) == x)
			break;
	}
	/* e = [-]d[.ddd]e(+|-)XX */
	char digits[24], out[64];
	int nd = 0, o = 0;
	const char *q = e;
	if (*q == '-')
		out[o++] = *q++;
	for (; *q && *q != 'e'; q++)
		if (*q != '.')
			digits[nd++] = *q;
	int exp = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	if (exp >= -4 && exp < 16) {
		if (exp < 0) {
			o += snprintf(out + o, sizeof(out) - (size_t)o, "0.");
			for (int k = 0; k < -exp - 1; k++)
				out[o++] = '0';
			memcpy(out + o, digits, (size_t)nd);
			o += nd;
		} else {
			for (int k = 0; k <= exp; k++)
				out[o++] = k < nd ? digits[k] : '0';
			out[o++] = '.';
			if (nd > exp + 1) {
				memcpy(out + o, digits + exp + 1, (size_t)(nd - exp - 1));
				o += nd - exp - 1;
			} else {
				out[o++] = '0';
			}
		}
	} else {
		out[o++] = digits[0];
		if (nd > 1) {
			out[o++] = '.';
			memcpy(out + o, digits + 1, (size_t)(nd - 1));
			o += nd - 1;
		}
		o += snprintf(out + o, sizeof(out) - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
	jbuf_put(b, out, (size_t)o);
}

static void jv_str_repr(struct jbuf *b, struct jstr s)
{
	bool has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	jbuf_put(b, &q, 1);
	for (size_t i = 0; i < s.n;) {
		int l;
		uint32_t cp = toast_utf8_next(s.p + i, s.n - i, &l);
		char esc[16];
		if (cp == '\\' || cp == (uint32_t)q) {
			esc[0] = '\\';
			esc[1] = (char)cp;
			jbuf_put(b, esc, 2);
		} else if (cp == '\n') {
			jbuf_puts(b, "\\n");
		} else if (cp == '\r') {
			jbuf_puts(b, "\\r");
		} else if (cp == '\t') {
			jbuf_puts(b, "\\t");
		} else if (cp < 0x20 || cp == 0x7F) {
			snprintf(esc, sizeof(esc), "\\x%02x", cp);
			jbuf_puts(b, esc);
		} else if (cp >= 0x80) {
			utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
			bool printable = !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
					   k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
					   k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
			if (printable) {
				jbuf_put(b, s.p + i, (size_t)l);
			} else {
				snprintf(esc, sizeof(esc), cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
				jbuf_puts(b, esc);
			}
		} else {
			jbuf_put(b, s.p + i, 1);
		}
		i += (size_t)l;
	}
	jbuf_put(b, &q, 1);
}

void jv_repr(struct jbuf *b, struct jv v)
{
	switch (v.k) {
	case JV_STR: jv_str_repr(b, v.s); return;
	case JV_LIST:
		jbuf_puts(b, v.l->tuple ? "(" : "[");
		for (size_t i = 0; i < v.l->n; i++) {
			if (i)
				jbuf_puts(b, ", ");
			jv_repr(b, v.l->v[i]);
		}
		jbuf_puts(b, !v.l->tuple ? "]" : v.l->n == 1 ? ",)" : ")");
		return;
	case JV_DICT:
		if (v.d->ns) {
			jbuf_puts(b, "<Namespace ");
		}
		jbuf_puts(b, v.d->ns ? "" : "{");
		for (size_t i = 0; i < v.d->n; i++) {
			if (i)
				jbuf_puts(b, ", ");
			if (v.d->ns) {
				jbuf_put(b, v.d->keys[i].p, v.d->keys[i].n);
				jbuf_puts(b, "=");
			} else {
				jv_str_repr(b, v.d->keys[i]);
				jbuf_puts(b, ": ");
			}
			jv_repr(b, v.d->vals[i]);
		}
		jbuf_puts(b, v.d->ns ? ">" : "}");
		return;
	default: jv_to_str(b, v); return;
	}
}

void jv_to_str(struct jbuf *b, struct jv v)
{
	char num[32];
	switch (v.k) {
	case JV_UNDEF: return;
	case JV_NONE: jbuf_puts(b, "None"); return;
	case JV_BOOL: jbuf_puts(b, v.b ? "True" : "False"); return;
	case JV_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v.i);
		jbuf_puts(b, num);
		return;
	case JV_FLOAT: jv_float_repr(b, v.f, false); return;
	case JV_STR: jbuf_put(b, v.s.p, v.s.n); return;
	case JV_MACRO: jbuf_puts(b, "<macro>"); return;
	case JV_FUNC: jbuf_puts(b, "<function>"); return;
	default: jv_repr(b, v); return;
	}
}

static void jv_json_str(struct jbuf *b, struct jstr s)
{
	jbuf_puts(b, "\"");
	size_t run = 0;
	for (size_t i = 0; i < s.n; i++) {
		unsigned char c = (unsigned char)s.p[i];
		const char *esc = NULL;
		char u[8];
		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		default:
			if (c < 0x20) {
				snprintf(u, sizeof(u), "\\u%04x", c);
				esc = u;
			}
		}
		if (esc) {
			jbuf_put(b, s.p + run, i - run);
			jbuf_puts(b, esc);
			run = i + 1;
		}
	}
	jbuf_put(b, s.p + run, s.n - run);
	jbuf_puts(b, "\"");
}

static void jv_json_indent(struct jbuf *b, int indent, int level)
{
	jbuf_puts(b, "\n");
	for (int k = 0; k < indent * level; k++)
		jbuf_puts(b, " ");
}

bool jv_to_json(struct jbuf *b, struct jv v, int indent, int level)
{
	if (level > JINJA_MAX_DEPTH)
		return false;
	switch (v.k) {
	case JV_NONE: jbuf_puts(b, "null"); return true;
	case JV_BOOL: jbuf_puts(b, v.b ? "true" : "false"); return true;
	case JV_INT:
	case JV_FLOAT: {
		if (v.k == JV_FLOAT)
			jv_float_repr(b, v.f, true);
		else
			jv_to_str(b, v);
		return true;
	}
	case JV_STR: jv_json_str(b, v.s); return true;
	case JV_LIST:
	case JV_DICT: {
		bool list = v.k == JV_LIST;
		size_t n = list ? v.l->n : v.d->n;
		jbuf_puts(b, list ? "[" : "{");
		for (size_t i = 0; i < n; i++) {
			if (i)
				jbuf_puts(b, indent >= 0 ? "," : ", ");
			if (indent >= 0)
				jv_json_indent(b, indent, level + 1);
			if (!list) {
				jv_json_str(b, v.d->keys[i]);
				jbuf_puts(b, ": ");
			}
			if (!jv_to_json(b, list ? v.l->v[i] : v.d->vals[i], indent, level + 1))
				return false;
		}
		if (indent >= 0 && n)
			jv_json_indent(b, indent, level);
		jbuf_puts(b, list ? "]" : "}");
		return true;
	}
	default: return false;
	}
}
