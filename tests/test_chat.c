/*
 * test_chat.c - chat templates: the real Qwen3 template of models/qwen3next-vocab renders every
 * conversation of chat-cases.json byte for byte (with and without enable_thinking: false) and the
 * text tokenizes to prompt_ids; the Jinja interpreter matches jinja2 (as transformers configures
 * it) on tokenizer/jinja-cases.json, a set of templates rendered by jinja2 3.1 (see
 * tools/gen-jinja-cases.py); templates that must fail do, with the template's message; the
 * ChatML fallback; strftime_now; bounded work on runaway templates.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tokenizer/jinja.h"
#include "toasted.h"
#include "util/fs.h"

static json_t *load_json(const char *rel)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", test_data_dir(), rel);
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	CHECK(j != NULL, "%s: %s", path, je.text);
	return j;
}

static void test_qwen_cases(void)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/models/qwen3next-vocab", test_data_dir());
	struct toast_error err = {0};
	struct toast_tokenizer *tok = NULL;
	enum toast_status st = toast_tok_load(dir, &tok, &err);
	CHECK(st == TOAST_OK, "loading %s: %s", dir, err.msg);
	json_t *cases = load_json("models/qwen3next-vocab/chat-cases.json");
	if (!tok || !cases) {
		toast_tok_free(tok);
		json_decref(cases);
		return;
	}
	CHECK(json_array_size(cases) == 6, "expected 6 chat cases, found %zu", json_array_size(cases));
	size_t i;
	json_t *c;
	json_array_foreach(cases, i, c)
	{
		json_t *msgs = json_object_get(c, "messages"), *kw = json_object_get(c, "template_kwargs");
		json_t *think = json_object_get(kw, "enable_thinking");
		struct toast_chat_opts o = {.add_generation_prompt = true,
					    .enable_thinking = json_is_boolean(think) ? json_is_true(think) : -1};
		const char *want = json_string_value(json_object_get(c, "prompt_text"));
		/* through the JSON entry point */
		char *mj = json_dumps(msgs, 0), *got = NULL;
		st = toast_chat_render_json(tok, mj, NULL, &o, &got, &err);
		CHECK(st == TOAST_OK && want && strcmp(got, want) == 0, "case %zu: rendered\n%s\nwant\n%s\n(%s)", i,
		      got ? got : "(null)", want ? want : "(null)", err.msg);
		/* and through the struct entry point */
		struct toast_chat_msg m[8];
		int n = 0;
		size_t k;
		json_t *x;
		json_array_foreach(msgs, k, x) if (n < 8) m[n++] = (struct toast_chat_msg){
			json_string_value(json_object_get(x, "role")), json_string_value(json_object_get(x, "content"))};
		char *got2 = NULL;
		st = toast_chat_render(tok, m, n, &o, &got2, &err);
		CHECK(st == TOAST_OK && got && got2 && strcmp(got, got2) == 0, "case %zu: struct and JSON renderings differ", i);
		/* the rendered text tokenizes to prompt_ids */
		int32_t *ids = NULL;
		int n_ids = 0;
		json_t *want_ids = json_object_get(c, "prompt_ids");
		if (got && toast_tok_encode(tok, got, strlen(got), &ids, &n_ids, &err) == TOAST_OK) {
			bool same = (size_t)n_ids == json_array_size(want_ids);
			for (int j = 0; same && j < n_ids; j++)
				same = ids[j] == json_integer_value(json_array_get(want_ids, (size_t)j));
			CHECK(same, "case %zu: prompt ids differ (%d tokens, want %zu)", i, n_ids, json_array_size(want_ids));
		} else {
			CHECK(0, "case %zu: encode failed: %s", i, err.msg);
		}
		free(ids);
		free(mj);
		free(got);
		free(got2);
	}
	json_decref(cases);
	toast_tok_free(tok);
}

/* Render src with the JSON context ctx (a string); NULL and the error on failure. */
static char *render(const char *src, const char *ctx, struct toast_error *err)
{
	struct jinja_template *t = NULL;
	char *out = NULL;
	size_t len;
	json_t *j = json_loads(ctx, 0, NULL);
	if (jinja_parse(src, &t, err) == TOAST_OK)
		jinja_render(t, j, &out, &len, err);
	jinja_free(t);
	json_decref(j);
	return out;
}

static void test_jinja_cases(void)
{
	json_t *cases = load_json("tokenizer/jinja-cases.json");
	size_t i;
	json_t *c;
	CHECK(json_array_size(cases) >= 50, "expected at least 50 jinja cases, found %zu", json_array_size(cases));
	json_array_foreach(cases, i, c)
	{
		const char *src = json_string_value(json_object_get(c, "template"));
		json_t *ctx = json_object_get(c, "context");
		const char *want = json_string_value(json_object_get(c, "output"));
		const char *want_err = json_string_value(json_object_get(c, "error"));
		char *cj = json_dumps(ctx, 0);
		struct toast_error err = {0};
		char *got = render(src, cj, &err);
		if (want) {
			CHECK(got && strcmp(got, want) == 0, "jinja case %zu:\n%s\ngot:\n%s\nwant:\n%s\n(%s)", i, src,
			      got ? got : "(error)", want, err.msg);
		} else {
			CHECK(!got && strstr(err.msg, want_err), "jinja case %zu must fail with \"%s\": got %s / %s", i, want_err,
			      got ? got : "(no output)", err.msg);
		}
		free(got);
		free(cj);
	}
	json_decref(cases);
}

