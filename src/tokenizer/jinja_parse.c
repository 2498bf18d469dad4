/*
 * jinja_parse.c - tokens -> tree, by recursive descent with Jinja2's operator precedence
 * (condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary, then postfix
 * ., [], () and the filter/test chain |name and `is name`).
 * Statements: if/elif/else, for (with `if` filter and else), set (also ns.attr, tuples and
 * {% set x %}...{% endset %}), macro, break, continue, generation. Anything else is refused
 * with its line. Invariant: nesting depth is bounded (JINJA_MAX_DEPTH).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "util/err.h"

struct parser {
	struct jtok *t;
	int n, i;
	struct jarena *ar;
	struct toast_error *err;
	int depth;
	bool failed;
};

static struct jnode *parse_expr(struct parser *P, bool condexpr);
static struct jnode **parse_body(struct parser *P, const char *const *ends, int *n_out, int *which);

static void *parse_fail(struct parser *P, const char *fmt, ...)
{
	if (!P->failed) {
		char msg[400];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		toast_err_set(P->err, TOAST_ERR_FORMAT, "template line %d: %s", P->t[P->i].line, msg);
		P->failed = true;
	}
	return NULL;
}

static struct jtok *peek(struct parser *P)
{
	return &P->t[P->i];
}

static struct jtok *peek2(struct parser *P)
{
	return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i];
}

static bool tok_is(const struct jtok *t, enum jtok_type type, const char *s)
{
	return t->t == type && (!s || (t->s.n == strlen(s) && memcmp(t->s.p, s, t->s.n) == 0));
}

static bool is_op(struct parser *P, const char *s)
{
	return tok_is(peek(P), JT_OP, s);
}

static bool is_name(struct parser *P, const char *s)
{
	return tok_is(peek(P), JT_NAME, s);
}

static bool accept_op(struct parser *P, const char *s)
{
	if (!is_op(P, s))
		return false;
	P->i++;
	return true;
}

static bool expect_op(struct parser *P, const char *s)
{
	if (accept_op(P, s))
		return true;
	parse_fail(P, "expected '%s'", s);
	return false;
}

static bool expect_end(struct parser *P, enum jtok_type end)
{
	if (peek(P)->t == end) {
		P->i++;
		return true;
	}
	parse_fail(P, "expected the end of the tag");
	return false;
}

static struct jnode *mk(struct parser *P, enum jn_kind k)
{
	struct jnode *n = jarena_alloc(P->ar, sizeof(*n));
	if (!n)
		return parse_fail(P, "out of memory");
	n->k = k;
	n->line = peek(P)->line;
	return n;
}

/* A growable list of nodes (heap), copied into the arena when done. */
struct nlist {
	struct jnode **v;
	struct jstr *names;
	int n, cap;
};

static bool nlist_push(struct nlist *l, struct jnode *x, struct jstr name)
{
	if (l->n == l->cap) {
		int cap = l->cap ? l->cap * 2 : 8;
		struct jnode **v = realloc(l->v, (size_t)cap * sizeof(*v));
		struct jstr *nm = v ? realloc(l->names, (size_t)cap * sizeof(*nm)) : NULL;
		if (v)
			l->v = v;
		if (!nm)
			return false;
		l->names = nm;
		l->cap = cap;
	}
	l->v[l->n] = x;
	l->names[l->n++] = name;
	return true;
}

static struct jnode **nlist_done(struct parser *P, struct nlist *l, struct jstr **names)
{
	struct jnode **v = jarena_alloc(P->ar, (size_t)(l->n + 1) * sizeof(*v));
	struct jstr *nm = names ? jarena_alloc(P->ar, (size_t)(l->n + 1) * sizeof(*nm)) : NULL;
	if (v && l->n)
		memcpy(v, l->v, (size_t)l->n * sizeof(*v));
	if (nm && l->n)
		memcpy(nm, l->names, (size_t)l->n * sizeof(*nm));
	if (names)
		*names = nm;
	free(l->v);
	free(l->names);
	if (!v || (names && !nm))
		return parse_fail(P, "out of memory");
	return v;
}

