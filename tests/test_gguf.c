/*
 * test_gguf.c - single-file models:
 *   - round trip: every shared model converted to GGUF with every type, loaded, and run on the
 *     reference tokens: bf16 passes the normal check (logits within 1e-4, greedy tokens equal);
 *     quantised types stay within per-type bounds on the mean KL divergence and top-1 agreement
 *     (bounds below; the hybrid random models amplify any weight perturbation, so their bounds
 *     are wide: 0.2% noise on the embedding alone costs them KL 0.04);
 *   - load-time quantisation (--quant) of the safetensors directory within the same bounds;
 *   - metadata written and read back with the typed getters;
 *   - a corrupt or inconsistent GGUF (bad magic or version, truncation anywhere, absurd counts
 *     and lengths, offsets past the end, misaligned data, bad types, wrong shapes, random byte
 *     flips) gives an error with a message, never a crash (run under ASan in `make debug`).
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "models/convert.h"
#include "models/quantize.h"
#include <jansson.h>
#include "test.h"
#include "tokenizer/tok_gguf.h"
#include "util/fs.h"

static char tmpdir[256];

static const char *models[] = {"qwen3-tiny", "qwen3moe-tiny", "qwen35-tiny", "qwen35moe-tiny", "qwen3next-tiny",
			       "qwen3next-tiny-hubcfg"};

struct bound {
	enum toast_quant_mix mix;
	double kl_dense, top1_dense, kl_hybrid;
};

/* measured (dense / hybrid, mean KL): q8_0 0.0003 / 0.06, q6_k 0.001 / 0.06, q5_k_m 0.003 / 0.06,
 * 4-bit 0.016-0.053 / 0.36-0.53; bounds leave a margin */
static const struct bound bounds[] = {
	{TOAST_MIX_Q8_0, 0.002, 0.90, 0.12},   {TOAST_MIX_Q6_K, 0.005, 0.85, 0.12},
	{TOAST_MIX_Q5_K_M, 0.01, 0.75, 0.12},  {TOAST_MIX_Q4_K_M, 0.1, 0.40, 0.8},
	{TOAST_MIX_Q4_1, 0.1, 0.40, 0.8},      {TOAST_MIX_Q4_0, 0.1, 0.40, 0.8},
};

