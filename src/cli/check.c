/*
 * check.c - `toasted check MODEL`: run the model on the reference token sequences and
 * compare logits and greedy continuations with the reference (exit 0 pass, 1 fail, 2 unusable).
 *
 * A float model must match the logits within --tol (max|Δ| / max|ref|) and the greedy tokens. A
 * quantised model (a quantised GGUF, or --quant; or an 8-bit KV cache, --kv-cache q8) cannot: it is judged by the mean KL divergence
 * KL(p_ref || p_model) of the next-token distributions over every position (<= --max-kl) and the
 * top-1 agreement (argmax equal, >= --min-top1); its greedy continuation is reported only.
 *
 * Reference file (default MODEL_DIR/reference.safetensors): idsN (I32 [n]) and logitsN
 * (F32 [n][n_vocab]) for N = 0, 1, ...; reference.json beside it: "greedy" (token ids
 * continuing "greedy_from", default ids0).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "format/safetensors.h"
#include "util/fs.h"

#define CHECK_MAX_TOKENS (1 << 20)

struct check_opts {
	const char *model, *reference;
	struct toast_engine_opts eo;
	double tol, max_kl, min_top1;
	bool quantized;
};

/* the sums over positions behind the mean KL and the top-1 agreement */
struct check_dist {
	double kl;
	long top1, n;
};

/* KL(softmax(ref) || softmax(got)) of one position, in nats, and whether the argmaxes agree */
static double check_kl(const float *got, const float *ref, int V, bool *same_top)
{
	double mr = ref[0], mg = got[0];
	int ar = 0, ag = 0;
	for (int i = 1; i < V; i++) {
		if (ref[i] > mr)
			mr = ref[i], ar = i;
		if (got[i] > mg)
			mg = got[i], ag = i;
	}
	double zr = 0, zg = 0;
	for (int i = 0; i < V; i++) {
		zr += exp(ref[i] - mr);
		zg += exp(got[i] - mg);
	}
	double lzr = log(zr), lzg = log(zg), kl = 0;
	for (int i = 0; i < V; i++) {
		double lpr = ref[i] - mr - lzr, lpg = got[i] - mg - lzg;
		kl += exp(lpr) * (lpr - lpg);
	}
	*same_top = ar == ag;
	return kl > 0 ? kl : 0;
}

