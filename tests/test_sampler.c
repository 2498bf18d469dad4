/*
 * test_sampler.c - sampling and generation:
 * - temperature 0 is argmax (lowest id on ties), with and without a repetition penalty;
 * - a fixed seed reproduces the same tokens, another seed does not;
 * - top-k, top-p and min-p keep exactly the tokens worked out by hand on small distributions,
 *   and draws follow the renormalised probabilities;
 * - a 152k vocabulary with a nucleus wider than the partial selection still samples correctly;
 * - sampling from the few largest logits (toast_sampler_top_need / _sample_top, what the GPU
 *   sends) chooses exactly the tokens sampling from all of them does, ties, -0, NaN and -inf
 *   included, for greedy, top-k, top-p, min-p, temperatures and a repetition penalty over 1
 *   (from top_k + repeat_last_n); the need is 0 when a penalty under 1, a top-k over the
 *   limit or the lack of one makes every logit matter; sessions sharing an engine keep
 *   their logits when another feeds (the pending-logits hand-off);
 * - the draw a backend makes (draw.h) chooses as the sampler does, with one uniform a token,
 *   from the top or from every logit (top-k 0, a penalty under 1: toast_pick_host), and the
 *   draw from every logit (toast_draw_wide) is the one its definition gives, worked out plainly;
 * - toast_generate on models/qwen3next-vocab: greedy chat case 0 exactly, text streamed in
 *   whole characters, stop strings never emitted (and a partial match that fails loses
 *   nothing), the context limit ends generation with every token fed, the session holds prompt
 *   + generated tokens, a prompt that does not fit is TOAST_ERR_CTX_FULL.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "test.h"
#include "toasted.h"
#include "util/utf8.h"

static struct toast_sampler *mk_from(const struct toast_sampling *s, int n_vocab)
{
	struct toast_sampler *sp = NULL;
	struct toast_error err = {0};
	CHECK(toast_sampler_new(s, n_vocab, &sp, &err) == TOAST_OK, "%s", err.msg);
	return sp;
}

/* the defaults (toast_sampling_init) with these settings */
static struct toast_sampling sampling(float temp, int top_k, float top_p, float min_p, float penalty, uint64_t seed)
{
	struct toast_sampling s;
	toast_sampling_init(&s);
	s.temperature = temp;
	s.top_k = top_k;
	s.top_p = top_p;
	s.min_p = min_p;
	s.repeat_penalty = penalty;
	s.seed = seed;
	return s;
}

static struct toast_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed, int n_vocab)
{
	struct toast_sampling s = sampling(temp, top_k, top_p, min_p, 1, seed);
	return mk_from(&s, n_vocab);
}

/* Draw n times; counts[id]++. */
static void draw(struct toast_sampler *sp, const float *logits, int n, int *counts)
{
	for (int i = 0; i < n; i++)
		counts[toast_sampler_sample(sp, logits)]++;
}

static void test_greedy(void)
{
	float l[1000];
	uint64_t x = 7;
	for (int i = 0; i < 1000; i++) {
		x = x * 6364136223846793005ull + 1;
		l[i] = (float)((x >> 40) % 1000) / 100.0f;
	}
	int best = 0;
	for (int i = 1; i < 1000; i++)
		if (l[i] > l[best])
			best = i;
	struct toast_sampler *sp = mk(0, 20, 0.8f, 0.1f, 1, 1000);
	for (int i = 0; i < 5; i++)
		CHECK(toast_sampler_sample(sp, l) == best, "temperature 0 is not argmax");
	toast_sampler_free(sp);
	float tie[4] = {1, 3, 3, 0};
	sp = mk(0, 0, 1, 0, 1, 4);
	CHECK(toast_sampler_sample(sp, tie) == 1, "ties go to the lowest id");
	toast_sampler_free(sp);
	/* repetition penalty: a seen positive logit is divided, a negative one multiplied */
	struct toast_sampling s;
	toast_sampling_init(&s);
	s.temperature = 0;
	s.repeat_penalty = 2;
	s.repeat_last_n = 4;
	struct toast_error err = {0};
	CHECK(toast_sampler_new(&s, 4, &sp, &err) == TOAST_OK, "%s", err.msg);
	float pen[4] = {2.0f, 1.5f, -1.0f, -0.6f};
	CHECK(toast_sampler_sample(sp, pen) == 0, "before the penalty");
	toast_sampler_accept(sp, 0);
	CHECK(toast_sampler_sample(sp, pen) == 1, "2.0 / 2 = 1.0 < 1.5");
	toast_sampler_accept(sp, 1);
	float neg[4] = {-5, -5, -1.0f, -0.6f};
	toast_sampler_accept(sp, 3);
	CHECK(toast_sampler_sample(sp, neg) == 2, "-0.6 * 2 = -1.2 < -1.0");
	toast_sampler_free(sp);
	CHECK(pen[0] == 2.0f, "logits are not modified");
}

