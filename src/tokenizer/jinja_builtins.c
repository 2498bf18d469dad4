/*
 * jinja_builtins.c - the library the chat templates call: filters, tests, str/dict methods and
 * the globals range, namespace, dict, raise_exception and strftime_now.
 *
 * Each behaves as its Jinja2 / Python counterpart does for the values chat templates pass (code
 * point indices for strings, Python's whitespace for strip/split, transformers' tojson). An
 * unknown name is an error naming it, never a silent empty result. Lists and dicts are
 * immutable, as in transformers' ImmutableSandboxedEnvironment.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok.h"

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };

#define JSTR(lit) ((struct jstr){lit, sizeof(lit) - 1})

static bool is(struct jstr s, const char *name)
{
	return s.n == strlen(name) && memcmp(s.p, name, s.n) == 0;
}

static bool ret_str(struct jctx *c, int line, struct jbuf *b, struct jv *out)
{
	struct jstr s = jstr_dup(jctx_arena(c), b->p ? b->p : "", b->n);
	bool failed = b->failed;
	free(b->p);
	if (failed || !s.p)
		return jctx_fail(c, line, "out of memory");
	*out = jv_strv(s);
	return true;
}

static bool ret_list(struct jctx *c, int line, struct jlist *l, struct jv *out)
{
	if (!l)
		return jctx_fail(c, line, "out of memory");
	out->k = JV_LIST;
	out->l = l;
	return true;
}

/* Argument i (positional) or the keyword `name`, else def. */
static struct jv arg(const struct jcall *a, int i, const char *name, struct jv def)
{
	for (int k = 0; name && k < a->n_kw; k++)
		if (is(a->kw[k], name))
			return a->kwv[k];
	return i >= 0 && i < a->n_args ? a->args[i] : def;
}

static bool need_str(struct jctx *c, int line, struct jv v, const char *what)
{
	if (v.k == JV_STR)
		return true;
	return jctx_fail(c, line, "%s needs a string, not %s", what, jv_kind_name(v));
}

static uint32_t cp_at(struct jstr s, size_t i, int *l)
{
	return toast_utf8_next(s.p + i, s.n - i, l);
}

static void put_cp(struct jbuf *b, uint32_t cp)
{
	utf8proc_uint8_t u[4];
	utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, u);
	jbuf_put(b, u, (size_t)n);
}

static size_t cp_count(struct jstr s)
{
	size_t k = 0;
	for (size_t i = 0; i < s.n; i++)
		k += ((unsigned char)s.p[i] & 0xC0) != 0x80;
	return k;
}

/* ---- string operations ---- */

static bool in_chars(struct jstr chars, uint32_t cp)
{
	for (size_t i = 0; i < chars.n;) {
		int l;
		if (cp_at(chars, i, &l) == cp)
			return true;
		i += (size_t)l;
	}
	return false;
}

/* Python's str.strip/lstrip/rstrip (chars: NULL for whitespace). */
static struct jstr str_strip(struct jstr s, const struct jstr *chars, bool left, bool right)
{
	size_t a = 0, b = s.n;
	while (left && a < b) {
		int l;
		uint32_t cp = cp_at(s, a, &l);
		if (chars ? !in_chars(*chars, cp) : !jv_py_space(cp))
			break;
		a += (size_t)l;
	}
	while (right && b > a) {
		size_t k = b - 1;
		while (k > a && ((unsigned char)s.p[k] & 0xC0) == 0x80)
			k--;
		int l;
		uint32_t cp = cp_at(s, k, &l);
		if (chars ? !in_chars(*chars, cp) : !jv_py_space(cp))
			break;
		b = k;
	}
	return (struct jstr){s.p + a, b - a};
}

static bool do_strip(struct jctx *c, int line, struct jv v, struct jv chars, bool left, bool right, struct jv *out)
{
	if (!need_str(c, line, v, "strip"))
		return false;
	if (chars.k != JV_NONE && chars.k != JV_UNDEF && !need_str(c, line, chars, "strip characters"))
		return false;
	*out = jv_strv(str_strip(v.s, chars.k == JV_STR ? &chars.s : NULL, left, right));
	return true;
}