/* (args, name=value, ...) into n->args / n->kw / n->kwv; the '(' is current. */
static bool parse_call_args(struct parser *P, struct jnode *n)
{
	struct nlist args = {0}, kws = {0};
	P->i++; /* ( */
	while (!P->failed && !is_op(P, ")")) {
		if (peek(P)->t == JT_NAME && tok_is(peek2(P), JT_OP, "=")) {
			struct jstr name = peek(P)->s;
			P->i += 2;
			struct jnode *v = parse_expr(P, true);
			if (!v || !nlist_push(&kws, v, name))
				break;
		} else {
			struct jnode *v = parse_expr(P, true);
			if (!v || !nlist_push(&args, v, (struct jstr){0}))
				break;
		}
		if (!accept_op(P, ","))
			break;
	}
	if (!P->failed)
		expect_op(P, ")");
	n->n_args = args.n;
	n->args = nlist_done(P, &args, NULL);
	n->n_kw = kws.n;
	n->kwv = nlist_done(P, &kws, &n->kw);
	return !P->failed;
}

static struct jnode *parse_primary(struct parser *P)
{
	struct jtok *t = peek(P);
	struct jnode *n;
	if (t->t == JT_NAME) {
		static const struct {
			const char *s;
			int kind, b;
		} lits[] = {{"true", JV_BOOL, 1}, {"True", JV_BOOL, 1}, {"false", JV_BOOL, 0},
			    {"False", JV_BOOL, 0}, {"none", JV_NONE, 0}, {"None", JV_NONE, 0}};
		for (size_t k = 0; k < sizeof(lits) / sizeof(lits[0]); k++)
			if (tok_is(t, JT_NAME, lits[k].s)) {
				if (!(n = mk(P, JN_LIT)))
					return NULL;
				n->lit = lits[k].kind == JV_BOOL ? jv_bool(lits[k].b) : jv_none;
				P->i++;
				return n;
			}
		if (!(n = mk(P, JN_NAME)))
			return NULL;
		n->name = t->s;
		P->i++;
		return n;
	}
	if (t->t == JT_STRING) { /* adjacent literals concatenate */
		if (!(n = mk(P, JN_LIT)))
			return NULL;
		size_t total = 0;
		int j = P->i;
		while (P->t[j].t == JT_STRING)
			total += P->t[j++].s.n;
		char *buf = jarena_alloc(P->ar, total + 1);
		if (!buf)
			return parse_fail(P, "out of memory");
		size_t o = 0;
		for (; P->i < j; P->i++) {
			memcpy(buf + o, P->t[P->i].s.p, P->t[P->i].s.n);
			o += P->t[P->i].s.n;
		}
		n->lit = jv_strv((struct jstr){buf, total});
		return n;
	}
	if (t->t == JT_INT || t->t == JT_FLOAT) {
		if (!(n = mk(P, JN_LIT)))
			return NULL;
		n->lit = t->t == JT_INT ? jv_int(t->i) : jv_float(t->f);
		P->i++;
		return n;
	}
	if (is_op(P, "(")) {
		P->i++;
		if (accept_op(P, ")"))
			return mk(P, JN_TUPLE);
		struct jnode *e = parse_expr(P, true);
		if (!e)
			return NULL;
		if (is_op(P, ",")) {
			struct nlist l = {0};
			nlist_push(&l, e, (struct jstr){0});
			while (accept_op(P, ",") && !is_op(P, ")")) {
				struct jnode *x = parse_expr(P, true);
				if (!x || !nlist_push(&l, x, (struct jstr){0}))
					break;
			}
			if (!(n = mk(P, JN_TUPLE)))
				return NULL;
			n->n_args = l.n;
			n->args = nlist_done(P, &l, NULL);
			e = n;
		}
		return expect_op(P, ")") ? e : NULL;
	}
	if (is_op(P, "[") || is_op(P, "{")) {
		bool dict = is_op(P, "{");
		const char *close = dict ? "}" : "]";
		P->i++;
		struct nlist keys = {0}, vals = {0};
		while (!P->failed && !is_op(P, close)) {
			struct jnode *k = parse_expr(P, true);
			if (!k || !nlist_push(&keys, k, (struct jstr){0}))
				break;
			if (dict) {
				struct jnode *v = expect_op(P, ":") ? parse_expr(P, true) : NULL;
				if (!v || !nlist_push(&vals, v, (struct jstr){0}))
					break;
			}
			if (!accept_op(P, ","))
				break;
		}
		if (!P->failed)
			expect_op(P, close);
		if (!(n = mk(P, dict ? JN_DICT : JN_LIST))) {
			free(keys.v), free(keys.names), free(vals.v), free(vals.names);
			return NULL;
		}
		n->n_args = keys.n;
		n->args = nlist_done(P, &keys, NULL);
		n->n_kw = vals.n;
		n->kwv = nlist_done(P, &vals, NULL);
		return P->failed ? NULL : n;
	}
	return parse_fail(P, "unexpected '%.*s'", (int)(t->s.n ? t->s.n : 3), t->s.n ? t->s.p : "end");
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *n)
{
	while (n && !P->failed) {
		if (accept_op(P, ".")) {
			struct jtok *t = peek(P);
			if (t->t == JT_NAME) {
				struct jnode *a = mk(P, JN_ATTR);
				if (!a)
					return NULL;
				a->a = n;
				a->name = t->s;
				n = a;
			} else if (t->t == JT_INT) { /* foo.0 is foo[0] */
				struct jnode *a = mk(P, JN_ITEM), *ix = mk(P, JN_LIT);
				if (!a || !ix)
					return NULL;
				ix->lit = jv_int(t->i);
				a->a = n;
				a->b = ix;
				n = a;
			} else {
				return parse_fail(P, "expected an attribute name after '.'");
			}
			P->i++;
		} else if (accept_op(P, "[")) {
			struct jnode *parts[3] = {0};
			bool slice = false;
			for (int k = 0; k < 3; k++) {
				if (!is_op(P, ":") && !is_op(P, "]"))
					if (!(parts[k] = parse_expr(P, true)))
						return NULL;
				if (k < 2 && accept_op(P, ":"))
					slice = true;
				else
					break;
			}
			if (!expect_op(P, "]"))
				return NULL;
			struct jnode *a = mk(P, slice ? JN_SLICE : JN_ITEM);
			if (!a)
				return NULL;
			a->a = n;
			if (slice) {
				a->b = parts[0];
				a->c = parts[1];
				a->d = parts[2];
			} else {
				a->b = parts[0];
				if (!a->b)
					return parse_fail(P, "empty subscript");
			}
			n = a;
		} else if (is_op(P, "(")) {
			struct jnode *c = mk(P, JN_CALL);
			if (!c)
				return NULL;
			c->a = n;
			if (!parse_call_args(P, c))
				return NULL;
			n = c;
		} else {
			break;
		}
	}
	return P->failed ? NULL : n;
}