static int check_argmax(const float *l, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* max|a-b| / max|b| over n values; also the first row (of width w) whose error exceeds tol */
static double check_err(const float *a, const float *b, int rows, int w, double tol, int *first_bad)
{
	double maxref = 0, maxdiff = 0;
	for (size_t i = 0; i < (size_t)rows * w; i++)
		maxref = fmax(maxref, fabs(b[i]));
	*first_bad = -1;
	for (int r = 0; r < rows; r++) {
		double rowdiff = 0;
		for (int j = 0; j < w; j++) {
			double d = fabs((double)a[(size_t)r * w + j] - b[(size_t)r * w + j]);
			rowdiff = isnan(d) ? INFINITY : fmax(rowdiff, d);
		}
		if (*first_bad < 0 && !(rowdiff <= tol * maxref))
			*first_bad = r;
		maxdiff = fmax(maxdiff, rowdiff);
	}
	return maxref > 0 ? maxdiff / maxref : maxdiff;
}

static int check_sequences(struct toast_engine *e, const struct toast_tensordir *ref, const struct check_opts *o,
			   int *n_checked, struct check_dist *dist)
{
	int V = toast_engine_info(e)->n_vocab, rc = 0;
	for (int n = 0;; n++) {
		char name[32];
		snprintf(name, sizeof(name), "ids%d", n);
		const struct toast_tensor *ids = toast_tensordir_find(ref, name);
		if (!ids)
			break;
		snprintf(name, sizeof(name), "logits%d", n);
		const struct toast_tensor *lg = toast_tensordir_find(ref, name);
		if (ids->dtype != TOAST_DT_I32 || ids->n_dims != 1 || !lg || lg->dtype != TOAST_DT_F32 || lg->n_dims != 2 ||
		    lg->shape[0] != ids->shape[0] || lg->shape[1] != V || ids->shape[0] < 1 || ids->shape[0] > CHECK_MAX_TOKENS) {
			fprintf(stderr, "toasted check: ids%d/logits%d: expected I32 [n] and F32 [n][%d]\n", n, n, V);
			return 2;
		}
		int len = (int)ids->shape[0];
		struct toast_error err = {0};
		struct toast_session *s = NULL;
		float *out = malloc((size_t)len * V * sizeof(float));
		enum toast_status st = out ? toast_session_new(e, len, &s, &err)
					   : toast_err_set(&err, TOAST_ERR_NOMEM, "out of memory for %d x %d logits", len, V);
		if (st == TOAST_OK)
			st = toast_session_feed(s, ids->data, len, out, &err);
		if (st != TOAST_OK) {
			fprintf(stderr, "toasted check: ids%d: %s\n", n, err.msg);
			free(out);
			toast_session_free(s);
			return cli_status_exit(st) ? cli_status_exit(st) : 1;
		}
		int bad;
		double re = check_err(out, lg->data, len, V, o->tol, &bad);
		struct check_dist d = {0};
		for (int t = 0; t < len; t++) {
			bool same;
			d.kl += check_kl(out + (size_t)t * V, (const float *)lg->data + (size_t)t * V, V, &same);
			d.top1 += same;
			d.n++;
		}
		dist->kl += d.kl;
		dist->top1 += d.top1;
		dist->n += d.n;
		printf("ids%d: %d tokens, error %.3g, mean KL %.3g, top-1 %.1f%%%s", n, len, re, d.kl / d.n,
		       100.0 * d.top1 / d.n, bad < 0 || o->quantized ? "\n" : "");
		if (bad >= 0 && !o->quantized) {
			printf("  FAIL (tolerance %g; first failing position %d)\n", o->tol, bad);
			rc = 1;
		}
		free(out);
		toast_session_free(s);
		(*n_checked)++;
	}
	return rc;
}

struct layer_ctx {
	const struct toast_tensordir *ref;
	char line[1024];
	size_t len;
};

static void check_layer_cb(void *ud, int index, const float *x, int n_tokens, int n_embd)
{
	struct layer_ctx *c = ud;
	char name[32];
	snprintf(name, sizeof(name), "hidden0.%d", index);
	const struct toast_tensor *t = toast_tensordir_find(c->ref, name);
	if (!t || t->dtype != TOAST_DT_F32 || t->n_elems != (int64_t)n_tokens * n_embd || c->len >= sizeof(c->line) - 32)
		return;
	int bad;
	double e = check_err(x, t->data, n_tokens, n_embd, 1, &bad);
	c->len += (size_t)snprintf(c->line + c->len, sizeof(c->line) - c->len, " %d:%.2g", index, e);
}

/* per-layer errors of ids0 against hidden0.N when the reference has them: where a mismatch starts */
static void check_layers(struct toast_engine *e, const struct toast_tensordir *ref)
{
	const struct toast_tensor *ids = toast_tensordir_find(ref, "ids0");
	if (!toast_tensordir_find(ref, "hidden0.0") || !ids || ids->dtype != TOAST_DT_I32 || ids->n_dims != 1)
		return;
	struct layer_ctx c = {.ref = ref};
	struct toast_error err;
	struct toast_session *s = NULL;
	int len = (int)ids->shape[0];
	if (toast_session_new(e, len, &s, &err) == TOAST_OK &&
	    toast_session_feed_layers(s, ids->data, len, NULL, check_layer_cb, &c, &err) == TOAST_OK)
		printf("per-layer error (ids0; 0 = embedding, last = final norm):%s\n", c.line);
	toast_session_free(s);
}

static int check_greedy(struct toast_engine *e, const struct toast_tensordir *ref, const char *json_path,
			const struct check_opts *o)
{
	char *text = NULL;
	struct toast_error err = {0};
	if (toast_read_file(json_path, 1 << 24, &text, NULL, &err) != TOAST_OK) {
		fprintf(stderr, "toasted check: %s\n", err.msg);
		return 2;
	}
	json_t *doc = json_loads(text, 0, NULL);
	free(text);
	json_t *greedy = json_object_get(doc, "greedy");
	const char *from = json_string_value(json_object_get(doc, "greedy_from"));
	const struct toast_tensor *ids = toast_tensordir_find(ref, from ? from : "ids0");
	bool ok = json_is_array(greedy) && json_array_size(greedy) <= CHECK_MAX_TOKENS && ids &&
		  ids->dtype == TOAST_DT_I32 && ids->n_dims == 1 && ids->shape[0] >= 1 && ids->shape[0] <= CHECK_MAX_TOKENS;
	for (size_t i = 0; ok && i < json_array_size(greedy); i++)
		ok = json_is_integer(json_array_get(greedy, i));
	if (!ok) {
		fprintf(stderr, "toasted check: %s: needs a \"greedy\" list of token ids continuing %s (I32 [n])\n",
			json_path, from ? from : "ids0");
		json_decref(doc);
		return 2;
	}
	int n_gen = (int)json_array_size(greedy), len = (int)ids->shape[0], V = toast_engine_info(e)->n_vocab;
	bool exact = strcmp(toast_engine_info(e)->backend, "cpu") == 0;
	struct toast_session *s = NULL;
	enum toast_status st = toast_session_new(e, len + n_gen, &s, &err);
	if (st == TOAST_OK)
		st = toast_session_feed(s, ids->data, len, NULL, &err);
	int matched = 0, near_ties = 0, first_bad = -1;
	for (int i = 0; i < n_gen && st == TOAST_OK; i++) {
		const float *l = toast_session_logits(s);
		int want = (int)json_integer_value(json_array_get(greedy, (size_t)i));
		int got = check_argmax(l, V);
		if (want < 0 || want >= V) {
			fprintf(stderr, "toasted check: greedy[%d] = %d outside the vocabulary\n", i, want);
			st = TOAST_ERR_FORMAT;
			break;
		}
		if (got == want) {
			matched++;
		} else {
			double maxabs = 0;
			for (int j = 0; j < V; j++)
				maxabs = fmax(maxabs, fabs(l[j]));
			/* a reduced-precision backend may flip a near-tie: accept it when the two logits are
			 * within tolerance, and continue from the reference token */
			if ((!exact || o->quantized) && l[got] - l[want] <= o->tol * maxabs)
				near_ties++;
			else if (first_bad < 0)
				first_bad = i;
		}
		int32_t next = want;
		if (i + 1 < n_gen)
			st = toast_session_feed(s, &next, 1, NULL, &err);
	}
	toast_session_free(s);
	json_decref(doc);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted check: greedy: %s\n", err.msg);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	printf("greedy: %d/%d tokens match", matched, n_gen);
	if (near_ties)
		printf(" (%d near-tie flips within tolerance)", near_ties);
	if (first_bad >= 0 && o->quantized)
		printf(" (quantised: first mismatch at generated token %d, not judged)", first_bad);
	else if (first_bad >= 0)
		printf("  FAIL (first mismatch at generated token %d)", first_bad);
	printf("\n");
	return first_bad >= 0 && !o->quantized ? 1 : 0;
}

int cli_check(int argc, char **argv)
{
	struct check_opts o = {.tol = -1, .max_kl = 0.1, .min_top1 = 0};
	toast_engine_opts_init(&o.eo);
	for (int i = 1; i < argc; i++) {
		const char *v;
		int eo = cli_engine_opt(argc, argv, &i, CLI_EO_CHUNK | CLI_EO_QUANT, &o.eo);
		if (eo < 0)
			return 2;
		if (eo > 0)
			continue;
		if ((v = cli_optval(argc, argv, &i, "--reference"))) {
			o.reference = v;
		} else if ((v = cli_optval(argc, argv, &i, "--tol"))) {
			if (!cli_float("--tol", v, 0, 1, &o.tol))
				return 2;
		} else if ((v = cli_optval(argc, argv, &i, "--max-kl"))) {
			if (!cli_float("--max-kl", v, 0, 100, &o.max_kl))
				return 2;
		} else if ((v = cli_optval(argc, argv, &i, "--min-top1"))) {
			if (!cli_float("--min-top1", v, 0, 1, &o.min_top1))
				return 2;
		} else if (argv[i][0] == '-' || o.model) {
			fprintf(stderr, "toasted check: unexpected argument %s\n", argv[i]);
			return 2;
		} else {
			o.model = argv[i];
		}
	}
	if (!o.model) {
		fprintf(stderr, "usage: toasted check MODEL_DIR|FILE.gguf [--reference FILE] [--threads N] [--chunk N] "
				"[--backend cpu|cuda] [--quant TYPE] [--kv-cache default|q8] [--tol X] [--max-kl X] [--min-top1 X]\n");
		return 2;
	}
	char refpath[4096], jsonpath[4096];
	if (!o.reference) {
		toast_path_join(refpath, sizeof(refpath), o.model, "reference.safetensors");
		o.reference = refpath;
	}
	snprintf(jsonpath, sizeof(jsonpath), "%s", o.reference);
	char *slash = strrchr(jsonpath, '/');
	snprintf(slash ? slash + 1 : jsonpath, sizeof(jsonpath) - (size_t)(slash ? slash + 1 - jsonpath : 0),
		 "reference.json");

	struct toast_error err = {0};
	struct toast_tensordir ref;
	if (toast_st_open_file(&ref, o.reference, &err) != TOAST_OK) {
		fprintf(stderr, "toasted check: %s\n", err.msg);
		return 2;
	}
	struct toast_engine *e = NULL;
	enum toast_status st = toast_engine_open(o.model, &o.eo, &e, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted check: %s\n", err.msg);
		toast_tensordir_close(&ref);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	if (o.tol < 0)
		o.tol = strcmp(toast_engine_info(e)->backend, "cpu") == 0 ? 1e-4 : 2e-2;
	/* an 8-bit KV cache is judged as quantised weights are */
	bool kv8 = strcmp(toast_engine_info(e)->kv_cache, "q8") == 0;
	o.quantized = toast_engine_info(e)->quantized || kv8;
	printf("model %s (%s, %s backend%s%s)\n", o.model, toast_engine_info(e)->arch, toast_engine_info(e)->backend,
	       toast_engine_info(e)->quantized ? ", quantised" : "", kv8 ? ", 8-bit KV cache" : "");
	int n_checked = 0;
	struct check_dist dist = {0};
	int rc = check_sequences(e, &ref, &o, &n_checked, &dist);
	if (rc != 2 && n_checked > 0) {
		double kl = dist.kl / dist.n, top1 = (double)dist.top1 / dist.n;
		printf("all: mean KL %.4g, top-1 agreement %.1f%%", kl, 100 * top1);
		if (o.quantized && (!(kl <= o.max_kl) || top1 < o.min_top1)) {
			printf("  FAIL (quantised: max KL %g, min top-1 %g%%)", o.max_kl, 100 * o.min_top1);
			rc = 1;
		}
		printf("\n");
	}
	if (rc == 0 && n_checked == 0) {
		fprintf(stderr, "toasted check: %s has no ids0/logits0\n", o.reference);
		rc = 2;
	}
	if (rc != 2)
		check_layers(e, &ref);
	if (rc != 2) {
		int g = check_greedy(e, &ref, jsonpath, &o);
		rc = g == 2 ? 2 : (rc || g);
	}
	printf("%s\n", rc == 0 ? "PASS" : rc == 1 ? "FAIL" : "ERROR");
	toast_engine_close(e);
	toast_tensordir_close(&ref);
	return rc;
}