static void test_seed(void)
{
	float l[50];
	for (int i = 0; i < 50; i++)
		l[i] = (float)(i % 7) * 0.3f;
	int a[200], b[200], c[200];
	struct toast_sampler *s1 = mk(1, 0, 1, 0, 42, 50), *s2 = mk(1, 0, 1, 0, 42, 50), *s3 = mk(1, 0, 1, 0, 43, 50);
	int same = 1, diff = 0;
	for (int i = 0; i < 200; i++) {
		a[i] = toast_sampler_sample(s1, l);
		b[i] = toast_sampler_sample(s2, l);
		c[i] = toast_sampler_sample(s3, l);
		same &= a[i] == b[i];
		diff += a[i] != c[i];
	}
	CHECK(same, "the same seed gives different tokens");
	CHECK(diff > 100, "another seed gives nearly the same tokens (%d of 200 differ)", diff);
	toast_sampler_free(s1);
	toast_sampler_free(s2);
	toast_sampler_free(s3);
}

/* probabilities 0.5 0.3 0.15 0.05 (as logits) */
static void test_truncation(void)
{
	const float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
	const int N = 20000;
	static const struct {
		int top_k;
		float top_p, min_p;
		int keep; /* tokens 0..keep-1 survive */
	} cases[] = {
		{0, 1, 0, 4},     {1, 1, 0, 1},    {2, 1, 0, 2},     {3, 1, 0, 3},   {0, 0.79f, 0, 2}, {0, 0.85f, 0, 3},
		{0, 0.4f, 0, 1},  {0, 0.96f, 0, 4}, {0, 1, 0.2f, 3}, {0, 1, 0.5f, 2}, {0, 1, 0.9f, 1}, {3, 0.85f, 0.5f, 2},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct toast_sampler *sp = mk(1, cases[k].top_k, cases[k].top_p, cases[k].min_p, 5, 4);
		int counts[4] = {0};
		draw(sp, l, N, counts);
		double z = 0;
		for (int i = 0; i < cases[k].keep; i++)
			z += (double)expf(l[i]);
		for (int i = 0; i < 4; i++) {
			double want = i < cases[k].keep ? exp(l[i]) / z : 0;
			double got = (double)counts[i] / N;
			/* 20,000 draws: a standard deviation is at most 0.0036 */
			CHECK(fabs(got - want) < 0.02 && (want > 0 || counts[i] == 0),
			      "case %zu (top_k %d top_p %g min_p %g): token %d drawn %.3f, want %.3f", k, cases[k].top_k,
			      cases[k].top_p, cases[k].min_p, i, got, want);
		}
		toast_sampler_free(sp);
	}
	/* temperature: logits / T before the softmax */
	const float t[2] = {1.0f, 0.0f};
	struct toast_sampler *sp = mk(0.5f, 0, 1, 0, 9, 2);
	int counts[2] = {0};
	draw(sp, t, N, counts);
	double want = 1 / (1 + exp(-2.0));
	CHECK(fabs((double)counts[0] / N - want) < 0.02, "temperature 0.5: %.3f want %.3f", (double)counts[0] / N, want);
	toast_sampler_free(sp);
}

static void test_big_vocab(void)
{
	/* 152k tokens: 1000 share the mass almost evenly, top_p 0.9 needs ~900 of them (more than the
	 * partial selection of 256), the rest are far below */
	int V = 152000;
	float *l = malloc((size_t)V * sizeof(float));
	for (int i = 0; i < V; i++)
		l[i] = i % 152 == 0 ? 10.0f + (float)(i % 7) * 1e-3f : -20.0f;
	struct toast_sampler *sp = mk(1, 0, 0.9f, 0, 3, V);
	int ok = 1, seen = 0;
	int *counts = calloc((size_t)V, sizeof(int));
	for (int i = 0; i < 1000; i++) {
		int id = toast_sampler_sample(sp, l);
		ok &= id % 152 == 0;
		seen += counts[id]++ == 0;
	}
	CHECK(ok, "a token outside the nucleus was drawn");
	CHECK(seen > 450, "only %d distinct tokens of a ~900-token nucleus", seen);
	toast_sampler_free(sp);
	free(counts);
	free(l);
	/* invalid settings are refused */
	struct toast_sampling s;
	toast_sampling_init(&s);
	s.top_p = 0;
	struct toast_error err = {0};
	CHECK(toast_sampler_new(&s, 10, &sp, &err) == TOAST_ERR_INVALID, "top_p 0 accepted");
	toast_sampling_init(&s);
	s.temperature = -1;
	CHECK(toast_sampler_new(&s, 10, &sp, &err) == TOAST_ERR_INVALID, "negative temperature accepted");
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* toast_draw_wide's answer worked out plainly (every exp made; the nucleus by sorting the
 * candidates, not by digit sums) */