static double kl_of(const float *got, const float *ref, int V, bool *same)
{
	double mr = -INFINITY, mg = -INFINITY;
	int ar = 0, ag = 0;
	for (int i = 0; i < V; i++) {
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
	double kl = 0;
	for (int i = 0; i < V; i++) {
		double pr = exp(ref[i] - mr) / zr;
		kl += pr * ((ref[i] - mr - log(zr)) - (got[i] - mg - log(zg)));
	}
	*same = ar == ag;
	return kl;
}

struct eval {
	double rel, kl, top1;
	int greedy_ok, greedy_n;
};

/* run ids1 with all logits against logits1; greedy from ids0 when want_greedy */
static bool eval_model(const char *path, const char *quant, const struct toast_tensordir *ref, const char *refjson,
		       bool want_greedy, struct eval *ev)
{
	struct toast_error err = {0};
	struct toast_engine_opts o;
	toast_engine_opts_init(&o);
	o.backend = "cpu";
	o.quant = quant;
	struct toast_engine *e = NULL;
	if (toast_engine_open(path, &o, &e, &err) != TOAST_OK) {
		CHECK(0, "%s: open: %s", path, err.msg);
		return false;
	}
	const struct toast_tensor *ids = toast_tensordir_find(ref, "ids1"), *lg = toast_tensordir_find(ref, "logits1");
	int n = (int)ids->shape[0], V = toast_engine_info(e)->n_vocab;
	float *out = malloc((size_t)n * V * sizeof(float));
	struct toast_session *s = NULL;
	bool ok = toast_session_new(e, n + 64, &s, &err) == TOAST_OK &&
		  toast_session_feed(s, ids->data, n, out, &err) == TOAST_OK;
	CHECK(ok, "%s: feed: %s", path, err.msg);
	memset(ev, 0, sizeof(*ev));
	double mr = 0, md = 0, kl = 0;
	long top1 = 0;
	for (size_t i = 0; ok && i < (size_t)n * V; i++) {
		mr = fmax(mr, fabs(((const float *)lg->data)[i]));
		double d = fabs(out[i] - ((const float *)lg->data)[i]);
		md = isnan(d) ? INFINITY : fmax(md, d);
	}
	for (int t = 0; ok && t < n; t++) {
		bool same;
		kl += kl_of(out + (size_t)t * V, (const float *)lg->data + (size_t)t * V, V, &same);
		top1 += same;
	}
	ev->rel = md / mr;
	ev->kl = kl / n;
	ev->top1 = (double)top1 / n;
	if (ok && want_greedy) { /* cached greedy continuation of ids0 */
		char *text = NULL;
		toast_read_file(refjson, 1 << 24, &text, NULL, &err);
		const struct toast_tensor *i0 = toast_tensordir_find(ref, "ids0");
		toast_session_reset(s);
		ok = text && toast_session_feed(s, i0->data, (int)i0->shape[0], NULL, &err) == TOAST_OK;
		const char *g = text ? strstr(text, "\"greedy\"") : NULL;
		g = g ? strchr(g, '[') : NULL;
		while (ok && g && *g && *g != ']') {
			char *end;
			long want = strtol(g + 1, &end, 10);
			if (end == g + 1)
				break;
			const float *l = toast_session_logits(s);
			int best = 0;
			for (int i = 1; i < V; i++)
				if (l[i] > l[best])
					best = i;
			ev->greedy_ok += best == want;
			ev->greedy_n++;
			int32_t next = (int32_t)want;
			ok = toast_session_feed(s, &next, 1, NULL, &err) == TOAST_OK;
			g = end;
			while (*g == ' ' || *g == '\n')
				g++;
			if (*g != ',')
				break;
		}
		free(text);
	}
	free(out);
	toast_session_free(s);
	toast_engine_close(e);
	return ok;
}

static void test_roundtrip(void)
{
	for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]); mi++) {
		char dir[512], refp[600], refj[600], out[600];
		snprintf(dir, sizeof(dir), "%s/models/%s", test_data_dir(), models[mi]);
		snprintf(refp, sizeof(refp), "%s/reference.safetensors", dir);
		snprintf(refj, sizeof(refj), "%s/reference.json", dir);
		struct toast_tensordir ref;
		struct toast_error err = {0};
		if (toast_st_open_file(&ref, refp, &err) != TOAST_OK) {
			CHECK(0, "%s", err.msg);
			continue;
		}
		bool hybrid = strstr(models[mi], "next") || strstr(models[mi], "35");
		struct eval ev;
		snprintf(out, sizeof(out), "%s/%s.bf16.gguf", tmpdir, models[mi]);
		CHECK(toast_convert(dir, out, TOAST_MIX_BF16, &err) == TOAST_OK, "%s: convert bf16: %s", models[mi], err.msg);
		if (eval_model(out, NULL, &ref, refj, true, &ev)) {
			CHECK(ev.rel < 1e-4, "%s bf16 GGUF: logits error %.3g", models[mi], ev.rel);
			CHECK(ev.greedy_n == 40 && ev.greedy_ok == 40, "%s bf16 GGUF: greedy %d/%d", models[mi], ev.greedy_ok,
			      ev.greedy_n);
		}
		double kl_q8 = 0, kl_q4 = 1;
		bool same_weights = strstr(models[mi], "hubcfg") != NULL; /* as qwen3next-tiny: bf16 only */
		for (size_t bi = 0; !same_weights && bi < sizeof(bounds) / sizeof(bounds[0]); bi++) {
			const struct bound *b = &bounds[bi];
			const char *tn = toast_quant_mix_name(b->mix);
			snprintf(out, sizeof(out), "%s/%s.%s.gguf", tmpdir, models[mi], tn);
			CHECK(toast_convert(dir, out, b->mix, &err) == TOAST_OK, "%s: convert %s: %s", models[mi], tn, err.msg);
			if (!eval_model(out, NULL, &ref, refj, false, &ev))
				continue;
			double klb = hybrid ? b->kl_hybrid : b->kl_dense;
			printf("  %-22s %-7s mean KL %.5f  top-1 %5.1f%%\n", models[mi], tn, ev.kl, 100 * ev.top1);
			CHECK(ev.kl <= klb && (hybrid || ev.top1 >= b->top1_dense), "%s %s: mean KL %.4g (bound %g), top-1 %.3f",
			      models[mi], tn, ev.kl, klb, ev.top1);
			if (b->mix == TOAST_MIX_Q8_0)
				kl_q8 = ev.kl;
			if (b->mix == TOAST_MIX_Q4_0)
				kl_q4 = ev.kl;
			remove(out);
		}
		CHECK(kl_q8 < kl_q4, "%s: Q8_0 (KL %.4g) should be closer than Q4_0 (%.4g)", models[mi], kl_q8, kl_q4);
		/* load-time quantisation of the safetensors directory */
		if (!same_weights && eval_model(dir, "q8_0", &ref, refj, false, &ev))
			CHECK(ev.kl <= (hybrid ? bounds[0].kl_hybrid : bounds[0].kl_dense), "%s --quant q8_0: mean KL %.4g",
			      models[mi], ev.kl);
		toast_tensordir_close(&ref);
	}
}

