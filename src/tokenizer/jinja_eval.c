/*
 * jinja_eval.c - running a parsed template: scopes, expressions, statements, macro calls, and
 * jinja_render().
 *
 * Semantics follow Jinja2 with Python values: `and`/`or` return an operand, `+` adds numbers and
 * joins strings or lists, `~` joins str() of both sides, `in` is substring/membership/key.
 * Undefined (a missing variable, key or attribute) prints as nothing, is false, iterates as
 * empty and has length 0; reading an attribute or item of it, or computing with it, is an error,
 * as with Jinja's default Undefined. A for loop has its own scope (sets inside do not leak);
 * if blocks do not. Macros see the template's top-level variables and their arguments.
 * Invariant: every evaluation step is counted and bounded; errors carry the template line.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok.h"
#include "util/err.h"

struct jscope {
	struct jstr *names;
	struct jv *vals;
	size_t n, cap;
	struct jscope *parent;
};

struct jctx {
	struct jarena *ar;
	struct jbuf *out;
	struct jscope *scope, *root;
	long steps;
	int depth;
	int flow; /* 1: break, 2: continue */
	struct toast_error *err;
	bool failed;
};

bool jctx_fail(struct jctx *c, int line, const char *fmt, ...)
{
	if (!c->failed) {
		char msg[400];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		toast_err_set(c->err, TOAST_ERR_INVALID, "chat template line %d: %s", line, msg);
		c->failed = true;
	}
	return false;
}

struct jarena *jctx_arena(struct jctx *c)
{
	return c->ar;
}

static bool nomem(struct jctx *c, int line)
{
	return jctx_fail(c, line, "out of memory (the template is limited to %zu MiB)", JINJA_MAX_BYTES >> 20);
}

static bool scope_set(struct jctx *c, struct jscope *s, struct jstr name, struct jv v)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->names[i].n == name.n && memcmp(s->names[i].p, name.p, name.n) == 0) {
			s->vals[i] = v;
			return true;
		}
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		struct jstr *nn = jarena_alloc(c->ar, cap * sizeof(*nn));
		struct jv *nv = jarena_alloc(c->ar, cap * sizeof(*nv));
		if (!nn || !nv)
			return false;
		if (s->n) {
			memcpy(nn, s->names, s->n * sizeof(*nn));
			memcpy(nv, s->vals, s->n * sizeof(*nv));
		}
		s->names = nn;
		s->vals = nv;
		s->cap = cap;
	}
	s->names[s->n] = name;
	s->vals[s->n++] = v;
	return true;
}

static struct jv scope_get(struct jctx *c, struct jstr name)
{
	for (struct jscope *s = c->scope; s; s = s->parent)
		for (size_t i = s->n; i-- > 0;)
			if (s->names[i].n == name.n && memcmp(s->names[i].p, name.p, name.n) == 0)
				return s->vals[i];
	struct jv g;
	return jinja_global(name, &g) ? g : jv_undef;
}

static bool ev(struct jctx *c, const struct jnode *n, struct jv *out);
static bool exec_body(struct jctx *c, struct jnode *const *body, int n);

static bool tick(struct jctx *c, int line)
{
	if (c->failed)
		return false;
	if (++c->steps > JINJA_MAX_STEPS)
		return jctx_fail(c, line, "the template runs too long (over %ld steps)", JINJA_MAX_STEPS);
	return true;
}

/* ---- helpers ---- */

/* Byte offsets of the code points of s (n_cp + 1 entries), in the arena. */
static size_t *str_cps(struct jctx *c, struct jstr s, size_t *n_cp)
{
	size_t *off = jarena_alloc(c->ar, (s.n + 1) * sizeof(size_t)), k = 0;
	if (!off)
		return NULL;
	for (size_t i = 0; i < s.n;) {
		int l;
		toast_utf8_next(s.p + i, s.n - i, &l);
		off[k++] = i;
		i += (size_t)l;
	}
	off[k] = s.n;
	*n_cp = k;
	return off;
}