static int32_t wide_ref(const float *x, int n, uint64_t kmin, const struct toast_draw *d)
{
	int *c = malloc((size_t)n * sizeof(int)), k = 0, best = -1;
	float *p = malloc((size_t)n * sizeof(float));
	for (int i = 0; i < n; i++)
		if (toast_draw_order(x[i]) && ((uint64_t)toast_draw_order(x[i]) << 32 | (0xffffffffu - (uint32_t)i)) >= kmin) {
			c[k++] = i;
			best = best < 0 || toast_draw_order(x[i]) > toast_draw_order(x[best]) ? i : best;
		}
	int32_t id = 0;
	if (k > 0) {
		float vmax = x[best] == 0.0f ? 0.0f : x[best];
		uint64_t z = 0;
		for (int j = 0; j < k; j++) {
			int i = c[j];
			p[i] = x[i] == vmax ? 1.0f : toast_draw_exp(x[i] / d->temperature - vmax / d->temperature);
			z += toast_draw_weight(p[i]);
		}
		uint32_t least = 0;
		if (d->top_p < 1) {
			uint64_t *ok = malloc((size_t)k * sizeof(*ok)); /* order, index: sorted, larger first */
			for (int j = 0; j < k; j++)
				ok[j] = (uint64_t)toast_draw_order(x[c[j]]) << 32 | (uint32_t)c[j];
			qsort(ok, (size_t)k, sizeof(*ok), cmp_desc);
			uint64_t cut = toast_draw_cut(d->top_p, z), acc = 0;
			for (int j = 0; j < k && acc <= cut; j++) {
				acc += toast_draw_weight(p[(uint32_t)ok[j]]);
				least = (uint32_t)(ok[j] >> 32);
			}
			free(ok);
		}
		uint64_t keep_z = 0, acc = 0;
		bool *kept = calloc((size_t)n, 1);
		for (int j = 0; j < k; j++) {
			int i = c[j];
			kept[i] = toast_draw_order(x[i]) >= least && (p[i] >= d->min_p || p[i] == 1.0f);
			keep_z += kept[i] ? toast_draw_weight(p[i]) : 0;
		}
		uint64_t cut = toast_draw_cut(d->u, keep_z);
		for (int i = 0; i < n; i++)
			if (kept[i] && (acc += toast_draw_weight(p[i])) > cut) {
				id = i;
				break;
			}
		free(kept);
	}
	free(c);
	free(p);
	return id;
}

/* The draw from every logit (toast_draw_wide: integer weights, the nucleus' least logit by
 * three rounds of digit sums) is exactly the one worked out plainly (wide_ref), over logits
 * flat, peaked, tied, far apart, with NaN, -inf and -0, nuclei of one token to thousands, with
 * and without min-p, every candidate or the top 300 / 2000 (kmin), u at both ends; and the
 * sampler's top_k 0 and top_k over 256 draw so (toast_draw_wide's token from the same uniform). */
static void test_wide_exact(void)
{
	int V = 6000, bad = 0, n = 0, bad_s = 0;
	float *l = malloc((size_t)V * sizeof(float));
	uint64_t *p = malloc(2 * (size_t)V * sizeof(*p)), r = 99;
#define RND() (r = r * 6364136223846793005ull + 1442695040888963407ull, ((double)(r >> 11) + 0.5) * 0x1.0p-53)
	for (int shape = 0; shape < 6; shape++) {
		for (int i = 0; i < V; i++) {
			double u = RND();
			l[i] = shape == 0   ? (float)(u * 0.01)                                    /* nearly flat */
			       : shape == 1 ? (float)(-log(u) * 3)                                 /* a long tail */
			       : shape == 2 ? (float)(int)(u * 8) * 0.5f                            /* ties */
			       : shape == 3 ? (i % 50 == 0 ? 30.0f - (float)(i % 7) : (float)u)    /* a few far above */
			       : shape == 4 ? (float)(u * 40) - 20
					    : (float)(int)(u * 3) * 1e-3f - 1e4f; /* all negative, tied */
			if (i % 97 == 3)
				l[i] = -INFINITY;
			else if (i % 89 == 5)
				l[i] = NAN;
			else if (i % 83 == 7)
				l[i] = -0.0f;
		}
		/* kmin: none, or the 300th / 2000th largest key */
		uint64_t keys[3] = {0, 0, 0}, *all = malloc((size_t)V * sizeof(uint64_t));
		int na = 0;
		for (int i = 0; i < V; i++)
			if (toast_draw_order(l[i]))
				all[na++] = (uint64_t)toast_draw_order(l[i]) << 32 | (0xffffffffu - (uint32_t)i);
		qsort(all, (size_t)na, sizeof(*all), cmp_desc);
		keys[1] = all[299];
		keys[2] = all[1999];
		free(all);
		CHECK(toast_top_key(l, V, 300, p) == keys[1] && toast_top_key(l, V, 2000, p) == keys[2] &&
			      toast_top_key(l, V, na, p) == 0 && toast_top_key(l, V, 0, p) == 0,
		      "shape %d: the 300th and 2,000th keys by quickselect, none at %d or 0", shape, na);
		static const float tp[] = {0.05f, 0.3f, 0.8f, 0.95f, 0.999f, 1}, mp[] = {0, 0.05f, 0.3f}, tt[] = {0.4f, 1, 2.5f};
		for (int c = 0; c < 54; c++) {
			struct toast_draw d = {.temperature = tt[c % 3], .top_p = tp[c / 9], .min_p = mp[c / 3 % 3]};
			for (int j = 0; j < 12; j++, n++) {
				d.u = j == 0 ? 0.0 : j == 1 ? 1 - 0x1.0p-53 : RND();
				uint64_t kmin = keys[(c + j) % 3];
				bad += toast_draw_wide(l, V, kmin, &d, p) != wide_ref(l, V, kmin, &d);
			}
			/* the sampler: top_k 0 and 2000 against toast_draw_wide with the same uniform (the
			 * first a twin sampler gives a backend's draw) */
			for (int kk = 0; kk < 2; kk++) {
				struct toast_sampling sg = sampling(d.temperature, kk ? 2000 : 0, d.top_p, d.min_p, 1, 5 + (uint64_t)c);
				struct toast_sampler *a = mk_from(&sg, V), *b = mk_from(&sg, V);
				struct toast_draw bd;
				CHECK(toast_sampler_backend_draw(b, &bd), "a sampled draw");
				d.u = bd.u;
				bad_s += toast_sampler_sample(a, l) != toast_draw_wide(l, V, kk ? keys[2] : 0, &d, p);
				toast_sampler_free(a);
				toast_sampler_free(b);
			}
		}
	}
#undef RND
	CHECK(bad == 0 && bad_s == 0, "the draw from every logit: %d of %d draws differ from the plain reckoning's, %d "
	      "of the sampler's from toast_draw_wide's", bad, n, bad_s);
	free(l);
	free(p);
}