/* the real-vocabulary model: tokenizer metadata converted, same logits from GGUF and safetensors */
static void test_vocab_model(void)
{
	char dir[512], out[600];
	snprintf(dir, sizeof(dir), "%s/models/qwen3next-vocab", test_data_dir());
	snprintf(out, sizeof(out), "%s/vocab.gguf", tmpdir);
	struct toast_error err = {0};
	CHECK(toast_convert(dir, out, TOAST_MIX_BF16, &err) == TOAST_OK, "qwen3next-vocab: %s", err.msg);
	struct toast_gguf g;
	if (toast_gguf_open(&g, out, &err) != TOAST_OK) {
		CHECK(0, "%s", err.msg);
		return;
	}
	const char *s;
	size_t n;
	const struct toast_gguf_kv *tok = toast_gguf_find(&g, "tokenizer.ggml.tokens");
	const struct toast_gguf_kv *merges = toast_gguf_find(&g, "tokenizer.ggml.merges");
	CHECK(tok && tok->type == TOAST_GGUF_ARRAY && tok->arr_type == TOAST_GGUF_STRING && tok->n == 151936,
	      "tokens: %llu", tok ? (unsigned long long)tok->n : 0ull);
	CHECK(merges && merges->n == 151387, "merges");
	toast_gguf_get_str(&g, "tokenizer.ggml.pre", true, &s, &n, &err);
	CHECK(s && n == 5 && memcmp(s, "qwen2", 5) == 0, "pre-tokenizer name");
	toast_gguf_get_str(&g, "tokenizer.chat_template", true, &s, &n, &err);
	char cfgp[600];
	snprintf(cfgp, sizeof(cfgp), "%s/tokenizer_config.json", dir);
	json_t *cfg = json_load_file(cfgp, 0, NULL);
	const char *want = json_string_value(json_object_get(cfg, "chat_template"));
	CHECK(s && want && n == strlen(want) && memcmp(s, want, n) == 0, "chat template differs");
	json_decref(cfg);
	int64_t eos = -1;
	toast_gguf_get_int(&g, "tokenizer.ggml.eos_token_id", true, -1, 0, 1 << 24, &eos, &err);
	CHECK(eos == 151645, "eos %lld", (long long)eos);
	const struct toast_gguf_kv *tt = toast_gguf_find(&g, "tokenizer.ggml.token_type");
	CHECK(tt && tt->n == 151936 && toast_gguf_arr_int(tt, 151644) == 3 && toast_gguf_arr_int(tt, 151667) == 4 &&
		      toast_gguf_arr_int(tt, 100) == 1 && toast_gguf_arr_int(tt, 151900) == 5,
	      "token types");
	size_t pos = 0;
	for (int i = 0; tok && i <= 151644; i++)
		toast_gguf_next_str(tok, &pos, &s, &n);
	CHECK(tok && n == 12 && memcmp(s, "<|im_start|>", 12) == 0, "token 151644");
	toast_gguf_close(&g);
	/* the tokenizer rebuilt from the GGUF encodes every upstream case as tokenizer.json does, and
	 * renders the chat template the same */
	struct toast_engine *eg = NULL;
	toast_engine_open(out, NULL, &eg, &err);
	const struct toast_tokenizer *tk = eg ? toast_engine_tokenizer(eg) : NULL;
	CHECK(tk, "GGUF tokenizer: %s", err.msg);
	char casep[600];
	snprintf(casep, sizeof(casep), "%s/tokenizer/qwen3-cases.jsonl", test_data_dir());
	FILE *f = fopen(casep, "r");
	CHECK(f, "%s is missing", casep);
	char *line = NULL;
	size_t cap = 0;
	int n_cases = 0, bad = 0;
	while (tk && f && getline(&line, &cap, f) > 0) {
		json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL), *t = json_object_get(j, "text"), *ids = json_object_get(j, "ids");
		int32_t *got = NULL;
		int n_got = 0;
		bool ok = json_is_string(t) && toast_tok_encode(tk, json_string_value(t), json_string_length(t), &got, &n_got,
								&err) == TOAST_OK &&
			  (size_t)n_got == json_array_size(ids);
		for (int i = 0; ok && i < n_got; i++)
			ok = got[i] == json_integer_value(json_array_get(ids, (size_t)i));
		bad += !ok;
		n_cases++;
		free(got);
		json_decref(j);
	}
	free(line);
	if (f)
		fclose(f);
	CHECK(n_cases >= 200 && bad == 0, "GGUF tokenizer: %d of %d upstream cases differ", bad, n_cases);
	struct toast_tokenizer *tj = NULL;
	toast_tok_load(dir, &tj, &err);
	struct toast_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "What is 2+2?"}};
	struct toast_chat_opts co = {.add_generation_prompt = true, .enable_thinking = -1};
	char *r1 = NULL, *r2 = NULL;
	CHECK(tk && tj && toast_chat_render(tk, msgs, 2, &co, &r1, &err) == TOAST_OK &&
		      toast_chat_render(tj, msgs, 2, &co, &r2, &err) == TOAST_OK && strcmp(r1, r2) == 0,
	      "chat template from GGUF renders differently: %s", err.msg);
	CHECK(tk && toast_tok_is_eog(tk, 151645) && toast_tok_is_eog(tk, 151643), "end-of-generation tokens");
	free(r1);
	free(r2);
	toast_tok_free(tj);
	toast_engine_close(eg);
	/* same logits as from the directory */
	struct toast_engine *e1 = NULL, *e2 = NULL;
	struct toast_session *s1 = NULL, *s2 = NULL;
	int32_t ids[] = {9707, 11, 1879, 0, 151644, 872, 198, 151645};
	toast_engine_open(dir, NULL, &e1, &err);
	toast_engine_open(out, NULL, &e2, &err);
	CHECK(e1 && e2, "open: %s", err.msg);
	if (e1 && e2 && toast_session_new(e1, 16, &s1, &err) == TOAST_OK && toast_session_new(e2, 16, &s2, &err) == TOAST_OK &&
	    toast_session_feed(s1, ids, 8, NULL, &err) == TOAST_OK && toast_session_feed(s2, ids, 8, NULL, &err) == TOAST_OK) {
		const float *a = toast_session_logits(s1), *b = toast_session_logits(s2);
		double md = 0;
		for (int i = 0; i < 151936; i++)
			md = fmax(md, fabs(a[i] - b[i]));
		CHECK(md < 1e-3, "qwen3next-vocab: GGUF vs safetensors logits differ by %g", md);
	}
	toast_session_free(s1);
	toast_session_free(s2);
	toast_engine_close(e1);
	toast_engine_close(e2);
}

