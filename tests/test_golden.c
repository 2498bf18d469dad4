/*
 * test_golden.c - every shared model against its upstream reference, on the CPU backend:
 * per-layer hidden states of ids0 (so a regression names its layer), full logits of every
 * idsN for several chunk sizes and thread counts, and the cached greedy continuation.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "format/safetensors.h"
#include "test.h"
#include "util/fs.h"

static const char *models[] = {"qwen3-tiny", "qwen3moe-tiny", "qwen35-tiny", "qwen35moe-tiny", "qwen3next-tiny",
			       "qwen3next-tiny-hubcfg"};

struct hook_ctx {
	const struct toast_tensordir *ref;
	const char *model;
	int n_layer;
	int seen;
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

static void hidden_hook(void *ud, int index, const float *x, int T, int n)
{
	struct hook_ctx *c = ud;
	char name[32];
	snprintf(name, sizeof(name), "hidden0.%d", index);
	const struct toast_tensor *t = toast_tensordir_find(c->ref, name);
	CHECK(t && t->n_elems == (int64_t)T * n, "%s: reference %s missing or wrong size", c->model, name);
	if (!t || t->n_elems != (int64_t)T * n)
		return;
	double e = rel_err(x, t->data, (size_t)T * n);
	CHECK(e < 1e-4, "%s: hidden state %d (%s) error %.3g", c->model, index,
	      index == 0 ? "embedding" : index == c->n_layer ? "final norm" : "after a layer", e);
	c->seen++;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
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
	static const int chunks[] = {64, 1, 7, 300};
	static const int threads[] = {2, 1, 2, 1};
	for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
		struct toast_engine_opts o;
		toast_engine_opts_init(&o);
		o.backend = "cpu";
		o.chunk = chunks[ci];
		o.n_threads = threads[ci];
		struct toast_engine *e = NULL;
		st = toast_engine_open(dir, &o, &e, &err);
		CHECK(st == TOAST_OK, "%s: %s", model, err.msg);
		if (st != TOAST_OK)
			break;
		int V = toast_engine_info(e)->n_vocab;
		for (int n = 0; n < 2; n++) {
			char nm[16];
			snprintf(nm, sizeof(nm), "ids%d", n);
			const struct toast_tensor *ids = toast_tensordir_find(&ref, nm);
			snprintf(nm, sizeof(nm), "logits%d", n);
			const struct toast_tensor *lg = toast_tensordir_find(&ref, nm);
			CHECK(ids && lg, "%s: reference lacks ids%d/logits%d", model, n, n);
			if (!ids || !lg)
				continue;
			int len = (int)ids->shape[0];
			struct toast_session *s = NULL;
			float *out = malloc((size_t)len * V * sizeof(float));
			CHECK(toast_session_new(e, len, &s, &err) == TOAST_OK, "%s", err.msg);
			struct hook_ctx hc = {&ref, model, toast_engine_info(e)->n_layer, 0};
			/* hidden states: ids0 in one pass */
			bool hook = n == 0 && chunks[ci] >= len;
			st = toast_session_feed_hook(s, ids->data, len, out, hook ? hidden_hook : NULL, &hc, &err);
			CHECK(st == TOAST_OK, "%s: %s", model, err.msg);
			if (hook)
				CHECK(hc.seen == hc.n_layer + 1, "%s: %d hidden states compared", model, hc.seen);
			double e1 = rel_err(out, lg->data, (size_t)len * V);
			CHECK(e1 < 1e-4, "%s: ids%d chunk %d threads %d: logits error %.3g", model, n, chunks[ci], threads[ci], e1);
			free(out);
			toast_session_free(s);
		}
		/* greedy with the cache */
		snprintf(path, sizeof(path), "%s/reference.json", dir);
		json_t *doc = json_load_file(path, 0, NULL);
		json_t *greedy = json_object_get(doc, "greedy");
		const struct toast_tensor *ids = toast_tensordir_find(&ref, "ids0");
		CHECK(json_is_array(greedy) && ids, "%s: reference.json has no greedy list", model);
		if (json_is_array(greedy) && ids) {
			int n_gen = (int)json_array_size(greedy), len = (int)ids->shape[0], ok = 0;
			struct toast_session *s = NULL;
			CHECK(toast_session_new(e, len + n_gen, &s, &err) == TOAST_OK, "%s", err.msg);
			st = toast_session_feed(s, ids->data, len, NULL, &err);
			for (int i = 0; i < n_gen && st == TOAST_OK; i++) {
				int32_t tok = argmax(toast_session_logits(s), V);
				ok += tok == json_integer_value(json_array_get(greedy, (size_t)i));
				st = toast_session_feed(s, &tok, 1, NULL, &err);
			}
			CHECK(st == TOAST_OK && ok == n_gen, "%s: chunk %d: %d/%d greedy tokens match", model, chunks[ci], ok, n_gen);
			toast_session_free(s);
		}
		json_decref(doc);
		toast_engine_close(e);
	}
	toast_tensordir_close(&ref);
}

int main(int argc, char **argv)
{
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
		if (argc < 2 || strcmp(argv[1], models[i]) == 0)
			test_model(models[i]);
	return test_done("test_golden");
}
