/*
 * test_golden.c - every reference model against its upstream reference, on the CPU backend:
 * per-layer hidden states of ids0 (so a regression names its layer), full logits of every
 * idsN, and the cached greedy continuation, for several chunk sizes and thread counts.
 *
 * The shared models (../shared/models) and the "-odd" ones made by tools/make-reference.py
 * (shapes the engine was not written against: hidden sizes that are not multiples of 8, head
 * ratios 3:1, 5:1 and 1:1, GDN value/key head ratios 1 and 2, key head dim above and below the
 * value head dim, attention every 2nd or 3rd layer, dense and MoE layers mixed, raw top-k
 * weights, sequences of 300 to 500 tokens).
 *
 * Sequences are fed so that the state must carry across feeds: ids1 in three feeds of uneven
 * length, so chunk boundaries fall at different places than in one feed.
 *
 *   test_golden [MODEL]   run one model only
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "format/safetensors.h"
#include "test.h"
#include "util/fs.h"

static const char *models[] = {
	"qwen3-tiny",   "qwen3moe-tiny", "qwen35-tiny",   "qwen35moe-tiny", "qwen3next-tiny", "qwen3next-tiny-hubcfg",
	"qwen3-odd",    "qwen3moe-odd",  "qwen35moe-odd", "qwen3next-odd",
};

/* chunk 0 is the engine's default; 512 runs every sequence in one forward pass */
static const struct {
	int chunk, threads;
} runs[] = {{0, 2}, {1, 1}, {1, 2}, {7, 1}, {7, 2}, {64, 1}, {64, 2}, {512, 1}};

struct hook_ctx {
	const struct toast_tensordir *ref;
	const char *model;
	int chunk, n_layer;
	int row;  /* position of the chunk being computed */
	int seen; /* hidden-state rows compared, summed over layers */
};

static double rel_err(const float *a, const float *b, size_t n)
{
	double mr = 0, md = 0;
	for (size_t i = 0; i < n; i++) {
		mr = fmax(mr, fabs(b[i]));
		double d = fabs((double)a[i] - b[i]);
		md = isnan(d) ? INFINITY : fmax(md, d);
	}
	return mr > 0 ? md / mr : md;
}

