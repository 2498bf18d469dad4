/*
 * jinja.h - a Jinja2 subset interpreter for chat templates (internal to src/tokenizer/).
 *
 * It renders the way Hugging Face transformers does (apply_chat_template): an immutable
 * sandboxed environment with trim_blocks and lstrip_blocks, loop controls, tojson without HTML
 * escaping and with insertion-ordered keys, and the globals raise_exception and strftime_now.
 * Files: jinja_lex.c (source -> tokens, whitespace control), jinja_parse.c (tokens -> tree),
 * jinja_value.c (values, arena, printing, JSON), jinja_eval.c (statements, expressions),
 * jinja_builtins.c (filters, tests, methods, globals).
 * Invariant: rendering is bounded: steps, recursion, memory and output all have limits, and
 * every error (raise_exception included) is a status with the template line, never an abort.
 */
#ifndef TOAST_TOKENIZER_JINJA_H
#define TOAST_TOKENIZER_JINJA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toasted.h"

#define JINJA_MAX_STEPS 10000000L     /* evaluation steps per render */
#define JINJA_MAX_DEPTH 200           /* nesting of expressions, statements and macro calls */
#define JINJA_MAX_BYTES ((size_t)256 << 20) /* arena + output per render */

/* ---- memory: a bump allocator freed all at once ---- */
struct jarena {
	struct jchunk *head;
	size_t used; /* bytes handed out, for the limit */
	size_t limit;
	bool failed; /* an allocation (or a jbuf's growth) failed: the render fails, whatever the
		      * code that asked made of it (a list short of an item is not a result) */
};
void *jarena_alloc(struct jarena *a, size_t n); /* zeroed; NULL (and failed) when out of memory or over the limit */
void jarena_free(struct jarena *a);

/* ---- values ---- */
enum jv_kind { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_FUNC };

struct jstr {
	const char *p;
	size_t n;
};

struct jv {
	enum jv_kind k;
	union {
		bool b;
		int64_t i;
		double f;
		struct jstr s;
		struct jlist *l;
		struct jdict *d;
		const struct jnode *macro;
		int func; /* a global function (enum in jinja_builtins.c) */
	};
};

struct jlist {
	struct jv *v;
	size_t n, cap;
	bool tuple; /* prints as (a, b) */
};

struct jdict {
	struct jstr *keys;
	struct jv *vals;
	size_t n, cap;
	bool ns; /* a namespace(): the one mutable kind of object */
};

extern const struct jv jv_undef, jv_none;
static inline struct jv jv_bool(bool b) { struct jv v = {.k = JV_BOOL}; v.b = b; return v; }
static inline struct jv jv_int(int64_t i) { struct jv v = {.k = JV_INT}; v.i = i; return v; }
static inline struct jv jv_float(double f) { struct jv v = {.k = JV_FLOAT}; v.f = f; return v; }
static inline struct jv jv_strv(struct jstr s) { struct jv v = {.k = JV_STR}; v.s = s; return v; }

/* A growable byte buffer (output, string building); allocations from the arena's limit. */
struct jbuf {
	char *p;
	size_t n, cap;
	struct jarena *ar;
	bool failed; /* an append ran out of memory or over the limit */
};
void jbuf_put(struct jbuf *b, const void *s, size_t n);
void jbuf_puts(struct jbuf *b, const char *s);

bool jv_truthy(struct jv v);
bool jv_equal(struct jv a, struct jv b);
/* str(v) as Python prints it (undefined: ""), appended to b. */
void jv_to_str(struct jbuf *b, struct jv v);
/* repr(v) as Python prints it. */
void jv_repr(struct jbuf *b, struct jv v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none)); false if v holds what JSON cannot. */
bool jv_to_json(struct jbuf *b, struct jv v, int indent, int level);
/* jansson value -> jinja value (arena copies). */
struct jv jv_from_json(struct jarena *a, json_t *j);
struct jstr jstr_dup(struct jarena *a, const char *s, size_t n);
struct jlist *jlist_new(struct jarena *a, size_t cap);
bool jlist_push(struct jarena *a, struct jlist *l, struct jv v);
struct jdict *jdict_new(struct jarena *a, size_t cap);
bool jdict_set(struct jarena *a, struct jdict *d, struct jstr key, struct jv v);
/* The value of key, or NULL. */
struct jv *jdict_get(const struct jdict *d, const char *key, size_t n);
const char *jv_kind_name(struct jv v);
/* Python's str.isspace() for one code point. */
bool jv_py_space(uint32_t cp);

