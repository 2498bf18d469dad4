/*
 * bench.c - `toasted bench`: prefill and decode speed of a model directory or a synthetic model
 * of a real shape, against the physical floors measured in the same run: decode time vs the
 * bytes a step must read / the copy bandwidth of the backend's memory; prefill as the FLOPs the
 * prompt needs per second / the rate of a large bf16 GEMM (where the backend measures one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "util/err.h"
#include "util/timeutil.h"

#define BENCH_MAX_LIST 8

struct bench_opts {
	const char *model;
	struct toast_engine_opts eo;
	int prompts[BENCH_MAX_LIST], n_prompts;
	int ctxs[BENCH_MAX_LIST], n_ctxs;
	int n_decode;
	int top;                             /* --top M: the candidates each decode step picks from (0: all) */
	float top_p;                         /* --top-p P: the draw's nucleus (1: none) */
	float min_p;                         /* --min-p P: the draw's min-p (0: none) */
	float repeat_penalty;                /* --repeat-penalty X: the sampler's, over the last 64 tokens */
	bool cache;                          /* --cache: the session cache instead */
	int history[BENCH_MAX_LIST], n_history;
	int n_new;
	int steps[BENCH_MAX_LIST], n_steps; /* --steps T1,..: decode steps of T <= 8 tokens each */
	int draft;                          /* --draft N: decode greedy with speculative drafts */
};

static bool bench_list(const char *opt, const char *v, int *out, int *n)
{
	*n = 0;
	char *dup = strdup(v), *save = NULL;
	bool ok = dup != NULL;
	for (char *tok = strtok_r(dup, ",", &save); ok && tok; tok = strtok_r(NULL, ",", &save)) {
		long x;
		ok = *n < BENCH_MAX_LIST && cli_int(opt, tok, 0, 1 << 22, &x);
		if (ok)
			out[(*n)++] = (int)x;
	}
	free(dup);
	return ok && *n > 0;
}

static int32_t *bench_ids(int n, int n_vocab)
{
	int32_t *ids = malloc((size_t)n * sizeof(int32_t));
	uint32_t x = 12345;
	for (int i = 0; ids && i < n; i++) {
		x = x * 1664525u + 1013904223u;
		ids[i] = (int32_t)((x >> 8) % (uint32_t)n_vocab);
	}
	return ids;
}

/* time to the first token of a reply (greedy) to ids[0, n) fed after what s holds */
static enum toast_status bench_first_token(struct toast_session *s, const int32_t *ids, int n, double *t,
					   struct toast_error *err)
{
	struct toast_gen_opts go = {.max_tokens = 1};
	toast_sampling_init(&go.sampling);
	go.sampling.temperature = 0;
	struct toast_gen_result res;
	enum toast_status st = toast_generate(s, NULL, ids, n, &go, NULL, NULL, &res, err);
	*t = res.t_first;
	return st;
}

/*
 * --cache: time to first token of a new message of n_new tokens after a history of H tokens,
 * with a miss (the whole conversation prefilled) and with a hit (the history restored from a
 * snapshot, only the message prefilled), for snapshots in host memory and, on a GPU, in device
 * memory; what saving and restoring cost, and what one snapshot holds.
 */
