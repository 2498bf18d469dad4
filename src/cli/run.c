/*
 * run.c - `toasted run MODEL_DIR [PROMPT]`: one reply, streamed to stdout as it is generated.
 *
 * The conversation: the messages of --messages FILE.json (an OpenAI-style array), then a system
 * message from --system (put first), then one user message whose body is PROMPT, or stdin, or
 * both as PROMPT + "\n\n" + stdin: toast_compose_user(), the rule `cat file | toast "summarise"`
 * uses too (stdin is read only when it is not a terminal, and an empty stdin counts as none;
 * invalid UTF-8 becomes U+FFFD, as the tokenizer would). The model's chat template
 * renders it with the generation prompt (--no-think: enable_thinking false), the text is
 * tokenized and toast_generate() streams the reply.
 *
 * Output: the reply's text (a newline is added only on a terminal), or with --print-ids the
 * generated ids on one line (the final end-of-generation token included). --stats prints timings
 * on stderr. A reply cut by the context window says so on stderr.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/err.h"
#include "proto/proto.h"
#include "util/buf.h"

#define RUN_MAX_INPUT ((size_t)256 << 20)
#define RUN_MAX_STOP 16

struct run_opts {
	const char *model, *prompt, *system, *messages;
	struct toast_engine_opts eo;
	struct toast_gen_opts go;
	const char *stop[RUN_MAX_STOP];
	bool no_think, print_ids, stats, seed_set;
	int ctx_size;
};

struct run_out {
	int32_t *ids;
	int n, cap;
	bool print_ids, ended_nl;
	size_t n_text;
};

static int run_cb(void *ud, int32_t id, const char *text, size_t len)
{
	struct run_out *o = ud;
	if (o->print_ids) {
		if (o->n == o->cap) {
			int cap = o->cap ? o->cap * 2 : 256;
			int32_t *v = realloc(o->ids, (size_t)cap * sizeof(*v));
			if (!v)
				return 1;
			o->ids = v;
			o->cap = cap;
		}
		o->ids[o->n++] = id;
		return 0;
	}
	if (len) {
		fwrite(text, 1, len, stdout);
		fflush(stdout);
		o->ended_nl = text[len - 1] == '\n';
		o->n_text += len;
	}
	return 0;
}

static int run_usage(void)
{
	fprintf(stderr,
		"usage: toasted run MODEL_DIR [PROMPT] [options] [-- PROMPT]   (stdin, when not a terminal, is appended to PROMPT)\n"
		"  --system TEXT        system message\n"
		"  --messages FILE      an OpenAI-style JSON array of messages to start from\n"
		"  --max-tokens N       stop after N generated tokens (default: until the end of the reply)\n"
		"  --temperature T      0 for greedy (default 0.7)\n"
		"  --top-p P, --top-k K, --min-p P, --repeat-penalty X   (defaults 0.8, 20, 0, 1 = off)\n"
		"  --seed N             make sampling reproducible (default: random)\n"
		"  --stop STR           stop before STR (repeatable, up to %d)\n"
		"  --no-think           enable_thinking: false for the chat template\n"
		"  --ignore-eos         do not stop at end-of-turn tokens\n"
		"  --draft N            draft up to N (<= %d) tokens a step from earlier text and verify them\n"
		"                       in one pass (the same reply, faster where it repeats its input; not\n"
		"                       with --repeat-penalty)\n"
		"  --print-ids          print the generated token ids instead of text\n"
		"  --stats              prompt tokens, prefill tok/s, time to first token, decode tok/s on stderr\n"
		"  --ctx-size N         context window (default: prompt + max tokens, or + 4096)\n"
		"  --backend cpu|cuda, --threads N\n"
		"  --kv-cache q8        an 8-bit KV cache (half the memory of bf16; default: the activation type)\n"
		"  --quant TYPE         quantise a float model's matrices at load (q8_0, q4_0, q4_1, q4_k_m, q5_k_m, q6_k)\n",
		RUN_MAX_STOP, TOAST_DRAFT_MAX);
	return 2;
}

static int run_parse(int argc, char **argv, struct run_opts *o)
{
	toast_engine_opts_init(&o->eo);
	toast_sampling_init(&o->go.sampling);
	o->go.stop = o->stop;
	bool rest = false; /* after "--": the model and the prompt only (a prompt may begin with '-') */
	for (int i = 1; i < argc; i++) {
		const char *v;
		long n;
		double d;
		if (!rest && strcmp(argv[i], "--") == 0) {
			rest = true;
			continue;
		}
		if (rest || argv[i][0] != '-' || !argv[i][1]) {
			if (o->prompt) {
				fprintf(stderr, "toasted run: unexpected argument %s (quote the prompt)\n", argv[i]);
				return 2;
			}
			*(o->model ? &o->prompt : &o->model) = argv[i];
			continue;
		}
		int eo = cli_engine_opt(argc, argv, &i, CLI_EO_QUANT, &o->eo);
		if (eo < 0)
			return 2;
		if (eo > 0)
			continue;
		if ((v = cli_optval(argc, argv, &i, "--system"))) {
			o->system = v;
		} else if ((v = cli_optval(argc, argv, &i, "--messages"))) {
			o->messages = v;
		} else if ((v = cli_optval(argc, argv, &i, "--max-tokens"))) {
			if (!cli_int("--max-tokens", v, 1, 1 << 24, &n))
				return 2;
			o->go.max_tokens = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--temperature"))) {
			if (!cli_float("--temperature", v, 0, 100, &d))
				return 2;
			o->go.sampling.temperature = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--top-p"))) {
			if (!cli_float("--top-p", v, 1e-6, 1, &d))
				return 2;
			o->go.sampling.top_p = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--top-k"))) {
			if (!cli_int("--top-k", v, 0, 1 << 24, &n))
				return 2;
			o->go.sampling.top_k = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--min-p"))) {
			if (!cli_float("--min-p", v, 0, 1, &d))
				return 2;
			o->go.sampling.min_p = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--repeat-penalty"))) {
			if (!cli_float("--repeat-penalty", v, 0.01, 100, &d))
				return 2;
			o->go.sampling.repeat_penalty = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--seed"))) {
			char *end;
			unsigned long long s = strtoull(v, &end, 10);
			if (!*v || *end) {
				fprintf(stderr, "toasted run: --seed needs a non-negative integer\n");
				return 2;
			}
			o->go.sampling.seed = s;
			o->seed_set = true;
		} else if ((v = cli_optval(argc, argv, &i, "--stop"))) {
			if (o->go.n_stop == RUN_MAX_STOP || !*v) {
				fprintf(stderr, "toasted run: --stop needs a non-empty string (at most %d)\n", RUN_MAX_STOP);
				return 2;
			}
			o->stop[o->go.n_stop++] = v;
		} else if ((v = cli_optval(argc, argv, &i, "--draft"))) {
			if (!cli_int("--draft", v, 0, TOAST_DRAFT_MAX, &n))
				return 2;
			o->go.draft = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--ctx-size"))) {
			if (!cli_int("--ctx-size", v, 16, 1 << 24, &n))
				return 2;
			o->ctx_size = (int)n;
		} else if (strcmp(argv[i], "--no-think") == 0) {
			o->no_think = true;
		} else if (strcmp(argv[i], "--ignore-eos") == 0) {
			o->go.ignore_eos = true;
		} else if (strcmp(argv[i], "--print-ids") == 0) {
			o->print_ids = true;
		} else if (strcmp(argv[i], "--stats") == 0) {
			o->stats = true;
		} else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			return run_usage();
		} else {
			fprintf(stderr, "toasted run: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (!o->model)
		return run_usage();
	if (!o->seed_set) {
		FILE *f = fopen("/dev/urandom", "rb");
		if (!f || fread(&o->go.sampling.seed, sizeof(o->go.sampling.seed), 1, f) != 1)
			o->go.sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
		if (f)
			fclose(f);
	}
	return 0;
}

/* The messages as a JSON array text (malloc'd), or NULL with a message printed. */
static char *run_messages(const struct run_opts *o)
{
	json_t *msgs = NULL;
	if (o->messages) {
		char *text;
		size_t len;
		FILE *f = fopen(o->messages, "rb");
		if (!f) {
			perror(o->messages);
			return NULL;
		}
		bool ok = cli_read_stream(f, RUN_MAX_INPUT, &text, &len);
		fclose(f);
		if (!ok)
			return NULL;
		json_error_t je;
		msgs = json_loadb(text, len, 0, &je);
		free(text);
		if (!json_is_array(msgs)) {
			fprintf(stderr, "toasted run: %s: expected a JSON array of messages (%s)\n", o->messages,
				msgs ? "not an array" : je.text);
			json_decref(msgs);
			return NULL;
		}
	} else {
		msgs = json_array();
	}
	if (o->system)
		json_array_insert_new(msgs, 0, json_pack("{s:s, s:s%}", "role", "system", "content", o->system, strlen(o->system)));
	char *in = NULL;
	size_t n_in = 0;
	if (!isatty(STDIN_FILENO) && !cli_read_stream(stdin, RUN_MAX_INPUT, &in, &n_in)) {
		json_decref(msgs);
		return NULL;
	}
	struct toast_buf body;
	toast_buf_init(&body);
	if ((o->prompt || n_in) && toast_compose_user(&body, o->prompt, in, n_in))
		json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", body.data, body.len));
	toast_buf_deinit(&body);
	free(in);
	char *s = NULL;
	if (json_array_size(msgs) == 0)
		fprintf(stderr, "toasted run: nothing to answer: give a PROMPT, stdin or --messages\n");
	else
		s = json_dumps(msgs, JSON_COMPACT);
	json_decref(msgs);
	return s;
}

static const char *run_finish_name(enum toast_finish f)
{
	static const char *names[] = {"stop", "length", "context", "cancelled"};
	return names[f];
}

int cli_run(int argc, char **argv)
{
	struct run_opts o = {0};
	int rc = run_parse(argc, argv, &o);
	if (rc)
		return rc;
	char *msgs = run_messages(&o);
	if (!msgs)
		return 2;
	struct toast_error err = {0};
	struct toast_engine *e = NULL;
	struct toast_session *s = NULL;
	char *prompt = NULL;
	int32_t *ids = NULL;
	int n_ids = 0;
	struct run_out out = {.print_ids = o.print_ids};
	enum toast_status st = toast_engine_open(o.model, &o.eo, &e, &err);
	const struct toast_tokenizer *tok = st == TOAST_OK ? toast_engine_tokenizer(e) : NULL;
	if (st == TOAST_OK && !tok)
		st = toast_err_set(&err, TOAST_ERR_UNSUPPORTED, "%s has no tokenizer.json", o.model);
	struct toast_chat_opts co = {.add_generation_prompt = true, .enable_thinking = o.no_think ? 0 : -1};
	if (st == TOAST_OK)
		st = toast_chat_render_json(tok, msgs, NULL, &co, &prompt, &err);
	if (st == TOAST_OK)
		st = toast_tok_encode(tok, prompt, strlen(prompt), &ids, &n_ids, &err);
	if (st == TOAST_OK) {
		int n_train = toast_engine_info(e)->n_ctx_train;
		long want = o.ctx_size ? o.ctx_size : (long)n_ids + (o.go.max_tokens ? o.go.max_tokens : 4096);
		int n_ctx = (int)(want < n_train ? want : n_train);
		if (o.ctx_size > n_train)
			st = toast_err_set(&err, TOAST_ERR_INVALID, "--ctx-size %d is over the model's %d tokens", o.ctx_size, n_train);
		else if (n_ids >= n_ctx)
			st = toast_err_set(&err, TOAST_ERR_CTX_FULL,
					   "the prompt is %d tokens and leaves no room to generate in a context of %d tokens%s",
					   n_ids, n_ctx, o.ctx_size && o.ctx_size < n_train ? " (raise --ctx-size)" : "");
		else
			st = toast_session_new(e, n_ctx, &s, &err);
	}
	struct toast_gen_result res = {0};
	if (st == TOAST_OK)
		st = toast_generate(s, tok, ids, n_ids, &o.go, run_cb, &out, &res, &err);
	if (st == TOAST_OK) {
		if (o.print_ids) {
			for (int i = 0; i < out.n; i++)
				printf(i ? " %d" : "%d", out.ids[i]);
			printf("\n");
		} else if (out.n_text && !out.ended_nl && isatty(STDOUT_FILENO)) {
			printf("\n");
		}
		fflush(stdout);
		if (res.finish == TOAST_FINISH_CTX)
			fprintf(stderr, "toasted run: stopped: the context window (%d tokens) is full\n", toast_session_n_ctx(s));
		if (o.stats) {
			int gen_after_first = res.n_generated - 1;
			fprintf(stderr,
				"prompt: %d tokens, prefill %.3f s (%.1f tok/s); first token after %.3f s; "
				"decode: %d tokens in %.3f s (%.1f tok/s); finish: %s; seed %llu\n",
				res.n_prompt, res.t_prefill, res.t_prefill > 0 ? res.n_prefilled / res.t_prefill : 0, res.t_first,
				res.n_generated, res.t_decode, res.t_decode > 0 ? gen_after_first / res.t_decode : 0,
				run_finish_name(res.finish), (unsigned long long)o.go.sampling.seed);
			if (res.n_drafted)
				fprintf(stderr, "drafts: %d of %d tokens taken\n", res.n_accepted, res.n_drafted);
		}
	} else {
		fprintf(stderr, "toasted run: %s\n", err.msg);
		rc = cli_status_exit(st);
		if (!rc)
			rc = 1;
	}
	free(out.ids);
	free(ids);
	free(prompt);
	free(msgs);
	toast_session_free(s);
	toast_engine_close(e);
	return rc;
}