/* |filter(args) and `is [not] test args` chains after a unary expression. */
static struct jnode *parse_filters(struct parser *P, struct jnode *n)
{
	while (n && !P->failed) {
		if (accept_op(P, "|")) {
			if (peek(P)->t != JT_NAME)
				return parse_fail(P, "expected a filter name");
			struct jnode *f = mk(P, JN_FILTER);
			if (!f)
				return NULL;
			f->a = n;
			f->name = peek(P)->s;
			P->i++;
			if (is_op(P, "(") && !parse_call_args(P, f))
				return NULL;
			n = parse_postfix(P, f);
		} else if (is_name(P, "is")) {
			P->i++;
			struct jnode *t = mk(P, JN_TEST);
			if (!t)
				return NULL;
			t->a = n;
			if (is_name(P, "not")) {
				t->op = 1;
				P->i++;
			}
			if (peek(P)->t != JT_NAME)
				return parse_fail(P, "expected a test name");
			t->name = peek(P)->s;
			P->i++;
			struct jtok *a = peek(P);
			if (is_op(P, "(")) {
				if (!parse_call_args(P, t))
					return NULL;
			} else if ((a->t == JT_NAME || a->t == JT_STRING || a->t == JT_INT || a->t == JT_FLOAT || is_op(P, "[") ||
				    is_op(P, "{")) &&
				   !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") && !is_name(P, "is") &&
				   !is_name(P, "if") && !is_name(P, "in") && !is_name(P, "not")) {
				struct jnode *arg = parse_postfix(P, parse_primary(P));
				if (!arg)
					return NULL;
				t->args = jarena_alloc(P->ar, sizeof(*t->args));
				if (!t->args)
					return parse_fail(P, "out of memory");
				t->args[0] = arg;
				t->n_args = 1;
			}
			n = t;
		} else {
			break;
		}
	}
	return P->failed ? NULL : n;
}