static int bench_cache(struct toast_engine *e, const struct bench_opts *o, const int32_t *ids, struct toast_session *s)
{
	const struct toast_model_info *in = toast_engine_info(e);
	struct toast_error err = {0};
	bool gpu = strcmp(in->backend, "cpu") != 0;
	double t;
	/* warm-up: first touches, and on a GPU the recorded decode step */
	toast_session_reset(s);
	enum toast_status st = bench_first_token(s, ids, 64, &t, &err);
	printf("\nsession cache: a new message of %d tokens after H tokens of history; a snapshot holds\n"
	       "%.1f KiB per token of history + %.2f MiB (DeltaNet states) + %.2f MiB (logits), twice the last two\n"
	       "with its prompt point\n\n",
	       o->n_new, in->kv_bytes_per_tok / 1024.0, in->state_bytes_fixed / 1048576.0, in->n_vocab * 4 / 1048576.0);
	printf("%-7s %8s %12s %10s %13s %12s %11s %9s\n", "where", "H", "snapshot MB", "save ms", "miss ttft ms",
	       "hit ttft ms", "restore ms", "speedup");
	for (int i = 0; st == TOAST_OK && i < o->n_history; i++) {
		int H = o->history[i];
		double t_miss = 0;
		toast_session_reset(s);
		st = bench_first_token(s, ids, H + o->n_new, &t_miss, &err);
		if (st != TOAST_OK)
			break;
		for (int device = 0; st == TOAST_OK && device <= gpu; device++) {
			struct toast_cache_opts co = {.device = device,
						      .budget_bytes = 2 * (in->kv_bytes_per_tok * (size_t)H + in->state_bytes_fixed) +
								      ((size_t)64 << 20)};
			struct toast_cache *c = NULL;
			st = toast_cache_new(e, &co, &c, &err);
			if (st != TOAST_OK)
				break;
			/* the history's KV rows are in place: pretend the session holds just the history */
			toast_session_bench_seek(s, H);
			double t0 = toast_now();
			st = toast_cache_save(c, s, &err);
			double t_save = toast_now() - t0;
			struct toast_cache_stats cs;
			toast_cache_get_stats(c, &cs);
			int keep = 0;
			toast_session_reset(s);
			t0 = toast_now();
			if (st == TOAST_OK)
				st = toast_cache_restore(c, s, ids, H + o->n_new, &keep, &err);
			double t_restore = toast_now() - t0, t_hit = 0;
			if (st == TOAST_OK && keep != H)
				st = toast_err_set(&err, TOAST_ERR_BACKEND, "the snapshot of %d tokens was not restored (%d)", H, keep);
			if (st == TOAST_OK)
				st = bench_first_token(s, ids + H, o->n_new, &t_hit, &err);
			t_hit += t_restore;
			if (st == TOAST_OK)
				printf("%-7s %8d %12.1f %10.1f %13.1f %12.1f %11.2f %8.1fx\n", device ? "device" : "host", H,
				       cs.bytes_held / 1048576.0, t_save * 1e3, t_miss * 1e3, t_hit * 1e3, t_restore * 1e3,
				       t_miss / t_hit);
			toast_cache_free(c);
			fflush(stdout);
		}
	}
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted bench: %s\n", err.msg);
		return 1;
	}
	return 0;
}