static void test_from_top(void)
{
	struct {
		float temp, top_p, min_p;
		int top_k;
		float penalty;
		int need; /* expected toast_sampler_top_need */
	} cfg[] = {
		{0, 1, 0, 0, 1, 1},     {0, 0.8f, 0, 20, 1, 1},   {0.7f, 0.8f, 0, 20, 1, 20}, {1, 1, 0, 1, 1, 1},
		{1.3f, 1, 0.05f, 256, 1, 256}, {0.2f, 0.95f, 0.1f, 40, 1, 40}, {1, 1, 0, 257, 1, 0},
		{1, 0.9f, 0, 0, 1, 0},  {0.7f, 0.8f, 0, 20, 1.1f, 84}, {0, 1, 0, 0, 1.1f, 65},
		{1.5f, 1, 0, 3, 3.0f, 67}, {0.7f, 0.8f, 0, 20, 0.9f, 0}, {0.7f, 0.8f, 0, 200, 1.1f, 0},
		{0.7f, 0.8f, 0, 0, 1.1f, 0},
	};
	int V = 5000;
	float *l = malloc((size_t)V * sizeof(float));
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		struct toast_sampling s = sampling(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, cfg[c].penalty, 7 + c);
		struct toast_sampler *a = mk_from(&s, V), *b = mk_from(&s, V);
		int need = toast_sampler_top_need(a);
		CHECK(need == cfg[c].need, "config %zu: need %d, expected %d", c, need, cfg[c].need);
		if (need == 0) {
			toast_sampler_free(a);
			toast_sampler_free(b);
			continue;
		}
		int same = 0, steps = 300;
		uint64_t r = 12345 + c;
		for (int t = 0; t < steps; t++) {
			/* coarse values: many ties; a few -0/+0, NaN and -inf */
			for (int i = 0; i < V; i++) {
				r = r * 6364136223846793005ull + 1442695040888963407ull;
				int q = (int)(r >> 59); /* 0..31 */
				l[i] = (float)(q - 16) * 0.25f;
				if (q == 16)
					l[i] = (r >> 20) & 1 ? -0.0f : 0.0f;
				else if ((r >> 30) % 997 == 0)
					l[i] = NAN;
				else if ((r >> 30) % 991 == 0)
					l[i] = -INFINITY;
			}
			for (int i = 0; i < 100; i++) /* the tokens seen lately, among the largest */
				l[i] += 2.0f;
			int32_t ids[TOAST_SAMPLER_TOP_MAX];
			float vals[TOAST_SAMPLER_TOP_MAX];
			int n = toast_top_host(l, V, need, ids, vals);
			int32_t x = toast_sampler_sample(a, l), y = toast_sampler_sample_top(b, ids, vals, n);
			same += x == y;
			int32_t seen = t % 2 ? x : (int32_t)(r % 100);
			toast_sampler_accept(a, seen);
			toast_sampler_accept(b, seen);
		}
		CHECK(same == steps, "config %zu: %d of %d draws from the top %d differ from draws from all logits", c,
		      steps - same, steps, need);
		toast_sampler_free(a);
		toast_sampler_free(b);
	}
	free(l);
}