static bool do_split(struct jctx *c, int line, struct jv v, struct jv sep, struct jv maxv, bool from_right,
		     struct jv *out)
{
	if (!need_str(c, line, v, "split"))
		return false;
	int64_t max = maxv.k == JV_INT ? maxv.i : -1;
	struct jarena *ar = jctx_arena(c);
	struct jlist *l = jlist_new(ar, 0);
	if (!l)
		return ret_list(c, line, l, out);
	struct jstr s = v.s;
	if (sep.k == JV_STR) {
		if (sep.s.n == 0)
			return jctx_fail(c, line, "empty separator");
		/* collect all cut points, then keep max of them from the chosen side */
		size_t *cuts = jarena_alloc(ar, (s.n / sep.s.n + 2) * sizeof(size_t)), nc = 0;
		if (!cuts)
			return jctx_fail(c, line, "out of memory");
		for (size_t i = 0; i + sep.s.n <= s.n;) {
			if (memcmp(s.p + i, sep.s.p, sep.s.n) == 0) {
				cuts[nc++] = i;
				i += sep.s.n;
			} else {
				i++;
			}
		}
		size_t first = 0, last = nc;
		if (max >= 0 && (size_t)max < nc) {
			if (from_right)
				first = nc - (size_t)max;
			else
				last = (size_t)max;
		}
		size_t from = 0;
		for (size_t k = first; k < last; k++) {
			jlist_push(ar, l, jv_strv((struct jstr){s.p + from, cuts[k] - from}));
			from = cuts[k] + sep.s.n;
		}
		jlist_push(ar, l, jv_strv((struct jstr){s.p + from, s.n - from}));
		return ret_list(c, line, l, out);
	}
	/* whitespace split: runs of whitespace separate, empty strings dropped */
	if (from_right && max >= 0)
		return jctx_fail(c, line, "rsplit() with maxsplit on whitespace is not supported");
	size_t i = 0;
	int64_t done = 0;
	while (i < s.n) {
		int len;
		while (i < s.n && jv_py_space(cp_at(s, i, &len)))
			i += (size_t)len;
		if (i >= s.n)
			break;
		size_t st = i;
		if (max >= 0 && done == max) {
			struct jstr rest = str_strip((struct jstr){s.p + st, s.n - st}, NULL, false, true);
			jlist_push(ar, l, jv_strv(rest));
			break;
		}
		while (i < s.n && !jv_py_space(cp_at(s, i, &len)))
			i += (size_t)len;
		jlist_push(ar, l, jv_strv((struct jstr){s.p + st, i - st}));
		done++;
	}
	return ret_list(c, line, l, out);
}

static bool do_case(struct jctx *c, int line, struct jv v, int mode, struct jv *out)
{
	/* mode 0 upper, 1 lower, 2 capitalize, 3 title */
	if (!need_str(c, line, v, "a case conversion"))
		return false;
	struct jbuf b = {.ar = jctx_arena(c)};
	bool prev_cased = false, first = true;
	for (size_t i = 0; i < v.s.n;) {
		int l;
		uint32_t cp = cp_at(v.s, i, &l);
		bool up = mode == 0 || (mode == 2 && first) || (mode == 3 && !prev_cased);
		utf8proc_int32_t r = up ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp);
		put_cp(&b, (uint32_t)r);
		utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
		prev_cased = k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
		first = false;
		i += (size_t)l;
	}
	return ret_str(c, line, &b, out);
}

static bool do_replace(struct jctx *c, int line, struct jv v, struct jv old, struct jv new, struct jv count,
		       struct jv *out)
{
	if (!need_str(c, line, v, "replace") || !need_str(c, line, old, "replace") || !need_str(c, line, new, "replace"))
		return false;
	int64_t max = count.k == JV_INT ? count.i : -1, done = 0;
	struct jbuf b = {.ar = jctx_arena(c)};
	size_t i = 0;
	while (i <= v.s.n) {
		if ((max < 0 || done < max) && i + old.s.n <= v.s.n && memcmp(v.s.p + i, old.s.p, old.s.n) == 0) {
			jbuf_put(&b, new.s.p, new.s.n);
			done++;
			if (old.s.n) {
				i += old.s.n;
				continue;
			}
		}
		if (i == v.s.n)
			break;
		int l;
		cp_at(v.s, i, &l);
		jbuf_put(&b, v.s.p + i, (size_t)l);
		i += (size_t)l;
	}
	return ret_str(c, line, &b, out);
}