static double feed_diff(const char *a_path, const char *b_path, const int32_t *ids, int n)
{
	struct toast_engine *ea = NULL, *eb = NULL;
	struct toast_session *sa = NULL, *sb = NULL;
	struct toast_error err = {0};
	double md = INFINITY;
	if (toast_engine_open(a_path, NULL, &ea, &err) == TOAST_OK && toast_engine_open(b_path, NULL, &eb, &err) == TOAST_OK &&
	    toast_session_new(ea, n, &sa, &err) == TOAST_OK && toast_session_new(eb, n, &sb, &err) == TOAST_OK &&
	    toast_session_feed(sa, ids, n, NULL, &err) == TOAST_OK && toast_session_feed(sb, ids, n, NULL, &err) == TOAST_OK) {
		const float *la = toast_session_logits(sa), *lb = toast_session_logits(sb);
		md = 0;
		for (int i = 0; i < toast_engine_info(ea)->n_vocab; i++)
			md = fmax(md, fabs(la[i] - lb[i]));
	}
	CHECK(isfinite(md), "feed: %s", err.msg);
	toast_session_free(sa);
	toast_session_free(sb);
	toast_engine_close(ea);
	toast_engine_close(eb);
	return md;
}

/* a llama directory (qwen3-tiny's weights as model_type llama) gives the same logits from its
 * safetensors and from its GGUF, whose q/k rows the converter permutes for ggml's RoPE and the
 * loader permutes back */