/* The draw a backend makes (draw.h, toast_sampler_backend_draw): its exp within an ulp of the
 * true one (exact nearly always); which samplers are drawn (all but greedy without a penalty,
 * from the top or from every logit); draws made as a chain
 * makes them (each queued before the sampler accepts the token before it, which counts as
 * pending for the penalty) choose what sampling from all the logits does, token for token,
 * greedy or drawn, with and without a penalty (windows of 64, 4 and 3 tokens), one uniform a
 * token (nothing taken when asked only whether it can). */
static void test_backend_draw(void)
{
	int off = 0, exact = 0, n = 0;
	for (double x = -110; x <= 0; x += 0.000731, n++) {
		float a = toast_draw_exp((float)x), b = (float)exp((double)(float)x);
		int32_t ia, ib;
		memcpy(&ia, &a, 4);
		memcpy(&ib, &b, 4);
		off += abs(ia - ib) > 1;
		exact += ia == ib;
	}
	CHECK(off == 0 && exact > n - n / 1000, "draw's exp: %d of %d more than an ulp off, %d exact", off, n, exact);
	CHECK(toast_draw_exp(0) == 1.0f && toast_draw_exp(-INFINITY) == 0.0f && toast_draw_exp(-200) == 0.0f,
	      "draw's exp at 0, -inf and -200");
	struct {
		float temp, top_p, min_p, penalty;
		int top_k, last_n, mode;
	} cfg[] = {
		{0.7f, 0.8f, 0, 1, 20, 64, 1},   {1.3f, 1, 0.05f, 1, 32, 64, 1}, {0.2f, 0.95f, 0.1f, 1, 1, 64, 1},
		{0, 0.8f, 0, 1, 20, 64, 0},      {0.7f, 0.8f, 0, 1, 33, 64, 1},  {0.7f, 0.8f, 0, 1, 0, 64, 1},
		{0.7f, 0.8f, 0, 1.1f, 20, 64, 1}, {0, 1, 0, 1.5f, 20, 64, 1},     {1, 0.9f, 0, 3, 5, 4, 1},
		{0.7f, 0.8f, 0, 0.9f, 20, 64, 1}, {0, 1, 0, 2, 1, 3, 1},     {1, 1, 0.05f, 1, 0, 64, 1},
		{0.7f, 0.95f, 0, 0.8f, 0, 16, 1}, {0, 1, 0, 0.7f, 20, 64, 1},  {0.7f, 0.8f, 0, 1.2f, 230, 64, 1},
		{0.7f, 0.8f, 0, 1, 257, 64, 1},  {1.2f, 0.9f, 0.01f, 0.9f, 1000, 64, 1},
	};
	int V = 3000;
	float *l = malloc((size_t)V * sizeof(float));
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		struct toast_sampling sg =
			sampling(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, cfg[c].penalty, 100 + c);
		sg.repeat_last_n = cfg[c].last_n;
		struct toast_sampler *a = mk_from(&sg, V), *b = mk_from(&sg, V);
		int mode = toast_sampler_backend_draw(a, NULL);
		CHECK(mode == cfg[c].mode, "config %zu: a backend's draw %d, expected %d", c, mode, cfg[c].mode);
		/* a: as a chain draws, each pick queued before the token before it is accepted (that one
		 * counted by the draw as pending); b: sampling from all the logits, every token accepted */
		int same = 0, steps = 400;
		int32_t pend = -1;
		uint64_t r = 777 + c;
		for (int t = 0; t < steps; t++) {
			for (int i = 0; i < V; i++) {
				r = r * 6364136223846793005ull + 1442695040888963407ull;
				l[i] = (float)((int)(r >> 56) - 128) * (t % 2 ? 0.01f : 0.125f); /* sharp and flat; ties */
				if (i < 40)
					l[i] += 20 * (t % 2 ? 0.01f : 0.125f); /* a few tokens often among the best */
				if ((r >> 20) % 499 == 0)
					l[i] = NAN;
			}
			struct toast_draw d;
			int m = toast_sampler_backend_draw(a, &d);
			CHECK(m == mode && (m == 0 || (d.n_top == toast_sampler_top_need(a) && d.u >= 0 && d.u < 1)),
			      "config %zu: a draw's parameters", c);
			d.prev = pend >= 0;
			int32_t x = toast_pick_host(l, V, m ? &d : NULL, pend);
			if (pend >= 0)
				toast_sampler_accept(a, pend);
			pend = x;
			int32_t y = toast_sampler_sample(b, l);
			toast_sampler_accept(b, y);
			same += x == y;
		}
		CHECK(same == steps, "config %zu: %d of %d backend draws differ from the sampler's", c,
		      steps - same, steps);
		toast_sampler_free(a);
		toast_sampler_free(b);
	}
	free(l);
}