static bool do_join(struct jctx *c, int line, struct jv v, struct jv sep, struct jv attr, bool strict, struct jv *out)
{
	struct jbuf b = {.ar = jctx_arena(c)};
	if (v.k != JV_LIST)
		return jctx_fail(c, line, "join needs a list, not %s", jv_kind_name(v));
	for (size_t i = 0; i < v.l->n; i++) {
		struct jv x = v.l->v[i];
		if (attr.k == JV_STR && x.k == JV_DICT) {
			struct jv *a = jdict_get(x.d, attr.s.p, attr.s.n);
			x = a ? *a : jv_undef;
		}
		if (strict && x.k != JV_STR) {
			free(b.p);
			return jctx_fail(c, line, "str.join: item %zu is a %s, not a string", i, jv_kind_name(x));
		}
		if (i && sep.k == JV_STR)
			jbuf_put(&b, sep.s.p, sep.s.n);
		jv_to_str(&b, x);
	}
	return ret_str(c, line, &b, out);
}

static bool do_find(struct jctx *c, int line, struct jv v, struct jv sub, bool count, struct jv *out)
{
	if (!need_str(c, line, v, "find") || !need_str(c, line, sub, "find"))
		return false;
	int64_t n = 0;
	for (size_t i = 0; i + sub.s.n <= v.s.n; i++) {
		if (memcmp(v.s.p + i, sub.s.p, sub.s.n) == 0) {
			if (!count) {
				*out = jv_int((int64_t)cp_count((struct jstr){v.s.p, i}));
				return true;
			}
			n++;
			i += sub.s.n ? sub.s.n - 1 : 0;
		}
	}
	*out = jv_int(count ? n : -1);
	return true;
}

static bool str_affix(struct jv v, struct jv x, bool end)
{
	if (x.k == JV_LIST) {
		for (size_t i = 0; i < x.l->n; i++)
			if (str_affix(v, x.l->v[i], end))
				return true;
		return false;
	}
	if (x.k != JV_STR || x.s.n > v.s.n)
		return false;
	return memcmp(v.s.p + (end ? v.s.n - x.s.n : 0), x.s.p, x.s.n) == 0;
}

/* ---- filters ---- */

static bool items_of(struct jctx *c, int line, struct jv v, struct jv *out)
{
	struct jarena *ar = jctx_arena(c);
	if (v.k == JV_UNDEF)
		return ret_list(c, line, jlist_new(ar, 0), out);
	if (v.k != JV_DICT)
		return jctx_fail(c, line, "items needs a dict, not %s", jv_kind_name(v));
	struct jlist *l = jlist_new(ar, v.d->n);
	for (size_t i = 0; l && i < v.d->n; i++) {
		struct jlist *pair = jlist_new(ar, 2);
		if (!pair)
			return jctx_fail(c, line, "out of memory");
		pair->tuple = true;
		jlist_push(ar, pair, jv_strv(v.d->keys[i]));
		jlist_push(ar, pair, v.d->vals[i]);
		struct jv pv = {.k = JV_LIST};
		pv.l = pair;
		jlist_push(ar, l, pv);
	}
	return ret_list(c, line, l, out);
}

/* Items of a list (or a dict's keys, a string's characters) for the sequence filters. */
static struct jlist *seq_of(struct jctx *c, struct jv v)
{
	struct jarena *ar = jctx_arena(c);
	struct jlist *l = jlist_new(ar, 0);
	if (!l)
		return NULL;
	if (v.k == JV_LIST) {
		*l = *v.l;
	} else if (v.k == JV_DICT) {
		for (size_t i = 0; i < v.d->n; i++)
			jlist_push(ar, l, jv_strv(v.d->keys[i]));
	} else if (v.k == JV_STR) {
		for (size_t i = 0; i < v.s.n;) {
			int len;
			cp_at(v.s, i, &len);
			jlist_push(ar, l, jv_strv((struct jstr){v.s.p + i, (size_t)len}));
			i += (size_t)len;
		}
	}
	return l;
}