static struct jnode *parse_unary(struct parser *P, bool with_filter)
{
	struct jnode *n;
	if (is_op(P, "-") || is_op(P, "+")) {
		bool neg = is_op(P, "-");
		P->i++;
		if (!(n = mk(P, neg ? JN_NEG : JN_POS)))
			return NULL;
		if (!(n->a = parse_unary(P, false)))
			return NULL;
	} else {
		n = parse_postfix(P, parse_primary(P));
	}
	return with_filter ? parse_filters(P, n) : n;
}

static struct jnode *mk_bin(struct parser *P, int op, struct jnode *l, struct jnode *r)
{
	if (!l || !r)
		return NULL;
	struct jnode *n = mk(P, JN_BIN);
	if (n) {
		n->op = op;
		n->a = l;
		n->b = r;
	}
	return n;
}

static struct jnode *parse_pow(struct parser *P)
{
	struct jnode *l = parse_unary(P, true);
	while (l && accept_op(P, "**"))
		l = mk_bin(P, JOP_POW, l, parse_unary(P, true));
	return l;
}

static struct jnode *parse_math2(struct parser *P)
{
	struct jnode *l = parse_pow(P);
	for (;;) {
		int op = is_op(P, "*") ? JOP_MUL : is_op(P, "/") ? JOP_DIV : is_op(P, "//") ? JOP_FLOORDIV : is_op(P, "%") ? JOP_MOD : -1;
		if (!l || op < 0)
			return l;
		P->i++;
		l = mk_bin(P, op, l, parse_pow(P));
	}
}

static struct jnode *parse_concat(struct parser *P)
{
	struct jnode *l = parse_math2(P);
	while (l && accept_op(P, "~"))
		l = mk_bin(P, JOP_CONCAT, l, parse_math2(P));
	return l;
}

static struct jnode *parse_math1(struct parser *P)
{
	struct jnode *l = parse_concat(P);
	for (;;) {
		int op = is_op(P, "+") ? JOP_ADD : is_op(P, "-") ? JOP_SUB : -1;
		if (!l || op < 0)
			return l;
		P->i++;
		l = mk_bin(P, op, l, parse_concat(P));
	}
}

static struct jnode *parse_compare(struct parser *P)
{
	struct jnode *l = parse_math1(P);
	for (;;) {
		int op = -1;
		if (is_op(P, "=="))
			op = JOP_EQ;
		else if (is_op(P, "!="))
			op = JOP_NE;
		else if (is_op(P, "<"))
			op = JOP_LT;
		else if (is_op(P, ">"))
			op = JOP_GT;
		else if (is_op(P, "<="))
			op = JOP_LE;
		else if (is_op(P, ">="))
			op = JOP_GE;
		else if (is_name(P, "in"))
			op = JOP_IN;
		else if (is_name(P, "not") && tok_is(peek2(P), JT_NAME, "in")) {
			op = JOP_NOTIN;
			P->i++;
		}
		if (!l || op < 0)
			return l;
		P->i++;
		l = mk_bin(P, op, l, parse_math1(P));
	}
}