/* ---- lexer ---- */
enum jtok_type { JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END, JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF };

struct jtok {
	enum jtok_type t;
	int line;
	struct jstr s; /* text, name, string value (unescaped), operator spelling */
	int64_t i;
	double f;
};

enum toast_status jinja_lex(struct jarena *a, const char *src, struct jtok **toks, int *n_toks, struct toast_error *err);

/* ---- tree ---- */
enum jn_kind {
	/* expressions */
	JN_LIT, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BIN,
	JN_AND, JN_OR, JN_COND, JN_LIST, JN_TUPLE, JN_DICT,
	/* statements */
	JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE, JN_BLOCK,
};

enum jn_op { JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT, JOP_EQ, JOP_NE,
	     JOP_LT, JOP_GT, JOP_LE, JOP_GE, JOP_IN, JOP_NOTIN };

struct jnode {
	enum jn_kind k;
	int line;
	int op;              /* JN_BIN: enum jn_op; JN_TEST: negated */
	struct jstr name;    /* JN_NAME, JN_ATTR, JN_FILTER, JN_TEST, JN_MACRO, JN_SET(BLOCK) target */
	struct jv lit;       /* JN_LIT, JN_TEXT */
	struct jnode *a, *b, *c, *d; /* operands: object, index, slice parts, condition, ... */
	struct jnode **args; /* call/filter/test arguments; list/tuple items; dict keys */
	int n_args;
	struct jstr *kw;     /* keyword argument names; macro parameters; for/set targets */
	struct jnode **kwv;  /* keyword values; macro defaults (NULL: none); dict values */
	int n_kw;
	struct jnode **body, **else_body; /* statements */
	int n_body, n_else;
};

struct jinja_template {
	struct jarena ar;
	struct jnode *root; /* JN_BLOCK */
};

enum toast_status jinja_parse(const char *src, struct jinja_template **out, struct toast_error *err);
void jinja_free(struct jinja_template *t);
/* Render with the variables of ctx (a JSON object); *out is malloc'd and NUL-terminated. */
enum toast_status jinja_render(const struct jinja_template *t, json_t *ctx, char **out, size_t *len,
			       struct toast_error *err);

/* ---- evaluation internals shared by jinja_eval.c and jinja_builtins.c ---- */
struct jctx;
bool jctx_fail(struct jctx *c, int line, const char *fmt, ...)
#if defined(__GNUC__)
	__attribute__((format(printf, 3, 4)))
#endif
	;
struct jarena *jctx_arena(struct jctx *c);
/* Call a macro or a global function with evaluated arguments. */
bool jctx_call(struct jctx *c, int line, struct jv fn, struct jv *args, int n_args, struct jstr *kw, struct jv *kwv,
	       int n_kw, struct jv *out);

struct jcall {
	struct jv *args;
	int n_args;
	struct jstr *kw;
	struct jv *kwv;
	int n_kw;
	int line;
};
/* Filter `name` of v; false (with the error set) if unknown or failing. */
bool jinja_filter(struct jctx *c, struct jstr name, struct jv v, const struct jcall *a, struct jv *out);
/* Test `name` of v. */
bool jinja_test(struct jctx *c, struct jstr name, struct jv v, const struct jcall *a, bool *out);
/* Method `name` of v (str/dict/list methods); *found false when v has no such method. */
bool jinja_method(struct jctx *c, struct jv v, struct jstr name, const struct jcall *a, struct jv *out, bool *found);
/* A global function by name (range, namespace, raise_exception, strftime_now, dict), or false. */
bool jinja_global(struct jstr name, struct jv *out);
bool jinja_call_global(struct jctx *c, int func, const struct jcall *a, struct jv *out);

#endif