/* compare a chunk's rows of hidden state `index` with the reference rows at the same positions */
static void hidden_hook(void *ud, int index, const float *x, int T, int n)
{
	struct hook_ctx *c = ud;
	char name[32];
	snprintf(name, sizeof(name), "hidden0.%d", index);
	const struct toast_tensor *t = toast_tensordir_find(c->ref, name);
	bool ok = t && t->n_dims == 2 && t->shape[1] == n && t->shape[0] >= c->row + T;
	CHECK(ok, "%s: reference %s missing or of the wrong shape", c->model, name);
	if (ok) {
		/* relative to the whole reference tensor, so a chunk of small values is not magnified */
		double mr = 0, md = 0;
		const float *r = t->data;
		for (int64_t i = 0; i < t->n_elems; i++)
			mr = fmax(mr, fabs(r[i]));
		for (size_t i = 0; i < (size_t)T * n; i++) {
			double d = fabs((double)x[i] - r[(size_t)c->row * n + i]);
			md = isnan(d) ? INFINITY : fmax(md, d);
		}
		CHECK(md <= 1e-4 * mr, "%s: chunk %d: hidden state %d (%s) rows %d..%d: error %.3g", c->model, c->chunk,
		      index, index == 0 ? "embedding" : index == c->n_layer ? "final norm" : "after a layer", c->row,
		      c->row + T - 1, mr > 0 ? md / mr : md);
		c->seen += T;
	}
	if (index == c->n_layer)
		c->row += T;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* Feed ids in the given feeds (lengths summing to len) into a new session; all logits to out. */
static enum toast_status feed_split(struct toast_engine *e, const int32_t *ids, int len, const int *feeds, int n_feeds,
				    float *out, toast_layer_cb hook, void *ud, struct toast_error *err)
{
	int V = toast_engine_info(e)->n_vocab, at = 0;
	struct toast_session *s = NULL;
	enum toast_status st = toast_session_new(e, len, &s, err);
	for (int f = 0; f < n_feeds && st == TOAST_OK; f++) {
		st = toast_session_feed_layers(s, ids + at, feeds[f], out + (size_t)at * V, hook, ud, err);
		at += feeds[f];
		if (st == TOAST_OK && toast_session_n_past(s) != at)
			st = toast_err_set(err, TOAST_ERR_INVALID, "n_past %d after %d tokens", toast_session_n_past(s), at);
	}
	toast_session_free(s);
	return st;
}

static void test_greedy(struct toast_engine *e, const struct toast_tensordir *ref, const char *dir, const char *model,
			int chunk)
{
	char path[1100];
	struct toast_error err = {0};
	snprintf(path, sizeof(path), "%s/reference.json", dir);
	json_t *doc = json_load_file(path, 0, NULL);
	json_t *greedy = json_object_get(doc, "greedy");
	const struct toast_tensor *ids = toast_tensordir_find(ref, "ids0");
	CHECK(json_is_array(greedy) && json_array_size(greedy) > 0 && ids, "%s: reference.json has no greedy list", model);
	if (json_is_array(greedy) && ids) {
		int V = toast_engine_info(e)->n_vocab, n_gen = (int)json_array_size(greedy), len = (int)ids->shape[0], ok = 0;
		struct toast_session *s = NULL;
		enum toast_status st = toast_session_new(e, len + n_gen, &s, &err);
		if (st == TOAST_OK)
			st = toast_session_feed(s, ids->data, len, NULL, &err);
		for (int i = 0; i < n_gen && st == TOAST_OK; i++) {
			int32_t tok = argmax(toast_session_logits(s), V);
			ok += tok == json_integer_value(json_array_get(greedy, (size_t)i));
			st = toast_session_feed(s, &tok, 1, NULL, &err);
		}
		CHECK(st == TOAST_OK && ok == n_gen, "%s: chunk %d: %d/%d greedy tokens match %s", model, chunk, ok, n_gen,
		      err.msg);
		toast_session_free(s);
	}
	json_decref(doc);
}

/* A speculative step kept in part: T tokens run with their states kept, rewound to the first n,
 * then one more token gives the logits that feeding those n alone and then it gives. */
static void test_rewind(struct toast_engine *e, const struct toast_tensordir *ref, const char *model)
{
	const struct toast_tensor *ids = toast_tensordir_find(ref, "ids1");
	const int P = 9, cases[][2] = {{4, 1}, {4, 2}, {4, 4}, {3, 2}, {8, 5}, {2, 1}};
	CHECK(ids && ids->shape[0] >= P + 9, "%s: ids1 of %d tokens", model, ids ? (int)ids->shape[0] : 0);
	if (!ids || ids->shape[0] < P + 9)
		return;
	const int32_t *tk = ids->data;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_backend *be = e->be;
	float *got = malloc((size_t)V * sizeof(float));
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		int T = cases[k][0], n = cases[k][1];
		int32_t next = tk[P + T]; /* (not the token after the n kept: any token may follow) */
		struct toast_error err = {0};
		struct toast_session *a = NULL, *b = NULL;
		enum toast_status st = toast_session_new(e, P + 16, &a, &err);
		if (st == TOAST_OK)
			st = toast_session_new(e, P + 16, &b, &err);
		if (st == TOAST_OK)
			st = toast_session_feed(a, tk, P, NULL, &err);
		if (st == TOAST_OK)
			st = toast_model_state_keep(&e->model, &a->state, 8, &err);
		if (st == TOAST_OK)
			st = toast_model_forward(&e->model, &a->state, &e->work, tk + P, T, P, false, NULL, NULL, &err);
		if (st == TOAST_OK)
			st = toast_model_state_rewind(&e->model, &a->state, P, T, n, &err);
		if (st == TOAST_OK)
			st = toast_model_forward(&e->model, &a->state, &e->work, &next, 1, P + n, false, NULL, NULL, &err);
		if (st == TOAST_OK)
			st = be->ops->read(be, got, e->work.logits, (size_t)V * sizeof(float), &err);
		e->logits_owner = NULL; /* (a's forwards went around the session) */
		if (st == TOAST_OK)
			st = toast_session_feed(b, tk, P + n, NULL, &err);
		if (st == TOAST_OK)
			st = toast_session_feed(b, &next, 1, NULL, &err);
		const float *want = st == TOAST_OK ? toast_session_logits(b) : NULL;
		double d = want ? rel_err(got, want, (size_t)V) : INFINITY;
		CHECK(st == TOAST_OK && d < 1e-4, "%s: %d of a step of %d kept, then a token: logits error %.3g %s", model,
		      n, T, d, err.msg);
		toast_session_free(a);
		toast_session_free(b);
	}
	free(got);
}