static struct jnode *parse_not(struct parser *P)
{
	if (is_name(P, "not")) {
		struct jnode *n = mk(P, JN_NOT);
		P->i++;
		if (n && !(n->a = parse_not(P)))
			return NULL;
		return n;
	}
	return parse_compare(P);
}

static struct jnode *parse_logic(struct parser *P, bool is_or)
{
	struct jnode *l = is_or ? parse_logic(P, false) : parse_not(P);
	while (l && is_name(P, is_or ? "or" : "and")) {
		P->i++;
		struct jnode *n = mk(P, is_or ? JN_OR : JN_AND);
		if (!n)
			return NULL;
		n->a = l;
		if (!(n->b = is_or ? parse_logic(P, false) : parse_not(P)))
			return NULL;
		l = n;
	}
	return l;
}

static struct jnode *parse_expr(struct parser *P, bool condexpr)
{
	if (++P->depth > JINJA_MAX_DEPTH)
		return parse_fail(P, "expression nested too deeply");
	struct jnode *n = parse_logic(P, true);
	while (condexpr && n && is_name(P, "if")) {
		P->i++;
		struct jnode *c = mk(P, JN_COND);
		if (!c)
			return NULL;
		c->a = n;
		if (!(c->b = parse_logic(P, true)))
			return NULL;
		if (is_name(P, "else")) {
			P->i++;
			if (!(c->c = parse_expr(P, true)))
				return NULL;
		}
		n = c;
	}
	P->depth--;
	return n;
}

/* Names separated by commas (for/set targets). */
static bool parse_targets(struct parser *P, struct jnode *n)
{
	struct nlist l = {0};
	do {
		if (peek(P)->t != JT_NAME) {
			free(l.v), free(l.names);
			return parse_fail(P, "expected a variable name"), false;
		}
		nlist_push(&l, NULL, peek(P)->s);
		P->i++;
	} while (accept_op(P, ","));
	n->n_kw = l.n;
	n->kwv = nlist_done(P, &l, &n->kw);
	return !P->failed;
}

static const char *const ends_if[] = {"elif", "else", "endif", NULL};
static const char *const ends_for[] = {"else", "endfor", NULL};
static const char *const ends_endfor[] = {"endfor", NULL};
static const char *const ends_endif[] = {"endif", NULL};
static const char *const ends_set[] = {"endset", NULL};
static const char *const ends_macro[] = {"endmacro", NULL};
static const char *const ends_gen[] = {"endgeneration", NULL};

static struct jnode *parse_if(struct parser *P)
{
	struct jnode *n = mk(P, JN_IF);
	int which;
	if (!n || !(n->a = parse_expr(P, true)) || !expect_end(P, JT_BLOCK_END))
		return NULL;
	if (!(n->body = parse_body(P, ends_if, &n->n_body, &which)))
		return NULL;
	P->i++; /* the end keyword */
	if (which == 0) { /* elif: a nested if in the else branch, which consumes the endif */
		struct jnode *e = parse_if(P);
		if (!e || !(n->else_body = jarena_alloc(P->ar, sizeof(*n->else_body))))
			return NULL;
		n->else_body[0] = e;
		n->n_else = 1;
		return n;
	}
	if (which == 1) {
		if (!expect_end(P, JT_BLOCK_END) || !(n->else_body = parse_body(P, ends_endif, &n->n_else, &which)))
			return NULL;
		P->i++;
	}
	return expect_end(P, JT_BLOCK_END) ? n : NULL;
}