static bool get_item(struct jctx *c, int line, struct jv obj, struct jv ix, struct jv *out)
{
	*out = jv_undef;
	if (obj.k == JV_UNDEF)
		return jctx_fail(c, line, "cannot index an undefined value");
	if (obj.k == JV_DICT) {
		if (ix.k == JV_STR) {
			struct jv *v = jdict_get(obj.d, ix.s.p, ix.s.n);
			if (v)
				*out = *v;
		}
		return true;
	}
	if ((obj.k == JV_LIST || obj.k == JV_STR) && (ix.k == JV_INT || ix.k == JV_BOOL)) {
		int64_t i = ix.k == JV_INT ? ix.i : ix.b;
		if (obj.k == JV_LIST) {
			int64_t n = (int64_t)obj.l->n;
			if (i < 0)
				i += n;
			if (i >= 0 && i < n)
				*out = obj.l->v[i];
			return true;
		}
		size_t n_cp, *off = str_cps(c, obj.s, &n_cp);
		if (!off)
			return nomem(c, line);
		if (i < 0)
			i += (int64_t)n_cp;
		if (i >= 0 && i < (int64_t)n_cp)
			*out = jv_strv((struct jstr){obj.s.p + off[i], off[i + 1] - off[i]});
		return true;
	}
	return true; /* anything else: undefined, as the sandbox gives */
}

static bool slice_bound(struct jctx *c, int line, const struct jnode *n, struct jv *v)
{
	*v = jv_none;
	if (!n)
		return true;
	if (!ev(c, n, v))
		return false;
	if (v->k != JV_INT && v->k != JV_NONE)
		return jctx_fail(c, line, "slice indices must be integers or none");
	return true;
}

static bool get_slice(struct jctx *c, const struct jnode *n, struct jv obj, struct jv *out)
{
	struct jv a, b, st;
	if (!slice_bound(c, n->line, n->b, &a) || !slice_bound(c, n->line, n->c, &b) || !slice_bound(c, n->line, n->d, &st))
		return false;
	if (obj.k != JV_LIST && obj.k != JV_STR)
		return jctx_fail(c, n->line, "cannot slice a %s", jv_kind_name(obj));
	size_t n_cp = 0, *off = NULL;
	if (obj.k == JV_STR && !(off = str_cps(c, obj.s, &n_cp)))
		return nomem(c, n->line);
	int64_t len = obj.k == JV_LIST ? (int64_t)obj.l->n : (int64_t)n_cp;
	int64_t step = st.k == JV_INT ? st.i : 1;
	if (step == 0)
		return jctx_fail(c, n->line, "slice step cannot be zero");
	/* Python's slice.indices() */
	int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
	int64_t start = a.k == JV_INT ? a.i : (step < 0 ? hi : lo), stop = b.k == JV_INT ? b.i : (step < 0 ? lo : hi);
	if (a.k == JV_INT) {
		if (start < 0)
			start = start + len < lo ? lo : start + len;
		else if (start > hi)
			start = hi;
	}
	if (b.k == JV_INT) {
		if (stop < 0)
			stop = stop + len < lo ? lo : stop + len;
		else if (stop > hi)
			stop = hi;
	}
	struct jlist *l = obj.k == JV_LIST ? jlist_new(c->ar, 0) : NULL;
	if (obj.k == JV_LIST && !l)
		return nomem(c, n->line);
	struct jbuf sb = {.ar = c->ar};
	for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
		if (l && !jlist_push(c->ar, l, obj.l->v[i]))
			return nomem(c, n->line);
		if (!l)
			jbuf_put(&sb, obj.s.p + off[i], off[i + 1] - off[i]);
	}
	if (obj.k == JV_LIST) {
		if (!l)
			return nomem(c, n->line);
		out->k = JV_LIST;
		out->l = l;
		return true;
	}
	struct jstr s = jstr_dup(c->ar, sb.p ? sb.p : "", sb.n);
	free(sb.p);
	if (sb.failed || !s.p)
		return nomem(c, n->line);
	*out = jv_strv(s);
	return true;
}