static void test_llama_roundtrip(void)
{
	char src[512], dir[600], p[700], out[700];
	snprintf(src, sizeof(src), "%s/models/qwen3-tiny", test_data_dir());
	snprintf(dir, sizeof(dir), "%s/llama-tiny", tmpdir);
	mkdir(dir, 0755);
	snprintf(p, sizeof(p), "%s/config.json", src);
	json_t *cfg = json_load_file(p, 0, NULL);
	json_object_set_new(cfg, "model_type", json_string("llama"));
	snprintf(p, sizeof(p), "%s/config.json", dir);
	CHECK(cfg && json_dump_file(cfg, p, 0) == 0, "llama config");
	json_decref(cfg);
	char sp[700], *data = NULL;
	size_t len = 0;
	struct toast_error err = {0};
	snprintf(sp, sizeof(sp), "%s/model.safetensors", src);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	FILE *f = toast_read_file(sp, 64u << 20, &data, &len, &err) == TOAST_OK ? fopen(p, "wb") : NULL;
	CHECK(f && fwrite(data, 1, len, f) == len && fclose(f) == 0, "copy weights");
	free(data);
	snprintf(out, sizeof(out), "%s/llama-tiny.gguf", tmpdir);
	CHECK(toast_convert(dir, out, TOAST_MIX_BF16, &err) == TOAST_OK, "convert llama: %s", err.msg);
	/* the stored q rows are ggml's order: GGUF row 1 is the Hugging Face row head_dim/2 */
	struct toast_gguf g;
	struct toast_tensordir st;
	if (toast_gguf_open(&g, out, &err) == TOAST_OK && toast_st_open_dir(&st, dir, &err) == TOAST_OK) {
		const struct toast_gguf_tensor *q = toast_gguf_find_tensor(&g, "blk.0.attn_q.weight");
		const struct toast_tensor *hq = toast_tensordir_find(&st, "model.layers.0.self_attn.q_proj.weight");
		CHECK(q && hq && q->dtype == TOAST_DT_BF16 && q->ne[0] == 128 &&
			      memcmp((const char *)q->data + 1 * 128 * 2, (const char *)hq->data + 32 * 128 * 2, 256) == 0 &&
			      memcmp((const char *)q->data + 2 * 128 * 2, (const char *)hq->data + 1 * 128 * 2, 256) == 0,
		      "llama q rows are not in ggml's RoPE order");
		toast_tensordir_close(&st);
		toast_gguf_close(&g);
	} else {
		CHECK(0, "%s", err.msg);
	}
	int32_t ids[] = {1, 5, 77, 300, 12, 900, 4, 4, 18, 250, 600, 3};
	double md = feed_diff(dir, out, ids, 12);
	CHECK(md < 1e-3, "llama: GGUF and safetensors logits differ by %g", md);
	remove(out);
	snprintf(p, sizeof(p), "%s/config.json", dir);
	remove(p);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	remove(p);
	rmdir(dir);
}

/* every tokenizer.ggml.pre name maps to a pipeline that maps back to the same name */
static void test_pre_names(void)
{
	const char *names[] = {"qwen2", "qwen35", "llama-bpe", "smollm", "gpt2"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const struct toast_tok_pre *p = toast_tok_pre_by_name(names[i], strlen(names[i]));
		json_t *pre = p ? json_loads(p->pre_json, 0, NULL) : NULL;
		json_t *norm = p && p->norm_json ? json_loads(p->norm_json, 0, NULL) : NULL;
		const struct toast_tok_pre *back = pre ? toast_tok_pre_match(pre, norm) : NULL;
		CHECK(p && pre && back == p, "pre-tokenizer %s does not round-trip", names[i]);
		json_decref(pre);
		json_decref(norm);
	}
	CHECK(!toast_tok_pre_by_name("no-such-pre", 11), "unknown name");
}

static void test_metadata(void)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/meta.gguf", tmpdir);
	struct toast_gguf_writer *w = NULL;
	struct toast_error err = {0};
	toast_gguf_writer_new(p, &w, &err);
	toast_gguf_put_u32(w, "a.u32", 4000000000u);
	toast_gguf_put_i32(w, "a.i32", -7);
	toast_gguf_put_f32(w, "a.f32", 0.25f);
	toast_gguf_put_bool(w, "a.bool", true);
	toast_gguf_put_str(w, "a.str", "hello", 5);
	const char *ss[] = {"x", "", "zz"};
	size_t sl[] = {1, 0, 2};
	toast_gguf_put_str_arr(w, "a.strs", ss, sl, 3);
	int32_t iv[] = {1, -2, 3};
	toast_gguf_put_i32_arr(w, "a.ints", iv, 3);
	int64_t shape[2] = {3, 32};
	toast_gguf_add_tensor(w, "t", TOAST_DT_Q8_0, 2, shape);
	uint8_t blocks[3 * 34] = {0};
	CHECK(toast_gguf_writer_begin(w, &err) == TOAST_OK && toast_gguf_write_tensor(w, blocks, sizeof(blocks), &err) == TOAST_OK &&
		      toast_gguf_writer_finish(w, &err) == TOAST_OK,
	      "write: %s", err.msg);
	toast_gguf_writer_free(w);
	struct toast_gguf g;
	if (toast_gguf_open(&g, p, &err) != TOAST_OK) {
		CHECK(0, "read back: %s", err.msg);
		return;
	}
	int64_t v;
	float f;
	bool bo;
	const char *s;
	size_t n;
	CHECK(toast_gguf_get_int(&g, "a.u32", true, 0, 0, INT64_MAX, &v, &err) == TOAST_OK && v == 4000000000ll, "u32");
	CHECK(toast_gguf_get_int(&g, "a.u32", true, 0, 0, 100, &v, &err) == TOAST_ERR_FORMAT && strstr(err.msg, "a.u32"),
	      "range error names the key: %s", err.msg);
	CHECK(toast_gguf_get_int(&g, "a.i32", true, 0, -10, 10, &v, &err) == TOAST_OK && v == -7, "i32");
	CHECK(toast_gguf_get_f32(&g, "a.f32", true, 0, &f, &err) == TOAST_OK && f == 0.25f, "f32");
	CHECK(toast_gguf_get_bool(&g, "a.bool", true, false, &bo, &err) == TOAST_OK && bo, "bool");
	CHECK(toast_gguf_get_str(&g, "a.str", true, &s, &n, &err) == TOAST_OK && n == 5 && !memcmp(s, "hello", 5), "str");
	CHECK(toast_gguf_get_int(&g, "a.str", true, 0, 0, 1, &v, &err) == TOAST_ERR_FORMAT, "type error");
	CHECK(toast_gguf_get_int(&g, "missing", true, 0, 0, 1, &v, &err) == TOAST_ERR_FORMAT, "missing required");
	CHECK(toast_gguf_get_int(&g, "missing", false, 5, 0, 10, &v, &err) == TOAST_OK && v == 5, "default");
	const struct toast_gguf_kv *kv = toast_gguf_find(&g, "a.strs");
	size_t pos = 0;
	toast_gguf_next_str(kv, &pos, &s, &n);
	toast_gguf_next_str(kv, &pos, &s, &n);
	toast_gguf_next_str(kv, &pos, &s, &n);
	CHECK(kv->n == 3 && n == 2 && !memcmp(s, "zz", 2), "string array");
	kv = toast_gguf_find(&g, "a.ints");
	CHECK(kv->n == 3 && toast_gguf_arr_int(kv, 1) == -2, "int array");
	const struct toast_gguf_tensor *t = toast_gguf_find_tensor(&g, "t");
	CHECK(t && t->dtype == TOAST_DT_Q8_0 && t->ne[0] == 32 && t->ne[1] == 3 && t->n_bytes == 102 &&
		      (size_t)((const uint8_t *)t->data - (const uint8_t *)g.map.data) % 32 == 0,
	      "tensor info");
	toast_gguf_close(&g);
}