static struct jnode *parse_stmt(struct parser *P)
{
	struct jtok *kw = peek(P);
	if (kw->t != JT_NAME)
		return parse_fail(P, "expected a statement name");
	int which;
	P->i++;
	if (tok_is(kw, JT_NAME, "if"))
		return parse_if(P);
	struct jnode *n;
	if (tok_is(kw, JT_NAME, "for")) {
		if (!(n = mk(P, JN_FOR)) || !parse_targets(P, n))
			return NULL;
		if (!is_name(P, "in"))
			return parse_fail(P, "expected 'in'");
		P->i++;
		if (!(n->a = parse_expr(P, false)))
			return NULL;
		if (is_name(P, "if")) {
			P->i++;
			if (!(n->b = parse_expr(P, false)))
				return NULL;
		}
		if (is_name(P, "recursive"))
			return parse_fail(P, "recursive loops are not supported");
		if (!expect_end(P, JT_BLOCK_END) || !(n->body = parse_body(P, ends_for, &n->n_body, &which)))
			return NULL;
		P->i++;
		if (which == 0) {
			if (!expect_end(P, JT_BLOCK_END) || !(n->else_body = parse_body(P, ends_endfor, &n->n_else, &which)))
				return NULL;
			P->i++;
		}
		return expect_end(P, JT_BLOCK_END) ? n : NULL;
	}
	if (tok_is(kw, JT_NAME, "set")) {
		if (!(n = mk(P, JN_SET)))
			return NULL;
		if (peek(P)->t == JT_NAME && tok_is(peek2(P), JT_OP, ".")) { /* ns.attr */
			n->name = peek(P)->s;
			P->i += 2;
			if (peek(P)->t != JT_NAME)
				return parse_fail(P, "expected an attribute name");
			n->kw = jarena_alloc(P->ar, sizeof(*n->kw));
			if (!n->kw)
				return parse_fail(P, "out of memory");
			n->kw[0] = peek(P)->s;
			n->op = 1;
			P->i++;
		} else if (!parse_targets(P, n)) {
			return NULL;
		}
		if (accept_op(P, "=")) {
			if (!(n->a = parse_expr(P, true)))
				return NULL;
			if (is_op(P, ",")) { /* set a, b = x, y */
				struct jnode *t = mk(P, JN_TUPLE);
				struct nlist l = {0};
				nlist_push(&l, n->a, (struct jstr){0});
				while (t && accept_op(P, ","))
					nlist_push(&l, parse_expr(P, true), (struct jstr){0});
				if (!t)
					return NULL;
				t->n_args = l.n;
				t->args = nlist_done(P, &l, NULL);
				n->a = t;
			}
			return expect_end(P, JT_BLOCK_END) ? n : NULL;
		}
		if (n->op || n->n_kw != 1)
			return parse_fail(P, "a set block takes one variable name");
		n->k = JN_SETBLOCK;
		if (!expect_end(P, JT_BLOCK_END) || !(n->body = parse_body(P, ends_set, &n->n_body, &which)))
			return NULL;
		P->i++;
		return expect_end(P, JT_BLOCK_END) ? n : NULL;
	}
	if (tok_is(kw, JT_NAME, "macro")) {
		if (!(n = mk(P, JN_MACRO)) || peek(P)->t != JT_NAME)
			return parse_fail(P, "expected a macro name");
		n->name = peek(P)->s;
		P->i++;
		if (!is_op(P, "("))
			return parse_fail(P, "expected '('");
		P->i++;
		struct nlist l = {0};
		while (!P->failed && peek(P)->t == JT_NAME) {
			struct jstr name = peek(P)->s;
			struct jnode *def = NULL;
			P->i++;
			if (accept_op(P, "=") && !(def = parse_expr(P, true)))
				break;
			nlist_push(&l, def, name);
			if (!accept_op(P, ","))
				break;
		}
		n->n_kw = l.n;
		n->kwv = nlist_done(P, &l, &n->kw);
		if (P->failed || !expect_op(P, ")") || !expect_end(P, JT_BLOCK_END) ||
		    !(n->body = parse_body(P, ends_macro, &n->n_body, &which)))
			return NULL;
		P->i++;
		if (peek(P)->t == JT_NAME) /* {% endmacro name %} */
			P->i++;
		return expect_end(P, JT_BLOCK_END) ? n : NULL;
	}
	if (tok_is(kw, JT_NAME, "break") || tok_is(kw, JT_NAME, "continue")) {
		n = mk(P, tok_is(kw, JT_NAME, "break") ? JN_BREAK : JN_CONTINUE);
		return n && expect_end(P, JT_BLOCK_END) ? n : NULL;
	}
	if (tok_is(kw, JT_NAME, "generation")) { /* transformers' assistant-mask marker: renders its body */
		if (!(n = mk(P, JN_BLOCK)) || !expect_end(P, JT_BLOCK_END) ||
		    !(n->body = parse_body(P, ends_gen, &n->n_body, &which)))
			return NULL;
		P->i++;
		return expect_end(P, JT_BLOCK_END) ? n : NULL;
	}
	P->i--;
	return parse_fail(P, "unsupported tag '%.*s'", (int)kw->s.n, kw->s.p);
}