static bool num(struct jv v, double *d, bool *is_int, int64_t *i)
{
	*is_int = v.k == JV_INT || v.k == JV_BOOL;
	*i = v.k == JV_INT ? v.i : v.k == JV_BOOL ? v.b : 0;
	*d = v.k == JV_FLOAT ? v.f : (double)*i;
	return v.k == JV_INT || v.k == JV_BOOL || v.k == JV_FLOAT;
}

static bool concat_str(struct jctx *c, int line, struct jv a, struct jv b, struct jv *out)
{
	struct jbuf sb = {.ar = c->ar};
	jv_to_str(&sb, a);
	jv_to_str(&sb, b);
	struct jstr s = jstr_dup(c->ar, sb.p ? sb.p : "", sb.n);
	free(sb.p);
	if (sb.failed || !s.p)
		return nomem(c, line);
	*out = jv_strv(s);
	return true;
}

static bool repeat(struct jctx *c, int line, struct jv seq, int64_t k, struct jv *out)
{
	if (k < 0 || (seq.k == JV_STR ? seq.s.n == 0 : seq.l->n == 0))
		k = 0; /* (an empty sequence repeated 2^63 times looped that often) */
	if (seq.k == JV_STR) {
		if (seq.s.n && (uint64_t)k > JINJA_MAX_BYTES / seq.s.n)
			return nomem(c, line);
		char *p = jarena_alloc(c->ar, seq.s.n * (size_t)k + 1);
		if (!p)
			return nomem(c, line);
		for (int64_t i = 0; i < k; i++)
			memcpy(p + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
		*out = jv_strv((struct jstr){p, seq.s.n * (size_t)k});
		return true;
	}
	struct jlist *l = jlist_new(c->ar, 0);
	for (int64_t i = 0; l && i < k; i++)
		for (size_t j = 0; j < seq.l->n; j++)
			if (!jlist_push(c->ar, l, seq.l->v[j]))
				return nomem(c, line);
	if (!l)
		return nomem(c, line);
	out->k = JV_LIST;
	out->l = l;
	return true;
}

static bool contains(struct jctx *c, int line, struct jv item, struct jv seq, bool *out)
{
	*out = false;
	switch (seq.k) {
	case JV_UNDEF: return true;
	case JV_STR:
		if (item.k != JV_STR)
			return jctx_fail(c, line, "'in <string>' requires a string on the left, not %s", jv_kind_name(item));
		if (item.s.n == 0) {
			*out = true;
			return true;
		}
		for (size_t i = 0; i + item.s.n <= seq.s.n && !*out; i++)
			*out = memcmp(seq.s.p + i, item.s.p, item.s.n) == 0;
		return true;
	case JV_LIST:
		for (size_t i = 0; i < seq.l->n && !*out; i++)
			*out = jv_equal(item, seq.l->v[i]);
		return true;
	case JV_DICT:
		*out = item.k == JV_STR && jdict_get(seq.d, item.s.p, item.s.n) != NULL;
		return true;
	default: return jctx_fail(c, line, "argument of type '%s' is not iterable", jv_kind_name(seq));
	}
}

static bool binop(struct jctx *c, int line, int op, struct jv a, struct jv b, struct jv *out)
{
	double x, y;
	bool xi, yi;
	int64_t ia, ib;
	bool r;
	switch (op) {
	case JOP_EQ: *out = jv_bool(jv_equal(a, b)); return true;
	case JOP_NE: *out = jv_bool(!jv_equal(a, b)); return true;
	case JOP_CONCAT: return concat_str(c, line, a, b, out);
	case JOP_IN:
	case JOP_NOTIN:
		if (!contains(c, line, a, b, &r))
			return false;
		*out = jv_bool(op == JOP_IN ? r : !r);
		return true;
	default: break;
	}
	if (a.k == JV_UNDEF || b.k == JV_UNDEF)
		return jctx_fail(c, line, "an undefined value in an operation");
	bool na = num(a, &x, &xi, &ia), nb = num(b, &y, &yi, &ib);
	if (op >= JOP_LT && op <= JOP_GE) {
		int cmp;
		if (na && nb)
			cmp = x < y ? -1 : x > y;
		else if (a.k == JV_STR && b.k == JV_STR) {
			cmp = memcmp(a.s.p, b.s.p, a.s.n < b.s.n ? a.s.n : b.s.n);
			if (cmp == 0)
				cmp = a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
		} else
			return jctx_fail(c, line, "cannot compare %s and %s", jv_kind_name(a), jv_kind_name(b));
		*out = jv_bool(op == JOP_LT ? cmp < 0 : op == JOP_GT ? cmp > 0 : op == JOP_LE ? cmp <= 0 : cmp >= 0);
		return true;
	}
	if (op == JOP_ADD && a.k == JV_STR && b.k == JV_STR)
		return concat_str(c, line, a, b, out);
	if (op == JOP_ADD && a.k == JV_LIST && b.k == JV_LIST) {
		struct jlist *l = jlist_new(c->ar, a.l->n + b.l->n);
		if (!l)
			return nomem(c, line);
		for (size_t i = 0; i < a.l->n; i++)
			jlist_push(c->ar, l, a.l->v[i]);
		for (size_t i = 0; i < b.l->n; i++)
			jlist_push(c->ar, l, b.l->v[i]);
		out->k = JV_LIST;
		out->l = l;
		return true;
	}
	if (op == JOP_MUL && (a.k == JV_STR || a.k == JV_LIST) && nb && yi)
		return repeat(c, line, a, ib, out);
	if (op == JOP_MUL && (b.k == JV_STR || b.k == JV_LIST) && na && xi)
		return repeat(c, line, b, ia, out);
	if (!na || !nb)
		return jctx_fail(c, line, "unsupported operand types: %s and %s", jv_kind_name(a), jv_kind_name(b));
	bool ints = xi && yi;
	switch (op) {
	case JOP_ADD:
		if (ints && !__builtin_add_overflow(ia, ib, &out->i))
			return out->k = JV_INT, true;
		*out = jv_float(x + y);
		return true;
	case JOP_SUB:
		if (ints && !__builtin_sub_overflow(ia, ib, &out->i))
			return out->k = JV_INT, true;
		*out = jv_float(x - y);
		return true;
	case JOP_MUL:
		if (ints && !__builtin_mul_overflow(ia, ib, &out->i))
			return out->k = JV_INT, true;
		*out = jv_float(x * y);
		return true;
	case JOP_DIV:
		if (y == 0)
			return jctx_fail(c, line, "division by zero");
		*out = jv_float(x / y);
		return true;
	case JOP_FLOORDIV:
	case JOP_MOD:
		if (y == 0)
			return jctx_fail(c, line, "division by zero");
		if (ints && !(ia == INT64_MIN && ib == -1)) {
			int64_t q = ia / ib, m = ia % ib;
			if (m != 0 && ((m < 0) != (ib < 0))) { /* Python floors */
				q--;
				m += ib;
			}
			*out = jv_int(op == JOP_MOD ? m : q);
		} else {
			double q = floor(x / y);
			*out = jv_float(op == JOP_MOD ? x - q * y : q);
		}
		return true;
	case JOP_POW:
		if (ints && ib >= 0) {
			/* by squaring: a multiplication per exponent bit (one per unit of the exponent took
			 * 2^63 steps for a base of 0, 1 or -1; found by fuzzing). A square that overflows
			 * means the result does: some later bit multiplies it (or a higher power) in. */
			int64_t r2 = 1, b = ia;
			for (int64_t e = ib; e > 0; e >>= 1) {
				if ((e & 1) && __builtin_mul_overflow(r2, b, &r2))
					return jctx_fail(c, line, "integer overflow");
				if (e > 1 && __builtin_mul_overflow(b, b, &b))
					return jctx_fail(c, line, "integer overflow");
			}
			*out = jv_int(r2);
		} else {
			*out = jv_float(pow(x, y));
		}
		return true;
	default: return jctx_fail(c, line, "bad operator");
	}
}

/* Evaluate positional and keyword arguments of a call/filter/test node. */
static bool ev_args(struct jctx *c, const struct jnode *n, struct jcall *a)
{
	a->line = n->line;
	a->n_args = n->n_args;
	a->n_kw = n->n_kw;
	a->kw = n->kw;
	a->args = jarena_alloc(c->ar, (size_t)(n->n_args + n->n_kw + 1) * sizeof(struct jv));
	if (!a->args)
		return nomem(c, n->line);
	a->kwv = a->args + n->n_args;
	for (int i = 0; i < n->n_args; i++)
		if (!ev(c, n->args[i], &a->args[i]))
			return false;
	for (int i = 0; i < n->n_kw; i++)
		if (!ev(c, n->kwv[i], &a->kwv[i]))
			return false;
	return true;
}

static bool ev_call(struct jctx *c, const struct jnode *n, struct jv *out)
{
	struct jcall a;
	if (n->a->k == JN_ATTR) { /* a method: obj.name(...) */
		struct jv obj;
		if (!ev(c, n->a->a, &obj))
			return false;
		if (obj.k == JV_UNDEF)
			return jctx_fail(c, n->line, "'%.*s' of an undefined value", (int)n->a->name.n, n->a->name.p);
		bool found;
		if (!ev_args(c, n, &a) || !jinja_method(c, obj, n->a->name, &a, out, &found))
			return false;
		if (found)
			return true;
	}
	struct jv fn;
	if (!ev(c, n->a, &fn) || !ev_args(c, n, &a))
		return false;
	if (fn.k == JV_UNDEF)
		return jctx_fail(c, n->line, "call of an undefined function");
	return jctx_call(c, n->line, fn, a.args, a.n_args, a.kw, a.kwv, a.n_kw, out);
}

static bool ev(struct jctx *c, const struct jnode *n, struct jv *out)
{
	if (!tick(c, n->line))
		return false;
	struct jv a, b;
	struct jcall ca;
	switch (n->k) {
	case JN_LIT: *out = n->lit; return true;
	case JN_NAME: *out = scope_get(c, n->name); return true;
	case JN_ATTR:
		if (!ev(c, n->a, &a))
			return false;
		if (a.k == JV_UNDEF)
			return jctx_fail(c, n->line, "'%.*s' of an undefined value", (int)n->name.n, n->name.p);
		*out = jv_undef;
		if (a.k == JV_DICT) {
			struct jv *v = jdict_get(a.d, n->name.p, n->name.n);
			if (v)
				*out = *v;
		}
		return true;
	case JN_ITEM: return ev(c, n->a, &a) && ev(c, n->b, &b) && get_item(c, n->line, a, b, out);
	case JN_SLICE: return ev(c, n->a, &a) && get_slice(c, n, a, out);
	case JN_CALL: return ev_call(c, n, out);
	case JN_FILTER: return ev(c, n->a, &a) && ev_args(c, n, &ca) && jinja_filter(c, n->name, a, &ca, out);
	case JN_TEST: {
		bool r;
		if (!ev(c, n->a, &a) || !ev_args(c, n, &ca) || !jinja_test(c, n->name, a, &ca, &r))
			return false;
		*out = jv_bool(n->op ? !r : r);
		return true;
	}
	case JN_NOT:
		if (!ev(c, n->a, &a))
			return false;
		*out = jv_bool(!jv_truthy(a));
		return true;
	case JN_NEG:
	case JN_POS:
		if (!ev(c, n->a, &a))
			return false;
		if (a.k == JV_INT)
			*out = jv_int(n->k == JN_NEG ? -a.i : a.i);
		else if (a.k == JV_FLOAT)
			*out = jv_float(n->k == JN_NEG ? -a.f : a.f);
		else if (a.k == JV_BOOL)
			*out = jv_int(n->k == JN_NEG ? -(int64_t)a.b : a.b);
		else
			return jctx_fail(c, n->line, "bad operand type for unary %c: %s", n->k == JN_NEG ? '-' : '+', jv_kind_name(a));
		return true;
	case JN_BIN: return ev(c, n->a, &a) && ev(c, n->b, &b) && binop(c, n->line, n->op, a, b, out);
	case JN_AND:
	case JN_OR:
		if (!ev(c, n->a, &a))
			return false;
		if (jv_truthy(a) == (n->k == JN_OR)) {
			*out = a;
			return true;
		}
		return ev(c, n->b, out);
	case JN_COND:
		if (!ev(c, n->b, &b))
			return false;
		if (jv_truthy(b))
			return ev(c, n->a, out);
		if (n->c)
			return ev(c, n->c, out);
		*out = jv_undef;
		return true;
	case JN_LIST:
	case JN_TUPLE: {
		struct jlist *l = jlist_new(c->ar, (size_t)n->n_args);
		if (!l)
			return nomem(c, n->line);
		for (int i = 0; i < n->n_args; i++) {
			if (!ev(c, n->args[i], &a))
				return false;
			jlist_push(c->ar, l, a);
		}
		l->tuple = n->k == JN_TUPLE;
		out->k = JV_LIST;
		out->l = l;
		return true;
	}
	case JN_DICT: {
		struct jdict *d = jdict_new(c->ar, (size_t)n->n_args);
		if (!d)
			return nomem(c, n->line);
		for (int i = 0; i < n->n_args; i++) {
			if (!ev(c, n->args[i], &a) || !ev(c, n->kwv[i], &b))
				return false;
			if (a.k != JV_STR)
				return jctx_fail(c, n->line, "dict keys must be strings here");
			if (!jdict_set(c->ar, d, a.s, b))
				return nomem(c, n->line);
		}
		out->k = JV_DICT;
		out->d = d;
		return true;
	}
	default: return jctx_fail(c, n->line, "not an expression");
	}
}

/* ---- calls ---- */

static bool call_macro(struct jctx *c, int line, const struct jnode *m, struct jv *args, int n_args, struct jstr *kw,
		       struct jv *kwv, int n_kw, struct jv *out)
{
	if (n_args > m->n_kw)
		return jctx_fail(c, line, "macro '%.*s' takes %d arguments, %d given", (int)m->name.n, m->name.p, m->n_kw,
				 n_args);
	if (c->depth >= JINJA_MAX_DEPTH)
		return jctx_fail(c, line, "macro calls nested too deeply");
	struct jscope sc = {.parent = c->root}, *saved_scope = c->scope;
	struct jbuf buf = {.ar = c->ar}, *saved_out = c->out;
	c->scope = &sc;
	bool ok = true;
	for (int p = 0; p < m->n_kw && ok; p++) {
		struct jv v = jv_undef;
		bool given = p < n_args;
		if (given)
			v = args[p];
		for (int k = 0; k < n_kw; k++)
			if (kw[k].n == m->kw[p].n && memcmp(kw[k].p, m->kw[p].p, kw[k].n) == 0) {
				v = kwv[k];
				given = true;
			}
		if (!given && m->kwv[p])
			ok = ev(c, m->kwv[p], &v);
		ok = ok && scope_set(c, &sc, m->kw[p], v);
	}
	for (int k = 0; k < n_kw && ok; k++) {
		bool known = false;
		for (int p = 0; p < m->n_kw; p++)
			known |= kw[k].n == m->kw[p].n && memcmp(kw[k].p, m->kw[p].p, kw[k].n) == 0;
		if (!known)
			ok = jctx_fail(c, line, "macro '%.*s' has no argument '%.*s'", (int)m->name.n, m->name.p, (int)kw[k].n,
				       kw[k].p);
	}
	c->out = &buf;
	c->depth++;
	ok = ok && exec_body(c, m->body, m->n_body);
	c->depth--;
	c->out = saved_out;
	c->scope = saved_scope;
	c->flow = 0;
	struct jstr s = jstr_dup(c->ar, buf.p ? buf.p : "", buf.n);
	free(buf.p);
	if (!ok)
		return false;
	if (buf.failed || !s.p)
		return nomem(c, line);
	*out = jv_strv(s);
	return true;
}

bool jctx_call(struct jctx *c, int line, struct jv fn, struct jv *args, int n_args, struct jstr *kw, struct jv *kwv,
	       int n_kw, struct jv *out)
{
	if (fn.k == JV_MACRO)
		return call_macro(c, line, fn.macro, args, n_args, kw, kwv, n_kw, out);
	if (fn.k == JV_FUNC) {
		struct jcall a = {args, n_args, kw, kwv, n_kw, line};
		return jinja_call_global(c, fn.func, &a, out);
	}
	return jctx_fail(c, line, "a %s is not callable", jv_kind_name(fn));
}

/* ---- statements ---- */

static bool assign(struct jctx *c, const struct jnode *n, struct jv v)
{
	if (n->n_kw == 1)
		return scope_set(c, c->scope, n->kw[0], v) || nomem(c, n->line);
	if (v.k != JV_LIST || (int)v.l->n != n->n_kw)
		return jctx_fail(c, n->line, "cannot unpack a %s into %d variables", jv_kind_name(v), n->n_kw);
	for (int i = 0; i < n->n_kw; i++)
		if (!scope_set(c, c->scope, n->kw[i], v.l->v[i]))
			return nomem(c, n->line);
	return true;
}

static bool exec_for(struct jctx *c, const struct jnode *n)
{
	struct jv it;
	if (!ev(c, n->a, &it))
		return false;
	struct jlist *items = jlist_new(c->ar, 0);
	if (!items)
		return nomem(c, n->line);
	if (it.k == JV_LIST) {
		*items = *it.l;
	} else if (it.k == JV_DICT) { /* iterating a dict gives its keys */
		for (size_t i = 0; i < it.d->n; i++)
			if (!jlist_push(c->ar, items, jv_strv(it.d->keys[i])))
				return nomem(c, n->line);
	} else if (it.k == JV_STR) {
		for (size_t i = 0; i < it.s.n;) {
			int l;
			toast_utf8_next(it.s.p + i, it.s.n - i, &l);
			if (!jlist_push(c->ar, items, jv_strv((struct jstr){it.s.p + i, (size_t)l})))
				return nomem(c, n->line);
			i += (size_t)l;
		}
	} else if (it.k != JV_UNDEF) {
		return jctx_fail(c, n->line, "cannot loop over a %s", jv_kind_name(it));
	}
	struct jscope sc = {.parent = c->scope}, *saved = c->scope;
	c->scope = &sc;
	bool ok = true;
	if (n->b) { /* `for x in y if cond`: the loop only sees the items that pass */
		struct jlist *kept = jlist_new(c->ar, 0);
		for (size_t i = 0; ok && kept && i < items->n; i++) {
			struct jv cond;
			ok = assign(c, n, items->v[i]) && ev(c, n->b, &cond);
			if (ok && jv_truthy(cond))
				ok = jlist_push(c->ar, kept, items->v[i]);
		}
		if (!kept)
			ok = nomem(c, n->line);
		items = kept;
	}
	static const char *keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
				     "previtem", "nextitem", "depth", "depth0"};
	/* one loop object per loop, updated in place each iteration */
	struct jdict *loop = jdict_new(c->ar, 11);
	if (!loop)
		ok = nomem(c, n->line);
	for (size_t i = 0; ok && i < items->n; i++) {
		if (!tick(c, n->line)) {
			ok = false;
			break;
		}
		sc.n = 0; /* what the body sets lasts one iteration */
		int64_t len = (int64_t)items->n, k = (int64_t)i;
		struct jv vals[] = {jv_int(k + 1), jv_int(k), jv_int(len - k), jv_int(len - k - 1), jv_bool(k == 0),
				    jv_bool(k == len - 1), jv_int(len), k > 0 ? items->v[k - 1] : jv_undef,
				    k < len - 1 ? items->v[k + 1] : jv_undef, jv_int(1), jv_int(0)};
		for (int j = 0; j < 11; j++)
			if (i == 0)
				jdict_set(c->ar, loop, (struct jstr){keys[j], strlen(keys[j])}, vals[j]);
			else
				loop->vals[j] = vals[j];
		struct jv lv = {.k = JV_DICT};
		lv.d = loop;
		ok = assign(c, n, items->v[i]) && scope_set(c, &sc, (struct jstr){"loop", 4}, lv) &&
		     exec_body(c, n->body, n->n_body);
		if (c->flow == 1) {
			c->flow = 0;
			break;
		}
		c->flow = 0;
	}
	c->scope = saved;
	if (ok && items->n == 0 && n->n_else)
		ok = exec_body(c, n->else_body, n->n_else);
	return ok;
}