static bool attr_of(struct jv x, struct jv name, struct jv *out)
{
	*out = jv_undef;
	if (x.k == JV_DICT && name.k == JV_STR) {
		struct jv *a = jdict_get(x.d, name.s.p, name.s.n);
		if (a)
			*out = *a;
	}
	return true;
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is `want`. */
static bool do_select(struct jctx *c, const struct jcall *a, struct jv v, bool by_attr, bool want, struct jv *out)
{
	struct jlist *src = seq_of(c, v), *l = jlist_new(jctx_arena(c), 0);
	if (!src || !l)
		return jctx_fail(c, a->line, "out of memory");
	int first = by_attr ? 1 : 0;
	struct jv tname = a->n_args > first ? a->args[first] : jv_undef;
	struct jcall ta = {a->args + first + 1, a->n_args > first + 1 ? a->n_args - first - 1 : 0, NULL, NULL, 0, a->line};
	for (size_t i = 0; i < src->n; i++) {
		struct jv x = src->v[i];
		bool r;
		if (by_attr)
			attr_of(x, a->n_args ? a->args[0] : jv_undef, &x);
		if (tname.k == JV_STR) {
			if (!jinja_test(c, tname.s, x, &ta, &r))
				return false;
		} else {
			r = jv_truthy(x);
		}
		if (r == want && !jlist_push(jctx_arena(c), l, src->v[i]))
			return jctx_fail(c, a->line, "out of memory");
	}
	return ret_list(c, a->line, l, out);
}

static bool do_map(struct jctx *c, const struct jcall *a, struct jv v, struct jv *out)
{
	struct jlist *src = seq_of(c, v), *l = jlist_new(jctx_arena(c), 0);
	if (!src || !l)
		return jctx_fail(c, a->line, "out of memory");
	struct jv attr = arg(a, -1, "attribute", jv_undef), def = arg(a, -1, "default", jv_undef);
	for (size_t i = 0; i < src->n; i++) {
		struct jv x;
		if (attr.k == JV_STR) {
			attr_of(src->v[i], attr, &x);
			if (x.k == JV_UNDEF)
				x = def;
		} else if (a->n_args && a->args[0].k == JV_STR) {
			struct jcall fa = {a->args + 1, a->n_args - 1, a->kw, a->kwv, a->n_kw, a->line};
			if (!jinja_filter(c, a->args[0].s, src->v[i], &fa, &x))
				return false;
		} else {
			return jctx_fail(c, a->line, "map needs a filter name or attribute=");
		}
		if (!jlist_push(jctx_arena(c), l, x))
			return jctx_fail(c, a->line, "out of memory");
	}
	return ret_list(c, a->line, l, out);
}

/* a number was read from s up to end, and only spaces, tabs and newlines follow it */
static bool number_whole(const char *s, const char *end)
{
	if (end == s)
		return false;
	while (*end == ' ' || *end == '\t' || *end == '\n')
		end++;
	return *end == 0;
}

static bool do_indent(struct jctx *c, const struct jcall *a, struct jv v, struct jv *out)
{
	struct jv w = arg(a, 0, "width", jv_int(4)), first = arg(a, 1, "first", jv_bool(false)),
		  blank = arg(a, 2, "blank", jv_bool(false));
	struct jbuf pad = {.ar = jctx_arena(c)}, b = {.ar = jctx_arena(c)};
	if (w.k == JV_STR)
		jbuf_put(&pad, w.s.p, w.s.n);
	else
		for (int64_t i = 0; i < (w.k == JV_INT ? w.i : 4) && i < 1024; i++)
			jbuf_puts(&pad, " ");
	struct jbuf sb = {.ar = jctx_arena(c)};
	jv_to_str(&sb, v);
	size_t start = 0;
	bool first_line = true;
	for (size_t i = 0; i <= sb.n; i++) {
		if (i < sb.n && sb.p[i] != '\n')
			continue;
		bool empty = i == start;
		if (!first_line)
			jbuf_puts(&b, "\n");
		if ((first_line ? jv_truthy(first) : true) && (!empty || jv_truthy(blank)))
			jbuf_put(&b, pad.p, pad.n);
		if (!empty) /* (sb.p is NULL for an empty string) */
			jbuf_put(&b, sb.p + start, i - start);
		start = i + 1;
		first_line = false;
	}
	free(pad.p);
	free(sb.p);
	return ret_str(c, a->line, &b, out);
}

bool jinja_filter(struct jctx *c, struct jstr name, struct jv v, const struct jcall *a, struct jv *out)
{
	int line = a->line;
	struct jarena *ar = jctx_arena(c);
	struct jbuf b = {.ar = ar};
	if (is(name, "length") || is(name, "count")) {
		if (v.k == JV_STR)
			*out = jv_int((int64_t)cp_count(v.s));
		else if (v.k == JV_LIST)
			*out = jv_int((int64_t)v.l->n);
		else if (v.k == JV_DICT)
			*out = jv_int((int64_t)v.d->n);
		else if (v.k == JV_UNDEF)
			*out = jv_int(0);
		else
			return jctx_fail(c, line, "a %s has no length", jv_kind_name(v));
		return true;
	}
	if (is(name, "tojson")) {
		struct jv ind = arg(a, 1, "indent", jv_none), asc = arg(a, 0, "ensure_ascii", jv_bool(false)),
			  sk = arg(a, 4, "sort_keys", jv_bool(false)), sep = arg(a, 3, "separators", jv_none);
		if (jv_truthy(asc) || jv_truthy(sk) || sep.k != JV_NONE)
			return jctx_fail(c, line, "tojson: ensure_ascii, sort_keys and separators are not supported");
		if (!jv_to_json(&b, v, ind.k == JV_INT ? (int)(ind.i > 64 ? 64 : ind.i < 0 ? 0 : ind.i) : -1, 0)) {
			free(b.p);
			return jctx_fail(c, line, "tojson: a %s is not JSON serialisable", jv_kind_name(v));
		}
		return ret_str(c, line, &b, out);
	}
	if (is(name, "trim"))
		return do_strip(c, line, v.k == JV_UNDEF ? jv_strv(JSTR("")) : v, arg(a, 0, "chars", jv_none), true, true, out);
	if (is(name, "upper") || is(name, "lower") || is(name, "capitalize") || is(name, "title"))
		return do_case(c, line, v, is(name, "upper") ? 0 : is(name, "lower") ? 1 : is(name, "capitalize") ? 2 : 3, out);
	if (is(name, "string")) {
		if (v.k == JV_STR) {
			*out = v;
			return true;
		}
		jv_to_str(&b, v);
		return ret_str(c, line, &b, out);
	}
	if (is(name, "safe") || is(name, "e") || is(name, "escape")) {
		if (is(name, "safe")) {
			*out = v;
			return true;
		}
		struct jbuf sb = {.ar = ar};
		jv_to_str(&sb, v);
		for (size_t i = 0; i < sb.n; i++) {
			const char *r = sb.p[i] == '&' ? "&amp;" : sb.p[i] == '<' ? "&lt;" : sb.p[i] == '>' ? "&gt;" :
					sb.p[i] == '"' ? "&#34;" : sb.p[i] == '\'' ? "&#39;" : NULL;
			if (r)
				jbuf_puts(&b, r);
			else
				jbuf_put(&b, sb.p + i, 1);
		}
		free(sb.p);
		return ret_str(c, line, &b, out);
	}
	if (is(name, "int") || is(name, "float")) {
		bool want_int = is(name, "int");
		struct jv def = arg(a, 0, "default", want_int ? jv_int(0) : jv_float(0));
		double d = 0;
		bool ok = true;
		if (v.k == JV_INT || v.k == JV_BOOL)
			d = v.k == JV_INT ? (double)v.i : v.b;
		else if (v.k == JV_FLOAT)
			d = v.f;
		else if (v.k == JV_STR) {
			char tmp[64];
			size_t n = v.s.n < sizeof(tmp) - 1 ? v.s.n : sizeof(tmp) - 1;
			memcpy(tmp, v.s.p, n);
			tmp[n] = 0;
			char *end;
			errno = 0;
			long long i = strtoll(tmp, &end, 10); /* an integer's digits exactly, not through a double */
			if (want_int && errno == 0 && number_whole(tmp, end) && n == v.s.n) {
				*out = jv_int(i);
				return true;
			}
			d = strtod(tmp, &end);
			ok = number_whole(tmp, end) && n == v.s.n;
		} else
			ok = false;
		if (!ok || (want_int && isnan(d))) /* (Python's int() refuses NaN: the default) */
			*out = def;
		else if (want_int && v.k == JV_INT)
			*out = v;
		else if (want_int && !(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
			return jctx_fail(c, line, "int: %g is beyond 64-bit integers", d);
		else
			*out = want_int ? jv_int((int64_t)trunc(d)) : jv_float(d);
		return true;
	}
	if (is(name, "join")) {
		struct jlist *l = v.k == JV_LIST ? v.l : seq_of(c, v);
		if (!l)
			return jctx_fail(c, line, "out of memory");
		return do_join(c, line, (struct jv){.k = JV_LIST, .l = l}, arg(a, 0, "d", jv_strv(JSTR(""))),
			       arg(a, 1, "attribute", jv_none), false, out);
	}
	if (is(name, "first") || is(name, "last")) {
		struct jlist *l = seq_of(c, v);
		*out = l && l->n ? l->v[is(name, "first") ? 0 : l->n - 1] : jv_undef;
		return true;
	}
	if (is(name, "items"))
		return items_of(c, line, v, out);
	if (is(name, "default") || is(name, "d")) {
		struct jv def = arg(a, 0, "default_value", jv_strv(JSTR(""))), boolean = arg(a, 1, "boolean", jv_bool(false));
		*out = v.k == JV_UNDEF || (jv_truthy(boolean) && !jv_truthy(v)) ? def : v;
		return true;
	}
	if (is(name, "list"))
		return ret_list(c, line, seq_of(c, v), out);
	if (is(name, "reverse")) {
		struct jlist *src = seq_of(c, v), *l = src ? jlist_new(ar, src->n) : NULL;
		for (size_t i = 0; l && i < src->n; i++)
			jlist_push(ar, l, src->v[src->n - 1 - i]);
		if (v.k != JV_STR || !l)
			return ret_list(c, line, l, out);
		for (size_t i = 0; i < l->n; i++)
			jbuf_put(&b, l->v[i].s.p, l->v[i].s.n);
		return ret_str(c, line, &b, out);
	}
	if (is(name, "replace"))
		return do_replace(c, line, v, arg(a, 0, "old", jv_undef), arg(a, 1, "new", jv_undef),
				  arg(a, 2, "count", jv_none), out);
	if (is(name, "map"))
		return do_map(c, a, v, out);
	if (is(name, "select") || is(name, "reject"))
		return do_select(c, a, v, false, is(name, "select"), out);
	if (is(name, "selectattr") || is(name, "rejectattr"))
		return do_select(c, a, v, true, is(name, "selectattr"), out);
	if (is(name, "abs")) {
		if (v.k == JV_INT)
			*out = jv_int(v.i < 0 ? -v.i : v.i);
		else if (v.k == JV_FLOAT)
			*out = jv_float(fabs(v.f));
		else
			return jctx_fail(c, line, "abs of a %s", jv_kind_name(v));
		return true;
	}
	if (is(name, "indent"))
		return do_indent(c, a, v, out);
	return jctx_fail(c, line, "unknown filter '%.*s'", (int)name.n, name.p);
}

/* ---- tests ---- */

bool jinja_test(struct jctx *c, struct jstr name, struct jv v, const struct jcall *a, bool *out)
{
	struct jv x = a->n_args ? a->args[0] : jv_undef;
	if (is(name, "defined"))
		*out = v.k != JV_UNDEF;
	else if (is(name, "undefined"))
		*out = v.k == JV_UNDEF;
	else if (is(name, "none"))
		*out = v.k == JV_NONE;
	else if (is(name, "boolean"))
		*out = v.k == JV_BOOL;
	else if (is(name, "true") || is(name, "false"))
		*out = v.k == JV_BOOL && v.b == is(name, "true");
	else if (is(name, "integer"))
		*out = v.k == JV_INT;
	else if (is(name, "float"))
		*out = v.k == JV_FLOAT;
	else if (is(name, "number"))
		*out = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
	else if (is(name, "string"))
		*out = v.k == JV_STR;
	else if (is(name, "mapping"))
		*out = v.k == JV_DICT;
	else if (is(name, "iterable") || is(name, "sequence"))
		*out = v.k == JV_LIST || v.k == JV_DICT || v.k == JV_STR || v.k == JV_UNDEF;
	else if (is(name, "callable"))
		*out = v.k == JV_MACRO || v.k == JV_FUNC;
	else if (is(name, "equalto") || is(name, "eq") || is(name, "==") || is(name, "sameas"))
		*out = jv_equal(v, x);
	else if (is(name, "ne") || is(name, "!="))
		*out = !jv_equal(v, x);
	else if (is(name, "in")) {
		if (x.k == JV_STR && v.k == JV_STR) {
			*out = false;
			for (size_t i = 0; i + v.s.n <= x.s.n && !*out; i++)
				*out = memcmp(x.s.p + i, v.s.p, v.s.n) == 0;
		} else if (x.k == JV_LIST) {
			*out = false;
			for (size_t i = 0; i < x.l->n && !*out; i++)
				*out = jv_equal(v, x.l->v[i]);
		} else if (x.k == JV_DICT) {
			*out = v.k == JV_STR && jdict_get(x.d, v.s.p, v.s.n);
		} else {
			return jctx_fail(c, a->line, "test 'in' needs a string, list or dict");
		}
	} else if (is(name, "odd") || is(name, "even") || is(name, "divisibleby")) {
		if (v.k != JV_INT)
			return jctx_fail(c, a->line, "test '%.*s' needs an integer", (int)name.n, name.p);
		int64_t d = is(name, "divisibleby") ? (x.k == JV_INT ? x.i : 0) : 2;
		if (d == 0)
			return jctx_fail(c, a->line, "divisibleby 0");
		*out = is(name, "odd") ? v.i % 2 != 0 : v.i % d == 0;
	} else if (is(name, "lower") || is(name, "upper")) {
		*out = v.k == JV_STR;
		for (size_t i = 0; *out && i < v.s.n;) {
			int l;
			utf8proc_int32_t cp = (utf8proc_int32_t)cp_at(v.s, i, &l);
			*out = is(name, "lower") ? utf8proc_tolower(cp) == cp : utf8proc_toupper(cp) == cp;
			i += (size_t)l;
		}
	} else if (is(name, "lt") || is(name, "gt") || is(name, "le") || is(name, "ge") || is(name, "<") ||
		   is(name, ">") || is(name, "<=") || is(name, ">=")) {
		double p, q;
		if (!((v.k == JV_INT || v.k == JV_FLOAT) && (x.k == JV_INT || x.k == JV_FLOAT)))
			return jctx_fail(c, a->line, "comparison test needs numbers");
		p = v.k == JV_INT ? (double)v.i : v.f;
		q = x.k == JV_INT ? (double)x.i : x.f;
		*out = (is(name, "lt") || is(name, "<")) ? p < q : (is(name, "gt") || is(name, ">")) ? p > q :
		       (is(name, "le") || is(name, "<=")) ? p <= q : p >= q;
	} else {
		return jctx_fail(c, a->line, "unknown test '%.*s'", (int)name.n, name.p);
	}
	return true;
}

/* ---- methods ---- */

bool jinja_method(struct jctx *c, struct jv v, struct jstr name, const struct jcall *a, struct jv *out, bool *found)
{
	int line = a->line;
	struct jv a0 = a->n_args > 0 ? a->args[0] : jv_none, a1 = a->n_args > 1 ? a->args[1] : jv_none;
	*found = true;
	if (v.k == JV_STR) {
		if (is(name, "startswith") || is(name, "endswith")) {
			*out = jv_bool(str_affix(v, a0, is(name, "endswith")));
			return true;
		}
		if (is(name, "strip") || is(name, "lstrip") || is(name, "rstrip"))
			return do_strip(c, line, v, a0, !is(name, "rstrip"), !is(name, "lstrip"), out);
		if (is(name, "split") || is(name, "rsplit"))
			return do_split(c, line, v, arg(a, 0, "sep", jv_none), arg(a, 1, "maxsplit", jv_int(-1)), is(name, "rsplit"),
					out);
		if (is(name, "upper") || is(name, "lower") || is(name, "capitalize") || is(name, "title"))
			return do_case(c, line, v, is(name, "upper") ? 0 : is(name, "lower") ? 1 : is(name, "capitalize") ? 2 : 3,
				       out);
		if (is(name, "replace"))
			return do_replace(c, line, v, a0, a1, a->n_args > 2 ? a->args[2] : jv_none, out);
		if (is(name, "find") || is(name, "count"))
			return do_find(c, line, v, a0, is(name, "count"), out);
		if (is(name, "join"))
			return do_join(c, line, a0, v, jv_none, true, out);
		if (is(name, "isdigit") || is(name, "isalpha") || is(name, "isspace") || is(name, "isalnum")) {
			bool r = v.s.n > 0;
			for (size_t i = 0; r && i < v.s.n;) {
				int l;
				uint32_t cp = cp_at(v.s, i, &l);
				utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
				bool alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
				bool digit = k == UTF8PROC_CATEGORY_ND;
				r = is(name, "isdigit") ? digit : is(name, "isalpha") ? alpha : is(name, "isspace") ? jv_py_space(cp) :
				    alpha || digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
				i += (size_t)l;
			}
			*out = jv_bool(r);
			return true;
		}
	} else if (v.k == JV_DICT && !v.d->ns) {
		if (is(name, "get")) {
			struct jv *x = a0.k == JV_STR ? jdict_get(v.d, a0.s.p, a0.s.n) : NULL;
			*out = x ? *x : a1;
			return true;
		}
		if (is(name, "items"))
			return items_of(c, line, v, out);
		if (is(name, "keys") || is(name, "values")) {
			struct jlist *l = jlist_new(jctx_arena(c), v.d->n);
			for (size_t i = 0; l && i < v.d->n; i++)
				jlist_push(jctx_arena(c), l, is(name, "keys") ? jv_strv(v.d->keys[i]) : v.d->vals[i]);
			return ret_list(c, line, l, out);
		}
		struct jv *x = jdict_get(v.d, name.p, name.n);
		if (x && (x->k == JV_MACRO || x->k == JV_FUNC)) /* a callable stored in a dict */
			return jctx_call(c, line, *x, a->args, a->n_args, a->kw, a->kwv, a->n_kw, out);
	} else if (v.k == JV_LIST && (is(name, "append") || is(name, "pop") || is(name, "extend") || is(name, "insert"))) {
		return jctx_fail(c, line, "lists cannot be modified in a chat template");
	}
	if (v.k == JV_STR || v.k == JV_LIST || (v.k == JV_DICT && !v.d->ns))
		return jctx_fail(c, line, "%s has no method '%.*s' here", jv_kind_name(v), (int)name.n, name.p);
	*found = false;
	return true;
}

/* ---- globals ---- */

bool jinja_global(struct jstr name, struct jv *out)
{
	static const char *names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};
	for (int i = 0; i < 5; i++)
		if (is(name, names[i])) {
			out->k = JV_FUNC;
			out->func = i;
			return true;
		}
	return false;
}

bool jinja_call_global(struct jctx *c, int func, const struct jcall *a, struct jv *out)
{
	struct jarena *ar = jctx_arena(c);
	switch (func) {
	case G_RANGE: {
		int64_t v[3] = {0, 0, 1};
		if (a->n_args < 1 || a->n_args > 3)
			return jctx_fail(c, a->line, "range takes 1 to 3 arguments");
		for (int i = 0; i < a->n_args; i++) {
			if (a->args[i].k != JV_INT)
				return jctx_fail(c, a->line, "range needs integers");
			v[a->n_args == 1 ? 1 : i] = a->args[i].i;
		}
		if (v[2] == 0)
			return jctx_fail(c, a->line, "range step cannot be zero");
		struct jlist *l = jlist_new(ar, 0);
		for (int64_t i = v[0], k = 0; l && (v[2] > 0 ? i < v[1] : i > v[1]); k++) {
			if (k >= 1000000)
				return jctx_fail(c, a->line, "range over a million items");
			if (!jlist_push(ar, l, jv_int(i)))
				l = NULL;
			if (__builtin_add_overflow(i, v[2], &i)) /* past the 64-bit range: past stop too */
				break;
		}
		return ret_list(c, a->line, l, out);
	}
	case G_NAMESPACE:
	case G_DICT: {
		struct jdict *d = jdict_new(ar, (size_t)a->n_kw);
		if (!d)
			return jctx_fail(c, a->line, "out of memory");
		d->ns = func == G_NAMESPACE;
		if (a->n_args == 1 && a->args[0].k == JV_DICT)
			for (size_t i = 0; i < a->args[0].d->n; i++)
				jdict_set(ar, d, a->args[0].d->keys[i], a->args[0].d->vals[i]);
		for (int i = 0; i < a->n_kw; i++)
			if (!jdict_set(ar, d, a->kw[i], a->kwv[i]))
				return jctx_fail(c, a->line, "out of memory");
		out->k = JV_DICT;
		out->d = d;
		return true;
	}
	case G_RAISE: {
		struct jbuf b = {.ar = ar};
		if (a->n_args)
			jv_to_str(&b, a->args[0]);
		jctx_fail(c, a->line, "raise_exception: %.*s", (int)b.n, b.p ? b.p : "");
		free(b.p);
		return false;
	}
	case G_STRFTIME: {
		if (a->n_args != 1 || a->args[0].k != JV_STR)
			return jctx_fail(c, a->line, "strftime_now needs a format string");
		char fmt[256], res[512];
		size_t n = a->args[0].s.n < sizeof(fmt) - 1 ? a->args[0].s.n : sizeof(fmt) - 1;
		memcpy(fmt, a->args[0].s.p, n);
		fmt[n] = 0;
		time_t now = time(NULL);
		struct tm tm;
		localtime_r(&now, &tm);
		size_t r = strftime(res, sizeof(res), fmt, &tm);
		*out = jv_strv(jstr_dup(ar, res, r));
		return out->s.p != NULL || jctx_fail(c, a->line, "out of memory");
	}
	default: return jctx_fail(c, a->line, "bad function");
	}
}