/* Random samplers (temperature from 0.01 to 5 or greedy, top_k 1..60, 257..656 or off, top_p,
 * min_p, a penalty under or over 1 or none, windows of 1..40), random logits with ties, -0, NaN
 * and -inf, now and then all negative, and tokens seen lately among the best: the chain's draw
 * (toast_sampler_backend_draw, toast_pick_host: from the top, or from every logit; the pending
 * token counted) chooses what sampling from all the logits does, and toast_sampler_sample_top
 * from the top (toast_sampler_top_need) does too where the sampler needs only the top. */
static void test_draw_random(void)
{
	uint64_t r = 4242;
#define RND() (r = r * 6364136223846793005ull + 1442695040888963407ull, (double)(r >> 11) * 0x1.0p-53)
	int V = 700, bad = 0, bad_top = 0, steps = 0;
	float *l = malloc((size_t)V * sizeof(float));
	for (int c = 0; c < 300; c++) {
		struct toast_sampling sg;
		toast_sampling_init(&sg);
		sg.temperature = RND() < 0.15 ? 0.0f : (float)(0.01 + 5 * RND() * RND());
		double kq = RND();
		sg.top_k = kq < 0.15 ? 0 : kq < 0.25 ? 257 + (int)(400 * RND()) : 1 + (int)(60 * RND());
		sg.top_p = RND() < 0.3 ? 1.0f : (float)(0.05 + 0.95 * RND());
		sg.min_p = RND() < 0.5 ? 0.0f : (float)(0.3 * RND());
		double pr = RND();
		sg.repeat_penalty = pr < 0.3 ? 1.0f : pr < 0.4 ? (float)(0.5 + 0.5 * RND()) : (float)(1 + 4 * RND());
		sg.repeat_last_n = 1 + (int)(40 * RND());
		sg.seed = (uint64_t)c;
		struct toast_sampler *a = mk_from(&sg, V), *b = mk_from(&sg, V), *t = mk_from(&sg, V);
		int32_t pend = -1;
		for (int step = 0; step < 40; step++, steps++) {
			double scale = RND() < 0.5 ? 0.25 : 0.02, shift = RND() < 0.3 ? -40 : 0; /* (all negative) */
			for (int i = 0; i < V; i++) {
				double u = RND();
				l[i] = (float)(((int)(u * 64) - 32 + shift) * scale) + (i < 30 ? 8 * (float)scale : 0.0f);
				if (u < 0.003)
					l[i] = NAN;
				else if (u < 0.006)
					l[i] = -INFINITY;
				else if (u < 0.03)
					l[i] = -0.0f;
			}
			int32_t ids[TOAST_SAMPLER_TOP_MAX];
			float vals[TOAST_SAMPLER_TOP_MAX];
			struct toast_draw d;
			int m = toast_sampler_backend_draw(a, &d);
			d.prev = pend >= 0;
			int32_t x = toast_pick_host(l, V, m ? &d : NULL, pend);
			if (pend >= 0)
				toast_sampler_accept(a, pend);
			pend = x;
			int32_t y = toast_sampler_sample(b, l);
			toast_sampler_accept(b, y);
			int need = toast_sampler_top_need(t); /* (0: every logit; t is not drawn from the top) */
			int got = toast_top_host(l, V, need, ids, vals);
			int32_t z = need > 0 ? toast_sampler_sample_top(t, ids, vals, got) : y;
			toast_sampler_accept(t, y);
			bad += x != y;
			bad_top += z != y;
			if (x != y || z != y) { /* the histories part: the next sampler */
				if (bad + bad_top < 5)
					fprintf(stderr, "sampler %d (t %g k %d p %g min %g pen %g n %d) step %d: %d / %d / %d\n", c,
						sg.temperature, sg.top_k, sg.top_p, sg.min_p, sg.repeat_penalty, sg.repeat_last_n,
						step, x, z, y);
				break;
			}
		}
		toast_sampler_free(a);
		toast_sampler_free(b);
		toast_sampler_free(t);
	}
#undef RND
	CHECK(bad == 0 && bad_top == 0 && steps > 300 * 20,
	      "random samplers: %d chain draws and %d draws from the top differ from sampling from all logits (%d steps)",
	      bad, bad_top, steps);
	free(l);
}

/* toast_top_host against a full sort of (value desc, index asc) */
static int cmp_top(const void *pa, const void *pb)
{
	const float *a = pa, *b = pb; /* {value, index} */
	if (a[0] != b[0])
		return a[0] > b[0] ? -1 : 1;
	return (a[1] > b[1]) - (a[1] < b[1]);
}