static bool exec_stmt(struct jctx *c, const struct jnode *n)
{
	if (!tick(c, n->line))
		return false;
	struct jv v;
	switch (n->k) {
	case JN_TEXT: jbuf_put(c->out, n->lit.s.p, n->lit.s.n); break;
	case JN_OUT:
		if (!ev(c, n->a, &v))
			return false;
		jv_to_str(c->out, v);
		break;
	case JN_IF:
		if (!ev(c, n->a, &v))
			return false;
		return jv_truthy(v) ? exec_body(c, n->body, n->n_body) : exec_body(c, n->else_body, n->n_else);
	case JN_FOR: return exec_for(c, n);
	case JN_SET:
		if (!ev(c, n->a, &v))
			return false;
		if (n->op) { /* ns.attr = v */
			struct jv ns = scope_get(c, n->name);
			if (ns.k != JV_DICT || !ns.d->ns)
				return jctx_fail(c, n->line, "cannot assign an attribute of a %s (only of a namespace)",
						 jv_kind_name(ns));
			return jdict_set(c->ar, ns.d, n->kw[0], v) || nomem(c, n->line);
		}
		return assign(c, n, v);
	case JN_SETBLOCK: {
		struct jbuf buf = {.ar = c->ar}, *saved = c->out;
		c->out = &buf;
		bool ok = exec_body(c, n->body, n->n_body);
		c->out = saved;
		struct jstr s = jstr_dup(c->ar, buf.p ? buf.p : "", buf.n);
		free(buf.p);
		if (!ok)
			return false;
		if (buf.failed || !s.p)
			return nomem(c, n->line);
		return assign(c, n, jv_strv(s));
	}
	case JN_MACRO:
		v.k = JV_MACRO;
		v.macro = n;
		return scope_set(c, c->scope, n->name, v) || nomem(c, n->line);
	case JN_BREAK: c->flow = 1; break;
	case JN_CONTINUE: c->flow = 2; break;
	case JN_BLOCK: return exec_body(c, n->body, n->n_body);
	default: return jctx_fail(c, n->line, "not a statement");
	}
	if (c->out->failed)
		return nomem(c, n->line);
	return true;
}