/* ---- corruption ---- */

static uint8_t *file_buf;
static size_t file_len;

struct layout { /* where the fields of a GGUF header are */
	size_t n_tensors, n_kv, key0_len;
	size_t t_ndims[8], t_ne[8], t_type[8], t_off[8];
	int n_t;
	int q; /* index (< 8) of a 2-D Q8_0 tensor */
};

static uint64_t rd(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void wr(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> 8 * i);
}

/* an independent walk of a (valid) file's header */
static void layout_of(const uint8_t *b, struct layout *L)
{
	memset(L, 0, sizeof(*L));
	L->n_tensors = 8;
	L->n_kv = 16;
	L->key0_len = 24;
	size_t p = 24;
	uint64_t nt = rd(b + 8, 8), nkv = rd(b + 16, 8);
	static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
	for (uint64_t i = 0; i < nkv; i++) {
		p += 8 + rd(b + p, 8);
		uint32_t t = (uint32_t)rd(b + p, 4);
		p += 4;
		if (t == 8) {
			p += 8 + rd(b + p, 8);
		} else if (t == 9) {
			uint32_t at = (uint32_t)rd(b + p, 4);
			uint64_t n = rd(b + p + 4, 8);
			p += 12;
			for (uint64_t j = 0; j < n; j++)
				p += at == 8 ? 8 + rd(b + p, 8) : (uint64_t)sz[at];
		} else {
			p += (size_t)sz[t];
		}
	}
	for (uint64_t i = 0; i < nt; i++) {
		p += 8 + rd(b + p, 8);
		int k = L->n_t < 8 ? L->n_t++ : 7;
		L->t_ndims[k] = p;
		uint32_t nd = (uint32_t)rd(b + p, 4);
		L->t_ne[k] = p + 4;
		p += 4 + 8 * (size_t)nd;
		L->t_type[k] = p;
		L->t_off[k] = p + 4;
		if (nd == 2 && rd(b + p, 4) == 8 && !L->q)
			L->q = k;
		p += 12;
	}
}

static void expect_error(const char *what, const uint8_t *b, size_t n, const char *msg_part)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/bad.gguf", tmpdir);
	FILE *f = fopen(p, "wb");
	fwrite(b, 1, n, f);
	fclose(f);
	struct toast_error err = {0};
	struct toast_engine *e = NULL;
	struct toast_engine_opts o;
	toast_engine_opts_init(&o);
	o.backend = "cpu";
	enum toast_status st = toast_engine_open(p, &o, &e, &err);
	CHECK(st != TOAST_OK && err.msg[0], "%s: loaded (status %d)", what, st);
	if (msg_part)
		CHECK(strstr(err.msg, msg_part), "%s: message \"%s\" lacks \"%s\"", what, err.msg, msg_part);
	toast_engine_close(e);
}