static void test_limits(void)
{
	struct toast_error err = {0};
	/* runaway loops stop with an error, quickly */
	static char xs[20100];
	size_t o = (size_t)sprintf(xs, "{\"xs\": [0");
	for (int i = 1; i < 10000; i++) {
		xs[o++] = ',';
		xs[o++] = '0';
	}
	strcpy(xs + o, "]}");
	char *out = render("{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}", xs, &err);
	CHECK(!out && strstr(err.msg, "too long"), "runaway loop: %s", err.msg);
	free(out);
	out = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "deeply"), "runaway recursion: %s", err.msg);
	free(out);
	out = render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
		     "{}", &err);
	CHECK(!out && strstr(err.msg, "memory"), "memory blow-up: %s", err.msg);
	free(out);
	/* parse errors name the line */
	out = render("line one\n{% if x %}\nunclosed", "{}", &err);
	CHECK(!out && strstr(err.msg, "endif"), "unclosed if: %s", err.msg);
	free(out);
	out = render("a\n\n{{ x + }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "line 3"), "syntax error line: %s", err.msg);
	free(out);
	/* an allocation that fails past the limit fails the render, wherever it was asked for: here
	 * |list of an 8M-character string stopped short at 4M items and printed that */
	out = render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(19) %}{% set ns.s = ns.s + ns.s %}"
		     "{% endfor %}{{ ns.s|length }} {{ ns.s|list|length }}",
		     "{}", &err);
	CHECK(!out && strstr(err.msg, "memory"), "a list cut short by the memory limit: %s", out ? out : err.msg);
	free(out);
	/* |int: an integer's digits exactly (through a double 2^53 + 1 was 2^53), NaN the default as
	 * in Python, beyond 64 bits an error (a fuzzed template's 4.4e37 was undefined behaviour) */
	out = render("{{ '9007199254740993'|int }} {{ ' -12 '|int }} {{ '4.5'|int }} {{ 'nan'|float|int }} {{ 'x'|int(7) }}",
		     "{}", &err);
	CHECK(out && strcmp(out, "9007199254740993 -12 4 0 7") == 0, "|int: %s", out ? out : err.msg);
	free(out);
	out = render("{{ (1e300)|int }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "64-bit"), "|int of 1e300: %s", out ? out : err.msg);
	free(out);
	out = render("{{ '44444444444444444444444444444444444'|int }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "64-bit"), "|int of 35 digits: %s", out ? out : err.msg);
	free(out);
	/* integer powers by squaring (a base of 0, 1 or -1 looped once per unit of the exponent:
	 * a fuzzed template's 1066...6 never ended), empty sequences repeated without end, a range
	 * whose next step lies past 64 bits */
	out = render("{{ 1 ** 9000000000000000000 }} {{ (-1) ** 9000000000000000001 }} {{ 0 ** 9000000000000000000 }} "
		     "{{ 0 ** 0 }} {{ 3 ** 39 }} {{ (-2) ** 63 }} {{ 7 ** 1 }}",
		     "{}", &err);
	CHECK(out && strcmp(out, "1 -1 0 1 4052555153018976267 -9223372036854775808 7") == 0, "powers: %s",
	      out ? out : err.msg);
	free(out);
	out = render("{{ 2 ** 63 }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "overflow"), "2 ** 63: %s", out ? out : err.msg);
	free(out);
	out = render("{{ 3 ** 9000000000000000000 }}", "{}", &err);
	CHECK(!out && strstr(err.msg, "overflow"), "3 ** 9e18: %s", out ? out : err.msg);
	free(out);
	out = render("[{{ '' * 9000000000000000000 }}][{{ ([] * 9000000000000000000)|length }}][{{ 'ab' * 2 }}]", "{}",
		     &err);
	CHECK(out && strcmp(out, "[][0][abab]") == 0, "empty sequences repeated: %s", out ? out : err.msg);
	free(out);
	out = render("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}", "{}", &err);
	CHECK(out && strcmp(out, "[9223372036854775800, 9223372036854775805]") == 0, "range at 64 bits: %s",
	      out ? out : err.msg);
	free(out);
	/* filters on empty strings (indent stepped from a NULL buffer: UBSan, found by fuzzing) */
	out = render("[{{ '' | indent(2) }}][{{ x | indent(2, true, true) }}]", "{\"x\": \"\"}", &err);
	CHECK(out && strcmp(out, "[][  ]") == 0, "indent of empty strings: %s", out ? out : err.msg);
	free(out);
	/* strftime_now gives today's date */
	char want[64];
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	strftime(want, sizeof(want), "%d %b %Y", &tm);
	out = render("{{ strftime_now('%d %b %Y') }}", "{}", &err);
	CHECK(out && strcmp(out, want) == 0, "strftime_now: %s, want %s", out ? out : err.msg, want);
	free(out);
}

static void test_chatml_fallback(void)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/tokenizer/tiny-bpe", test_data_dir());
	struct toast_error err = {0};
	struct toast_tokenizer *tok = NULL;
	CHECK(toast_tok_load(dir, &tok, &err) == TOAST_OK, "%s: %s", dir, err.msg);
	if (!tok)
		return;
	struct toast_chat_msg m[] = {{"system", "Be brief."}, {"user", "hi"}};
	struct toast_chat_opts o = {.add_generation_prompt = true, .enable_thinking = -1};
	char *out = NULL;
	CHECK(toast_chat_render(tok, m, 2, &o, &out, &err) == TOAST_OK && out &&
		      strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == 0,
	      "ChatML: %s", out ? out : err.msg);
	free(out);
	toast_tok_free(tok);
}

int main(void)
{
	test_qwen_cases();
	test_jinja_cases();
	test_limits();
	test_chatml_fallback();
	return test_done("test_chat");
}