static void test_top_host(void)
{
	int sizes[] = {1, 2, 7, 300, 4099};
	int ms[] = {1, 3, 20, 256};
	uint64_t r = 99;
	for (int si = 0; si < 5; si++) {
		int n = sizes[si];
		float *x = malloc((size_t)n * sizeof(float)), *pairs = malloc((size_t)n * 2 * sizeof(float));
		for (int i = 0; i < n; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			x[i] = (float)((int)(r >> 58) - 32) * 0.5f;
			if ((r >> 20) % 50 == 0)
				x[i] = NAN;
			if ((r >> 20) % 50 == 1)
				x[i] = -0.0f;
		}
		int k = 0;
		for (int i = 0; i < n; i++)
			if (!isnan(x[i])) {
				pairs[2 * k] = x[i] == 0 ? 0.0f : x[i];
				pairs[2 * k + 1] = (float)i;
				k++;
			}
		qsort(pairs, (size_t)k, 2 * sizeof(float), cmp_top);
		for (int mi = 0; mi < 4; mi++) {
			int32_t ids[256];
			float vals[256];
			int got = toast_top_host(x, n, ms[mi], ids, vals);
			int want = ms[mi] < k ? ms[mi] : k, bad = got != want;
			for (int j = 0; !bad && j < got; j++)
				bad = ids[j] != (int32_t)pairs[2 * j + 1] || vals[j] != pairs[2 * j];
			CHECK(!bad, "top %d of %d: %d entries, %s", ms[mi], n, got, bad ? "wrong order or values" : "ok");
		}
		free(x);
		free(pairs);
	}
}

struct collect {
	char text[8192];
	size_t n;
	int32_t ids[256];
	int n_ids;
	bool whole;
};

static int collect_cb(void *ud, int32_t id, const char *text, size_t len)
{
	struct collect *c = ud;
	c->whole = c->whole && toast_utf8_valid(text, len);
	if (c->n + len < sizeof(c->text)) {
		memcpy(c->text + c->n, text, len);
		c->n += len;
	}
	if (c->n_ids < 256)
		c->ids[c->n_ids++] = id;
	return 0;
}

static enum toast_status gen(struct toast_engine *e, const int32_t *prompt, int n_prompt, int n_ctx, const char *stop,
			     int max_tokens, struct collect *c, struct toast_gen_result *res, int *n_past,
			     struct toast_error *err)
{
	struct toast_session *s = NULL;
	enum toast_status st = toast_session_new(e, n_ctx, &s, err);
	struct toast_gen_opts o = {.max_tokens = max_tokens, .ignore_eos = true};
	toast_sampling_init(&o.sampling);
	o.sampling.temperature = 0;
	const char *stops[1] = {stop};
	o.stop = stops;
	o.n_stop = stop ? 1 : 0;
	memset(c, 0, sizeof(*c));
	c->whole = true;
	if (st == TOAST_OK)
		st = toast_generate(s, toast_engine_tokenizer(e), prompt, n_prompt, &o, collect_cb, c, res, err);
	*n_past = s ? toast_session_n_past(s) : -1;
	toast_session_free(s);
	return st;
}

/* A session's last logits stay in the engine's work buffer until asked for; another session's
 * feed must first take them home. s1 and s3 see the same prompt, s2 another in between. */
static void test_sessions_share(struct toast_engine *e, const int32_t *prompt, int np)
{
	int V = toast_engine_info(e)->n_vocab;
	struct toast_session *s1 = NULL, *s2 = NULL, *s3 = NULL;
	struct toast_error err = {0};
	CHECK(toast_session_new(e, 256, &s1, &err) == TOAST_OK && toast_session_new(e, 256, &s2, &err) == TOAST_OK &&
		      toast_session_new(e, 256, &s3, &err) == TOAST_OK,
	      "%s", err.msg);
	float *ref = malloc((size_t)V * sizeof(float));
	CHECK(toast_session_feed(s3, prompt, np, NULL, &err) == TOAST_OK, "%s", err.msg);
	memcpy(ref, toast_session_logits(s3), (size_t)V * sizeof(float));
	CHECK(toast_session_feed(s1, prompt, np, NULL, &err) == TOAST_OK, "%s", err.msg);
	CHECK(toast_session_feed(s2, prompt + 1, np - 1, NULL, &err) == TOAST_OK, "%s", err.msg);
	const float *l1 = toast_session_logits(s1);
	CHECK(l1 && memcmp(l1, ref, (size_t)V * sizeof(float)) == 0, "s1's logits changed when s2 fed");
	int32_t ids[20], rid[20];
	float vals[20], rval[20];
	int n = toast_session_top(s2, 20, ids, vals, &err); /* still in the work buffer */
	int want = toast_top_host(toast_session_logits(s2), V, 20, rid, rval);
	CHECK(n == want && memcmp(ids, rid, sizeof(ids)) == 0 && memcmp(vals, rval, sizeof(vals)) == 0,
	      "the top of pending logits differs from the top of the logits read");
	n = toast_session_top(s1, 20, ids, vals, &err); /* from the host copy */
	want = toast_top_host(ref, V, 20, rid, rval);
	CHECK(n == want && memcmp(ids, rid, sizeof(ids)) == 0, "the top of s1 after s2 fed differs");
	CHECK(toast_session_top(s1, 0, ids, vals, &err) < 0 && toast_session_top(s1, 257, ids, vals, &err) < 0,
	      "top of 0 or 257 accepted");
	free(ref);
	toast_session_free(s1);
	toast_session_free(s2);
	toast_session_free(s3);
}