static void test_corrupt(void)
{
	char p[600], dir[512];
	snprintf(dir, sizeof(dir), "%s/models/qwen3-tiny", test_data_dir());
	snprintf(p, sizeof(p), "%s/good.gguf", tmpdir);
	struct toast_error err = {0};
	if (toast_convert(dir, p, TOAST_MIX_Q8_0, &err) != TOAST_OK ||
	    toast_read_file(p, 64u << 20, (char **)&file_buf, &file_len, &err) != TOAST_OK) {
		CHECK(0, "%s", err.msg);
		return;
	}
	uint8_t *b = malloc(file_len);
	struct layout L;
	layout_of(file_buf, &L);
#define RESET() memcpy(b, file_buf, file_len)
	RESET();
	b[0] = 'X';
	expect_error("bad magic", b, file_len, "magic");
	RESET();
	wr(b + 4, 99, 4);
	expect_error("version 99", b, file_len, "version");
	RESET();
	wr(b + 4, 0x03000000, 4);
	expect_error("big-endian", b, file_len, "big-endian");
	RESET();
	wr(b + 8, 1ull << 40, 8);
	expect_error("absurd tensor count", b, file_len, "absurd");
	RESET();
	wr(b + 16, 1ull << 62, 8);
	expect_error("absurd metadata count", b, file_len, "absurd");
	RESET();
	wr(b + 24, 1ull << 50, 8);
	expect_error("absurd key length", b, file_len, NULL);
	RESET();
	wr(b + L.t_off[2], rd(b + L.t_off[2], 8) + 1ull * file_len, 8);
	expect_error("offset past the end", b, file_len, "past the end");
	RESET();
	wr(b + L.t_off[2], rd(b + L.t_off[2], 8) + 4, 8);
	expect_error("misaligned data", b, file_len, "aligned");
	RESET();
	wr(b + L.t_type[1], 77, 4);
	expect_error("unknown ggml type", b, file_len, "type 77");
	RESET();
	wr(b + L.t_ndims[1], 5, 4);
	expect_error("5 dimensions", b, file_len, "dimensions");
	RESET();
	CHECK(L.q > 0, "no Q8_0 matrix among the first tensors");
	wr(b + L.t_ne[L.q], rd(b + L.t_ne[L.q], 8) + 1, 8);
	expect_error("row not whole blocks", b, file_len, "blocks");
	RESET();
	wr(b + L.t_ne[L.q] + 8, 1000 * rd(b + L.t_ne[L.q] + 8, 8), 8);
	expect_error("rows past the end", b, file_len, "past the end");
	RESET();
	wr(b + L.t_ne[L.q], 32, 8); /* a consistent file whose tensor has the wrong shape */
	expect_error("wrong shape", b, file_len, "shape");
	RESET();
	wr(b + L.t_type[3], 26, 4); /* I32: a type the engine cannot bind */
	expect_error("unusable type", b, file_len, NULL);
	RESET();
	uint8_t *nm = NULL;
	for (size_t i = 0; !nm && i + 19 < L.t_off[L.n_t - 1]; i++)
		if (memcmp(b + i, "blk.0.attn_k.weight", 19) == 0)
			nm = b + i;
	CHECK(nm != NULL, "tensor name not found in the header");
	if (nm) {
		memcpy(nm, "blk.0.attn_k.wxight", 19); /* a layer tensor the engine has no use for */
		expect_error("unknown layer tensor", b, file_len, "not supported");
	}
	/* truncation anywhere */
	for (size_t n = 0; n < file_len; n += n < 512 ? 7 : file_len / 41)
		expect_error("truncated", file_buf, n, NULL);
	/* random byte flips in the header: an error or a model, never a crash */
	uint64_t rng = 12345;
	size_t hdr = L.t_off[L.n_t - 1] + 8;
	for (int it = 0; it < 300; it++) {
		RESET();
		for (int k = 0; k < 3; k++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			b[(rng >> 33) % hdr] ^= (uint8_t)(1u << ((rng >> 20) % 8));
		}
		snprintf(p, sizeof(p), "%s/fuzz.gguf", tmpdir);
		FILE *f = fopen(p, "wb");
		fwrite(b, 1, file_len, f);
		fclose(f);
		struct toast_engine *e = NULL;
		struct toast_engine_opts o;
		toast_engine_opts_init(&o);
		o.backend = "cpu";
		if (toast_engine_open(p, &o, &e, &err) == TOAST_OK) {
			struct toast_session *s = NULL;
			int32_t ids[] = {1, 2, 3};
			if (toast_session_new(e, 8, &s, &err) == TOAST_OK)
				toast_session_feed(s, ids, 3, NULL, &err);
			toast_session_free(s);
		} else {
			CHECK(err.msg[0], "fuzz: an error without a message");
		}
		toast_engine_close(e);
	}
	free(b);
	free(file_buf);
}