static bool exec_body(struct jctx *c, struct jnode *const *body, int n)
{
	for (int i = 0; i < n && !c->flow; i++)
		if (!exec_stmt(c, body[i]))
			return false;
	return true;
}

enum toast_status jinja_render(const struct jinja_template *t, json_t *ctx, char **out, size_t *len,
			       struct toast_error *err)
{
	*out = NULL;
	*len = 0;
	struct jarena ar = {.limit = JINJA_MAX_BYTES};
	struct jbuf buf = {.ar = &ar};
	struct jscope root = {0};
	struct jctx c = {.ar = &ar, .out = &buf, .scope = &root, .root = &root, .err = err};
	const char *k;
	json_t *v;
	bool ok = true;
	json_object_foreach(ctx, k, v) ok = ok && scope_set(&c, &root, jstr_dup(&ar, k, strlen(k)), jv_from_json(&ar, v));
	if (!ok)
		nomem(&c, 0);
	ok = ok && exec_body(&c, t->root->body, t->root->n_body);
	if (ok && buf.failed) {
		free(buf.p);
		jarena_free(&ar);
		return toast_err_set(err, TOAST_ERR_NOMEM, "chat template output is too large");
	}
	if (ok && ar.failed) /* an allocation failed that the code asking for it got past */
		ok = nomem(&c, 0);
	jarena_free(&ar);
	if (!ok) {
		free(buf.p);
		return err ? err->code : TOAST_ERR_INVALID;
	}
	*out = buf.p ? buf.p : calloc(1, 1);
	*len = buf.n;
	return *out ? TOAST_OK : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
}