static void test_model(const char *model)
{
	char dir[1024], path[1100];
	snprintf(dir, sizeof(dir), "%s/models/%s", test_data_dir(), model);
	snprintf(path, sizeof(path), "%s/reference.safetensors", dir);
	struct toast_error err = {0};
	struct toast_tensordir ref;
	enum toast_status st = toast_st_open_file(&ref, path, &err);
	CHECK(st == TOAST_OK, "%s", err.msg);
	if (st != TOAST_OK)
		return;
	for (size_t ri = 0; ri < sizeof(runs) / sizeof(runs[0]); ri++) {
		struct toast_engine_opts o;
		toast_engine_opts_init(&o);
		o.backend = "cpu";
		o.chunk = runs[ri].chunk;
		o.n_threads = runs[ri].threads;
		struct toast_engine *e = NULL;
		st = toast_engine_open(dir, &o, &e, &err);
		CHECK(st == TOAST_OK, "%s: %s", model, err.msg);
		if (st != TOAST_OK)
			break;
		int V = toast_engine_info(e)->n_vocab, L = toast_engine_info(e)->n_layer;
		for (int n = 0; n < 2; n++) {
			char nm[32];
			snprintf(nm, sizeof(nm), "ids%d", n);
			const struct toast_tensor *ids = toast_tensordir_find(&ref, nm);
			snprintf(nm, sizeof(nm), "logits%d", n);
			const struct toast_tensor *lg = toast_tensordir_find(&ref, nm);
			CHECK(ids && lg && lg->n_elems == ids->n_elems * V, "%s: reference lacks ids%d/logits%d", model, n, n);
			if (!ids || !lg || lg->n_elems != ids->n_elems * V)
				continue;
			int len = (int)ids->shape[0];
			float *out = malloc((size_t)len * V * sizeof(float));
			struct hook_ctx hc = {&ref, model, runs[ri].chunk, L, 0, 0};
			/* ids0 in one feed with the hidden states checked; ids1 in three uneven feeds */
			int feeds[3] = {len, 0, 0}, n_feeds = 1;
			if (n == 1) {
				feeds[0] = 13;
				feeds[1] = (len - 13) / 2;
				feeds[2] = len - feeds[0] - feeds[1];
				n_feeds = 3;
			}
			st = feed_split(e, ids->data, len, feeds, n_feeds, out, n == 0 ? hidden_hook : NULL, &hc, &err);
			CHECK(st == TOAST_OK, "%s: %s", model, err.msg);
			if (n == 0)
				CHECK(hc.seen == (L + 1) * len, "%s: %d hidden-state rows compared", model, hc.seen);
			double e1 = rel_err(out, lg->data, (size_t)len * V);
			CHECK(e1 < 1e-4, "%s: ids%d chunk %d threads %d: logits error %.3g", model, n, runs[ri].chunk,
			      runs[ri].threads, e1);
			free(out);
		}
		test_greedy(e, &ref, dir, model, runs[ri].chunk);
		if (ri == 0)
			test_rewind(e, &ref, model);
		toast_engine_close(e);
	}
	toast_tensordir_close(&ref);
}

int main(int argc, char **argv)
{
	int n_run = 0;
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		if (argc < 2 || strcmp(argv[1], models[i]) == 0) {
			test_model(models[i]);
			n_run++;
		}
	CHECK(n_run > 0, "no model called %s", argv[1]);
	return test_done("test_golden");
}