/* a synthetic model (toasted bench --type q4_k_m) gets the types a converted Q4_K_M file has:
 * llama.cpp's rule, written out here, gives Q6_K to the output and, in the layers il < n/8,
 * il >= 7n/8 and (il - n/8) % 3 == 2 (0, 3, 6 and 7 of 8), to v_proj and every down_proj; the
 * rest of the matrices are Q4_K and the router stays BF16. The tiny hybrid model's widths are
 * raised to 256 so that rows are whole K-quant blocks. */
static void test_synthetic_mix(void)
{
	char path[512], *text = NULL, *cfg = NULL;
	struct toast_error err = {0};
	snprintf(path, sizeof(path), "%s/models/qwen3next-tiny/config.json", test_data_dir());
	CHECK(toast_read_file(path, 1 << 20, &text, NULL, &err) == TOAST_OK, "%s: %s", path, err.msg);
	json_t *root = text ? json_loads(text, 0, NULL) : NULL;
	if (root) {
		const char *wide[] = {"hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
				      "intermediate_size"};
		for (size_t i = 0; i < sizeof(wide) / sizeof(wide[0]); i++)
			json_object_set_new(root, wide[i], json_integer(256));
		json_object_set_new(root, "linear_value_head_dim", json_integer(64)); /* out_proj: 4 heads of 64 */
		cfg = json_dumps(root, 0);
		json_decref(root);
	}
	struct toast_backend *be = NULL;
	struct toast_model m;
	bool ok = cfg && toast_backend_cpu_new(1, &be, &err) == TOAST_OK &&
		  toast_model_load_synthetic(&m, cfg, 0, TOAST_DT_BF16, TOAST_MIX_Q4_K_M, be, &err) == TOAST_OK;
	CHECK(ok, "synthetic q4_k_m: %s", err.msg);
	if (ok) {
		CHECK(m.hp.n_layer == 8 && m.hp.n_embd == 256, "synthetic q4_k_m: %d layers of %d", m.hp.n_layer,
		      m.hp.n_embd);
		CHECK(m.output.type == TOAST_DT_Q6_K, "synthetic q4_k_m: output %s", toast_dtype_name(m.output.type));
		CHECK(m.tok_embd.type == TOAST_DT_Q4_K, "synthetic q4_k_m: embedding %s", toast_dtype_name(m.tok_embd.type));
		for (int il = 0; il < m.hp.n_layer && il < 8; il++) {
			const struct toast_layer *l = &m.layers[il];
			bool more = il == 0 || il == 3 || il == 6 || il == 7;
			enum toast_dtype want = more ? TOAST_DT_Q6_K : TOAST_DT_Q4_K;
			CHECK(l->down_exps.w[0].type == want && l->sh_down.type == want, "synthetic q4_k_m layer %d: down %s / %s",
			      il, toast_dtype_name(l->down_exps.w[0].type), toast_dtype_name(l->sh_down.type));
			CHECK(l->gate_exps.w[0].type == TOAST_DT_Q4_K && l->sh_up.type == TOAST_DT_Q4_K,
			      "synthetic q4_k_m layer %d: gate %s", il, toast_dtype_name(l->gate_exps.w[0].type));
			CHECK(l->router.type == TOAST_DT_BF16, "synthetic q4_k_m layer %d: router %s", il,
			      toast_dtype_name(l->router.type));
			if (m.hp.layer_is_attn[il])
				CHECK(l->wv.type == want && l->wq.type == TOAST_DT_Q4_K, "synthetic q4_k_m layer %d: v %s q %s", il,
				      toast_dtype_name(l->wv.type), toast_dtype_name(l->wq.type));
			else
				CHECK(l->ssm_out.type == TOAST_DT_Q4_K, "synthetic q4_k_m layer %d: out_proj %s", il,
				      toast_dtype_name(l->ssm_out.type));
		}
		toast_model_unload(&m);
	}
	toast_backend_free(be);
	free(cfg);
	free(text);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/toasted-gguf-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_pre_names();
	test_synthetic_mix();
	test_llama_roundtrip();
	test_metadata();
	test_corrupt();
	test_roundtrip();
	test_vocab_model();
	DIR *d = opendir(tmpdir);
	for (struct dirent *de; d && (de = readdir(d));) {
		char p[600];
		snprintf(p, sizeof(p), "%s/%s", tmpdir, de->d_name);
		if (de->d_name[0] != '.')
			remove(p);
	}
	if (d)
		closedir(d);
	rmdir(tmpdir);
	return test_done("test_gguf");
}