int cli_bench(int argc, char **argv)
{
	struct bench_opts o = {.prompts = {512}, .n_prompts = 1, .ctxs = {0}, .n_ctxs = 1, .n_decode = 32, .top = 1,
			       .top_p = 1, .repeat_penalty = 1,
			       .history = {1000, 8000, 20000}, .n_history = 3, .n_new = 64};
	toast_engine_opts_init(&o.eo);
	for (int i = 1; i < argc; i++) {
		const char *v;
		long n;
		int eo = cli_engine_opt(argc, argv, &i, CLI_EO_CHUNK, &o.eo);
		if (eo < 0)
			return 2;
		if (eo > 0)
			continue;
		if ((v = cli_optval(argc, argv, &i, "--synthetic"))) {
			o.eo.synthetic = v;
		} else if ((v = cli_optval(argc, argv, &i, "--type"))) {
			o.eo.synthetic_type = v;
		} else if ((v = cli_optval(argc, argv, &i, "--layers"))) {
			if (!cli_int("--layers", v, 1, 4096, &n))
				return 2;
			o.eo.synthetic_layers = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--prompt"))) {
			if (!bench_list("--prompt", v, o.prompts, &o.n_prompts))
				return 2;
		} else if ((v = cli_optval(argc, argv, &i, "--ctx"))) {
			if (!bench_list("--ctx", v, o.ctxs, &o.n_ctxs))
				return 2;
		} else if (strcmp(argv[i], "--cache") == 0) {
			o.cache = true;
		} else if ((v = cli_optval(argc, argv, &i, "--history"))) {
			if (!bench_list("--history", v, o.history, &o.n_history))
				return 2;
		} else if ((v = cli_optval(argc, argv, &i, "--new"))) {
			if (!cli_int("--new", v, 1, 1 << 20, &n))
				return 2;
			o.n_new = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--steps"))) {
			if (!bench_list("--steps", v, o.steps, &o.n_steps))
				return 2;
			for (int j = 0; j < o.n_steps; j++)
				if (o.steps[j] < 1 || o.steps[j] > 8) {
					fprintf(stderr, "toasted bench: --steps: 1 to 8 tokens a step\n");
					return 2;
				}
		} else if ((v = cli_optval(argc, argv, &i, "--decode"))) {
			if (!cli_int("--decode", v, 1, 1 << 20, &n))
				return 2;
			o.n_decode = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--draft"))) {
			if (!cli_int("--draft", v, 0, TOAST_DRAFT_MAX, &n))
				return 2;
			o.draft = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--top"))) {
			if (!cli_int("--top", v, 0, 1 << 20, &n))
				return 2;
			o.top = (int)n;
		} else if ((v = cli_optval(argc, argv, &i, "--top-p"))) {
			double d;
			if (!cli_float("--top-p", v, 1e-6, 1, &d))
				return 2;
			o.top_p = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--min-p"))) {
			double d;
			if (!cli_float("--min-p", v, 0, 1, &d))
				return 2;
			o.min_p = (float)d;
		} else if ((v = cli_optval(argc, argv, &i, "--repeat-penalty"))) {
			double d;
			if (!cli_float("--repeat-penalty", v, 0.01, 100, &d))
				return 2;
			o.repeat_penalty = (float)d;
		} else if (argv[i][0] == '-' || o.model) {
			fprintf(stderr, "toasted bench: unexpected argument %s\n", argv[i]);
			return 2;
		} else {
			o.model = argv[i];
		}
	}
	if (!o.model && !o.eo.synthetic) {
		fprintf(stderr, "usage: toasted bench (MODEL_DIR | --synthetic qwen3-next-80b-a3b|CONFIG.json [--layers N]\n"
				"                      [--type bf16|q4_k|q8_0|mlx4|..|q4_k_m|q5_k_m]) [--backend cpu|cuda] [--threads N] [--chunk N]\n"
				"                     [--kv-cache default|q8]\n"
				"                     [--prompt N1,N2,..] [--ctx C1,C2,..] [--decode N] [--top M]\n"
				"                     [--top-p P] [--min-p P] [--repeat-penalty X] [--steps T1,T2,..]\n"
				"                     [--draft N]\n"
				"                     | --cache [--history H1,H2,..] [--new N]\n");
		return 2;
	}
	struct toast_error err = {0};
	struct toast_engine *e = NULL;
	double t0 = toast_now();
	enum toast_status st = toast_engine_open(o.model, &o.eo, &e, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted bench: %s\n", err.msg);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	const struct toast_model_info *in = toast_engine_info(e);
	printf("model: %s%s (%s), %d layers (%d attention), backend %s, prefill passes of %d tokens, KV cache %s, "
	       "loaded in %.1f s\n",
	       o.eo.synthetic ? "synthetic " : "", o.eo.synthetic ? o.eo.synthetic : o.model, in->arch, in->n_layer,
	       in->n_layer_attn, in->backend, in->chunk, in->kv_cache, toast_now() - t0);
	printf("weights: %.2f GB%s%s; weight bytes read per token: %.3f GB (dense + %d routed + shared experts, as stored)\n",
	       in->weight_bytes / 1e9, o.eo.synthetic_type ? ", matrices " : "", o.eo.synthetic_type ? o.eo.synthetic_type : "",
	       in->decode_bytes / 1e9, in->n_expert_used);
	double bw = toast_engine_bandwidth(e), gemm = toast_engine_gemm_rate(e);
	printf("memory bandwidth (copy, read+write): %.1f GB/s\n", bw / 1e9);
	if (gemm > 0)
		printf("bf16 GEMM rate (8192^3 on tensor cores): %.1f TFLOP/s\n", gemm / 1e12);
	int max_ctx = 0;
	for (int i = 0; i < o.n_prompts; i++)
		max_ctx = o.prompts[i] > max_ctx ? o.prompts[i] : max_ctx;
	for (int i = 0; i < o.n_ctxs; i++)
		max_ctx = o.ctxs[i] > max_ctx ? o.ctxs[i] : max_ctx;
	max_ctx += o.n_decode + 2; /* the warm-up token, then n_decode + 1 generated */
	for (int i = 0; i < o.n_steps; i++)
		max_ctx = (o.n_decode + 2) * o.steps[i] > max_ctx ? (o.n_decode + 2) * o.steps[i] : max_ctx;
	for (int i = 0; o.cache && i < o.n_history; i++)
		max_ctx = o.history[i] + o.n_new + 2 > max_ctx ? o.history[i] + o.n_new + 2 : max_ctx;
	int32_t *ids = bench_ids(max_ctx, in->n_vocab);
	struct toast_session *s = NULL;
	st = ids ? toast_session_new(e, max_ctx < in->n_ctx_train ? max_ctx : in->n_ctx_train, &s, &err) : TOAST_ERR_NOMEM;
	int rc = 0;
	if (o.cache && st == TOAST_OK) {
		rc = bench_cache(e, &o, ids, s);
		goto out;
	}
	/* an untimed pass of the longest prompt first, and of each before it is timed: buffers that
	 * grow with the chunk (GPU scratch) and the first launch of each kernel a pass's shapes choose
	 * (cuBLAS's among them) are paid once by a daemon, not on every prompt */
	int longest = 0;
	for (int i = 0; i < o.n_prompts; i++)
		longest = o.prompts[i] > longest ? o.prompts[i] : longest;
	if (st == TOAST_OK && longest > 0) {
		toast_session_reset(s);
		st = toast_session_feed(s, ids, longest, NULL, &err);
	}
	printf("\n%-24s %10s %12s %12s %10s %10s\n", "test", "tokens", "ms", "tok/s", "TFLOP/s", "x GEMM");
	for (int i = 0; st == TOAST_OK && i < o.n_prompts; i++) {
		toast_session_reset(s);
		if (o.prompts[i] != longest && (st = toast_session_feed(s, ids, o.prompts[i], NULL, &err)) != TOAST_OK)
			break;
		toast_session_reset(s);
		double t = toast_now();
		st = toast_session_feed(s, ids, o.prompts[i], NULL, &err);
		t = toast_now() - t;
		char name[64];
		snprintf(name, sizeof(name), "prefill %d", o.prompts[i]);
		/* the FLOPs the prompt needs (causal: token t relates to t + 1 keys) per second, and
		 * that as a fraction of the GEMM rate measured above */
		double T = o.prompts[i], flops = T * in->token_flops + in->pair_flops * T * (T + 1) / 2 + in->head_flops;
		if (st == TOAST_OK)
			printf("%-24s %10d %12.1f %12.1f %10.1f %10.3f\n", name, o.prompts[i], t * 1e3, T / t,
			       flops / t / 1e12, gemm > 0 ? flops / t / gemm : 0.0);
	}
	printf("\n%-10s %10s %12s %12s %14s %10s\n", "decode@ctx", "tok/s", "ms/token", "GB/step", "floor ms", "x floor");
	for (int i = 0; st == TOAST_OK && i < o.n_ctxs; i++) {
		toast_session_reset(s);
		toast_session_bench_seek(s, o.ctxs[i]);
		st = toast_session_feed(s, ids, 1, NULL, &err); /* warm-up (and CUDA graph capture) */
		/* steps as generation runs them (toast_generate, no end-of-text): greedy (--top 1), or a
		 * draw (temperature 1, --top-p, --min-p) from the --top largest logits (0: from all;
		 * the default sampler's top_k is 20), chained on a backend that picks; timed from the
		 * first token on, n_decode steps */
		struct toast_gen_opts go = {.max_tokens = o.n_decode + 1, .ignore_eos = true};
		toast_sampling_init(&go.sampling);
		go.sampling.temperature = o.top == 1 ? 0.0f : 1.0f;
		go.sampling.top_k = o.top;
		go.sampling.top_p = o.top_p;
		go.sampling.min_p = o.min_p;
		go.sampling.repeat_penalty = o.repeat_penalty;
		go.draft = o.draft;
		struct toast_gen_result res = {0};
		if (st == TOAST_OK)
			st = toast_generate(s, NULL, NULL, 0, &go, NULL, NULL, &res, &err);
		if (st == TOAST_OK && res.n_generated != o.n_decode + 1)
			st = toast_err_set(&err, TOAST_ERR_CTX_FULL, "decode at %d: %d tokens generated, not %d (the context)",
					   o.ctxs[i], res.n_generated, o.n_decode + 1);
		double t = res.t_decode / o.n_decode;
		/* bytes a step must read: weights, recurrent state read and written, KV rows read */
		double bytes = (double)in->decode_bytes + 2.0 * in->state_bytes_fixed +
			       (double)in->kv_bytes_per_tok * (o.ctxs[i] + 1);
		double floor_s = bytes / bw;
		if (st == TOAST_OK)
			printf("%-10d %10.1f %12.3f %12.3f %14.3f %10.2f\n", o.ctxs[i], 1 / t, t * 1e3, bytes / 1e9,
			       floor_s * 1e3, t / floor_s);
		if (st == TOAST_OK && o.draft)
			printf("  (drafts: %d of %d tokens taken)\n", res.n_accepted, res.n_drafted);
	}
	/* --steps: steps of T tokens from context 0, recorded and replayed as decode's are, as a
	 * speculative decoder's verification would run them (the head on the last row only), n_decode
	 * of them timed back to back; then again keeping the recurrent states after each token, as
	 * such a step must to keep fewer of its tokens, and keeping them and then only the first
	 * token (a draft refused) */
	if (st == TOAST_OK && o.n_steps)
		printf("\n%-10s %12s %12s %14s %14s %14s\n", "step of T", "ms/step", "ms/token", "x one token",
		       "kept ms/step", "rewound");
	double t_one = 0;
	for (int i = 0; st == TOAST_OK && i < o.n_steps; i++) {
		int T = o.steps[i];
		double t[3] = {0, 0, 0};
		for (int keep = 0; keep < (T > 1 ? 3 : 1) && st == TOAST_OK; keep++) {
			toast_session_reset(s);
			toast_session_bench_record(s, T);
			st = toast_session_bench_keep(s, keep ? T : 0, &err);
			for (int j = 0; st == TOAST_OK && j < 2; j++) /* run once, then recorded */
				st = toast_session_feed(s, ids + j * T, T, NULL, &err);
			int32_t top;
			float val;
			if (st == TOAST_OK && toast_session_top(s, 1, &top, &val, &err) < 0)
				st = TOAST_ERR_BACKEND;
			double t0 = toast_now();
			for (int j = 0; st == TOAST_OK && j < o.n_decode; j++) {
				st = toast_session_feed(s, ids + (j + 2) * T, T, NULL, &err);
				if (st == TOAST_OK && keep == 2)
					st = toast_session_bench_rewind(s, T, 1, &err);
			}
			if (st == TOAST_OK && toast_session_top(s, 1, &top, &val, &err) < 0) /* (waits for the last) */
				st = TOAST_ERR_BACKEND;
			t[keep] = (toast_now() - t0) / o.n_decode;
		}
		if (st == TOAST_OK)
			st = toast_session_bench_keep(s, 0, &err);
		t_one = T == 1 ? t[0] : t_one;
		char ratio[32] = "-", kept[32] = "-", rew[32] = "-"; /* (no ratio where no step of 1 was timed before) */
		if (t_one > 0)
			snprintf(ratio, sizeof(ratio), "%.2f", t[0] / t_one);
		if (t[1] > 0)
			snprintf(kept, sizeof(kept), "%.3f", t[1] * 1e3);
		if (t[2] > 0)
			snprintf(rew, sizeof(rew), "%.3f", t[2] * 1e3);
		if (st == TOAST_OK)
			printf("%-10d %12.3f %12.3f %14s %14s %14s\n", T, t[0] * 1e3, t[0] * 1e3 / T, ratio, kept, rew);
	}
	toast_session_bench_record(s, 0);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted bench: %s\n", err.msg);
		rc = 1;
	}
out:
	toast_session_free(s);
	free(ids);
	toast_engine_close(e);
	return rc;
}