static void test_generate(void)
{
	char dir[1024], path[1100];
	snprintf(dir, sizeof(dir), "%s/models/qwen3next-vocab", test_data_dir());
	snprintf(path, sizeof(path), "%s/chat-cases.json", dir);
	json_t *cases = json_load_file(path, 0, NULL);
	CHECK(cases != NULL, "%s is missing", path);
	struct toast_engine_opts eo;
	toast_engine_opts_init(&eo);
	eo.backend = "cpu";
	struct toast_engine *e = NULL;
	struct toast_error err = {0};
	CHECK(toast_engine_open(dir, &eo, &e, &err) == TOAST_OK, "%s", err.msg);
	CHECK(!e || toast_engine_tokenizer(e) != NULL, "the engine did not load tokenizer.json");
	if (!cases || !e || !toast_engine_tokenizer(e)) {
		json_decref(cases);
		toast_engine_close(e);
		return;
	}
	json_t *c0 = json_array_get(cases, 0), *pid = json_object_get(c0, "prompt_ids"), *gid = json_object_get(c0, "greedy_ids");
	const char *want = json_string_value(json_object_get(c0, "greedy_text"));
	int32_t prompt[64];
	int np = (int)json_array_size(pid);
	for (int i = 0; i < np && i < 64; i++)
		prompt[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
	struct collect c;
	struct toast_gen_result res;
	int n_past;
	/* greedy: ids and text exactly, whole characters, everything fed */
	enum toast_status st = gen(e, prompt, np, 256, NULL, 24, &c, &res, &n_past, &err);
	CHECK(st == TOAST_OK, "%s", err.msg);
	bool same = c.n_ids == 24;
	for (int i = 0; same && i < 24; i++)
		same = c.ids[i] == json_integer_value(json_array_get(gid, (size_t)i));
	CHECK(same, "greedy ids differ from chat case 0");
	CHECK(c.n == strlen(want) && memcmp(c.text, want, c.n) == 0, "greedy text differs: %.*s", (int)c.n, c.text);
	CHECK(c.whole, "a callback got a partial character");
	CHECK(res.finish == TOAST_FINISH_LENGTH && res.n_generated == 24 && res.n_prompt == np && res.n_prefilled == np,
	      "result: finish %d, %d generated, %d prompt", res.finish, res.n_generated, res.n_prompt);
	CHECK(n_past == np + 24, "the session holds %d tokens, want prompt + generated = %d", n_past, np + 24);
	/* a stop string: the text before it, nothing of it */
	const char *at = strstr(want, "swinger");
	st = gen(e, prompt, np, 256, "swinger", 24, &c, &res, &n_past, &err);
	CHECK(st == TOAST_OK && res.finish == TOAST_FINISH_STOP && at && c.n == (size_t)(at - want) &&
		      memcmp(c.text, want, c.n) == 0,
	      "stop string: got \"%.*s\"", (int)c.n, c.text);
	CHECK(n_past == np + res.n_generated, "stop: the session holds %d, want %d", n_past, np + res.n_generated);
	/* a stop string whose start appears but that never completes: nothing is lost */
	st = gen(e, prompt, np, 256, "swingerclub!", 24, &c, &res, &n_past, &err);
	CHECK(st == TOAST_OK && c.n == strlen(want) && memcmp(c.text, want, c.n) == 0, "partial stop match lost text");
	/* the context fills: generation ends there, every token fed */
	st = gen(e, prompt, np, np + 5, NULL, 0, &c, &res, &n_past, &err);
	CHECK(st == TOAST_OK && res.finish == TOAST_FINISH_CTX && res.n_generated == 5 && n_past == np + 5,
	      "context limit: finish %d, %d generated, n_past %d", res.finish, res.n_generated, n_past);
	/* a prompt that leaves no room */
	st = gen(e, prompt, np, np, NULL, 0, &c, &res, &n_past, &err);
	CHECK(st == TOAST_ERR_CTX_FULL && strstr(err.msg, "no room"), "full context: %s", err.msg);
	test_sessions_share(e, prompt, np);
	json_decref(cases);
	toast_engine_close(e);
}

int main(void)
{
	test_greedy();
	test_seed();
	test_truncation();
	test_big_vocab();
	test_wide_exact();
	test_from_top();
	test_top_host();
	test_backend_draw();
	test_draw_random();
	test_generate();
	return test_done("test_sampler");
}