/* Statements until {% <one of ends> %} (the keyword is left current; *which is its index) or
 * the end of the template when ends is NULL. */
static struct jnode **parse_body(struct parser *P, const char *const *ends, int *n_out, int *which)
{
	struct nlist l = {0};
	if (++P->depth > JINJA_MAX_DEPTH)
		return parse_fail(P, "blocks nested too deeply");
	*which = -1;
	while (!P->failed) {
		struct jtok *t = peek(P);
		struct jnode *n = NULL;
		if (t->t == JT_EOF) {
			if (ends) {
				int last = 0;
				while (ends[last + 1])
					last++;
				parse_fail(P, "missing {%% %s %%}", ends[last]);
			}
			break;
		}
		if (t->t == JT_TEXT) {
			if ((n = mk(P, JN_TEXT)))
				n->lit = jv_strv(t->s);
			P->i++;
		} else if (t->t == JT_VAR_BEGIN) {
			P->i++;
			if ((n = mk(P, JN_OUT)) && (n->a = parse_expr(P, true)))
				expect_end(P, JT_VAR_END);
		} else if (t->t == JT_BLOCK_BEGIN) {
			struct jtok *kw = peek2(P);
			for (int k = 0; ends && ends[k]; k++)
				if (tok_is(kw, JT_NAME, ends[k]))
					*which = k;
			P->i++;
			if (*which >= 0)
				break;
			n = parse_stmt(P);
		} else {
			parse_fail(P, "unexpected token");
		}
		if (!P->failed && (!n || !nlist_push(&l, n, (struct jstr){0})))
			parse_fail(P, "out of memory");
	}
	P->depth--;
	*n_out = l.n;
	struct jnode **v = nlist_done(P, &l, NULL);
	return P->failed ? NULL : v;
}

enum toast_status jinja_parse(const char *src, struct jinja_template **out, struct toast_error *err)
{
	*out = NULL;
	struct jinja_template *t = calloc(1, sizeof(*t));
	if (!t)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	t->ar.limit = JINJA_MAX_BYTES;
	struct parser P = {.ar = &t->ar, .err = err};
	enum toast_status rc = jinja_lex(&t->ar, src, &P.t, &P.n, err);
	if (rc == TOAST_OK) {
		t->root = jarena_alloc(&t->ar, sizeof(*t->root));
		int which;
		if (t->root) {
			t->root->k = JN_BLOCK;
			t->root->body = parse_body(&P, NULL, &t->root->n_body, &which);
		}
		if (!t->root || P.failed)
			rc = P.failed ? TOAST_ERR_FORMAT : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	free(P.t);
	if (rc != TOAST_OK) {
		jinja_free(t);
		return rc;
	}
	*out = t;
	return TOAST_OK;
}

void jinja_free(struct jinja_template *t)
{
	if (!t)
		return;
	jarena_free(&t->ar);
	free(t);
}
