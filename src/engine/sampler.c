/*
 * sampler.c - choosing the next token from logits: greedy, or temperature + top-k + top-p +
 * min-p, with an optional repetition penalty, from a seeded generator.
 *
 * Order (as Hugging Face's logits processors apply them): repetition penalty, temperature,
 * top-k, top-p, min-p, then a draw. Temperature 0 is argmax (lowest id on ties) after the
 * penalty. Reproducible: the same seed and the same logits give the same tokens (xoshiro256**
 * seeded through splitmix64; no global state).
 * Cost: O(n_vocab) per token. Top-k <= 256 keeps the top_k by a heap in one pass, and the draw
 * is over those (draw.h's toast_draw_top); top-k 0 or over 256 draws from every logit (draw.h's
 * toast_draw_wide: sums of integer weights, the nucleus found by three rounds of digit sums;
 * over 256 the least of the top_k found first by a quickselect, toast_top_key). Either is the
 * draw a backend's pick makes on the device when generation chains its steps
 * (toast_sampler_backend_draw): from the top, or (d->n_top 0) from every logit; from the few
 * largest logits a GPU sends (toast_sampler_sample_top) it is toast_draw_pick.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/draw.h"
#include "engine/engine.h"
#include "toasted.h"
#include "util/err.h"

struct toast_sampler {
	struct toast_sampling p;
	int n_vocab;
	uint64_t rng[4];
	uint64_t *wide;            /* [2 n_vocab]: toast_draw_wide's scratch */
	float *penalized;          /* [n_vocab], used only with a repetition penalty */
	int32_t *recent;           /* ring of the last repeat_last_n accepted tokens */
	int n_recent, recent_pos;
	int32_t *chrono;           /* [repeat_last_n]: the ring oldest first (a draw's recent) */
	/* sample_top's candidates */
	int32_t top_ids[TOAST_SAMPLER_TOP_MAX];
	float top_vals[TOAST_SAMPLER_TOP_MAX], top_p[TOAST_SAMPLER_TOP_MAX];
};

void toast_sampling_init(struct toast_sampling *s)
{
	memset(s, 0, sizeof(*s));
	s->temperature = 0.7f;
	s->top_k = 20;
	s->top_p = 0.8f;
	s->min_p = 0.0f;
	s->repeat_penalty = 1.0f;
	s->repeat_last_n = 64;
	s->seed = 0;
}

static uint64_t sampler_splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static inline uint64_t sampler_rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t sampler_next(struct toast_sampler *sp)
{
	uint64_t *s = sp->rng;
	uint64_t r = sampler_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = sampler_rotl(s[3], 45);
	return r;
}

enum toast_status toast_sampler_new(const struct toast_sampling *s, int n_vocab, struct toast_sampler **out,
				    struct toast_error *err)
{
	*out = NULL;
	if (n_vocab < 1 || n_vocab > TOAST_DRAW_WIDE_MAX)
		return toast_err_set(err, TOAST_ERR_INVALID, "sampler: vocabulary of %d tokens (at most %d)", n_vocab,
				     TOAST_DRAW_WIDE_MAX);
	if (!(s->temperature >= 0) || !(s->top_p > 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1) ||
	    s->top_k < 0 || !(s->repeat_penalty > 0) || s->repeat_last_n < 0 || s->repeat_last_n > (1 << 20))
		return toast_err_set(err, TOAST_ERR_INVALID,
				     "sampler: temperature %g, top_p %g, min_p %g, top_k %d, repeat_penalty %g, "
				     "repeat_last_n %d: out of range",
				     s->temperature, s->top_p, s->min_p, s->top_k, s->repeat_penalty, s->repeat_last_n);
	struct toast_sampler *sp = calloc(1, sizeof(*sp));
	if (!sp)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	sp->p = *s;
	sp->n_vocab = n_vocab;
	sp->wide = malloc(2 * (size_t)n_vocab * sizeof(*sp->wide));
	sp->recent = malloc(((size_t)s->repeat_last_n + 1) * sizeof(*sp->recent));
	sp->chrono = malloc(((size_t)s->repeat_last_n + 1) * sizeof(*sp->chrono));
	if (s->repeat_penalty != 1.0f)
		sp->penalized = malloc((size_t)n_vocab * sizeof(float));
	if (!sp->wide || !sp->recent || !sp->chrono || (s->repeat_penalty != 1.0f && !sp->penalized)) {
		toast_sampler_free(sp);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	uint64_t x = s->seed;
	for (int i = 0; i < 4; i++)
		sp->rng[i] = sampler_splitmix(&x);
	*out = sp;
	return TOAST_OK;
}

void toast_sampler_free(struct toast_sampler *sp)
{
	if (!sp)
		return;
	free(sp->wide);
	free(sp->penalized);
	free(sp->recent);
	free(sp->chrono);
	free(sp);
}

void toast_sampler_accept(struct toast_sampler *sp, int32_t id)
{
	if (sp->p.repeat_last_n == 0)
		return;
	sp->recent[sp->recent_pos] = id;
	sp->recent_pos = (sp->recent_pos + 1) % sp->p.repeat_last_n;
	if (sp->n_recent < sp->p.repeat_last_n)
		sp->n_recent++;
}

/* CTRL's penalty, as upstream's RepetitionPenaltyLogitsProcessor: each seen token once. */
static const float *sampler_penalize(struct toast_sampler *sp, const float *logits)
{
	if (sp->p.repeat_penalty == 1.0f || sp->n_recent == 0)
		return logits;
	memcpy(sp->penalized, logits, (size_t)sp->n_vocab * sizeof(float));
	for (int i = 0; i < sp->n_recent; i++) {
		int32_t id = sp->recent[i];
		if (id < 0 || id >= sp->n_vocab || sp->penalized[id] != logits[id])
			continue; /* outside the vocabulary, or already penalised */
		sp->penalized[id] = toast_draw_penalize(logits[id], sp->p.repeat_penalty);
	}
	return sp->penalized;
}

/* a uniform in [0, 1): one a sampled token, whatever the logits (a chain on the backend takes
 * each token's before its logits exist) */
static double sampler_uniform(struct toast_sampler *sp)
{
	return (double)(sampler_next(sp) >> 11) * 0x1.0p-53;
}

int32_t toast_sampler_sample(struct toast_sampler *sp, const float *logits)
{
	const float *l = sampler_penalize(sp, logits);
	int V = sp->n_vocab;
	if (sp->p.temperature <= 0) {
		int32_t best = 0; /* the first maximum; NaN never (unless all are) */
		for (int i = 1; i < V; i++)
			if (l[i] > l[best] || (isnan(l[best]) && !isnan(l[i])))
				best = i;
		return best;
	}
	struct toast_draw d = {.temperature = sp->p.temperature,
			       .top_p = sp->p.top_p,
			       .min_p = sp->p.min_p,
			       .u = sampler_uniform(sp),
			       .repeat_penalty = 1.0f};
	if (sp->p.top_k > 0 && sp->p.top_k <= TOAST_TOP_MAX) {
		/* top-k on the logits themselves, sorted: what toast_session_top returns (a heap of
		 * top_k in one pass), and the draw a backend's pick makes from it */
		int k = toast_top_host(l, V, sp->p.top_k, sp->top_ids, sp->top_vals);
		return k > 0 ? sp->top_ids[toast_draw_top(sp->top_vals, k, &d, sp->top_p)] : 0;
	}
	/* from every logit (top_k 0), or the top_k largest (over 256: the least of them found first),
	 * as a backend's pick draws from every logit (draw.h) */
	uint64_t kmin = toast_top_key(l, V, sp->p.top_k, sp->wide);
	return toast_draw_wide(l, V, kmin, &d, sp->wide); /* (kmin made, the scratch is free) */
}

/* a repetition penalty is in force (one that can change a logit) */
static bool sampler_penalizes(const struct toast_sampler *sp)
{
	return sp->p.repeat_penalty != 1.0f && sp->p.repeat_last_n > 0;
}

int toast_sampler_top_need(const struct toast_sampler *sp)
{
	int k = sp->p.temperature <= 0 ? 1 : sp->p.top_k;
	if (k <= 0)
		return 0;
	if (sampler_penalizes(sp)) {
		/* a penalty over 1 only lowers the last repeat_last_n tokens' logits, so the k largest
		 * penalised logits are among the k + repeat_last_n largest (at least k of those are
		 * not penalised, and everything else is below them); under 1 it raises them */
		if (sp->p.repeat_penalty < 1.0f)
			return 0;
		k += sp->p.repeat_last_n;
	}
	return k <= TOAST_SAMPLER_TOP_MAX ? k : 0;
}

/* the draw of the next token from the n_top largest logits (draw.h), its uniform taken (none
 * for greedy) */
static void sampler_params(struct toast_sampler *sp, int n_top, struct toast_draw *d)
{
	bool greedy = sp->p.temperature <= 0;
	bool full = sp->n_recent == sp->p.repeat_last_n;
	for (int i = 0; i < sp->n_recent; i++) /* oldest first: a full ring from its next write on */
		sp->chrono[i] = sp->recent[full ? (sp->recent_pos + i) % sp->n_recent : i];
	*d = (struct toast_draw){
		.temperature = greedy ? 0.0f : sp->p.temperature,
		.top_p = sp->p.top_p,
		.min_p = sp->p.min_p,
		.top_k = greedy ? 1 : sp->p.top_k,
		.n_top = n_top,
		.u = greedy ? 0.0 : sampler_uniform(sp),
		.repeat_penalty = sampler_penalizes(sp) ? sp->p.repeat_penalty : 1.0f,
		.last_n = sp->p.repeat_last_n,
		.n_recent = sp->n_recent,
		.recent = sp->chrono,
	};
}

int32_t toast_sampler_sample_top(struct toast_sampler *sp, const int32_t *ids, const float *vals, int n)
{
	struct toast_draw d;
	n = n < TOAST_SAMPLER_TOP_MAX ? n : TOAST_SAMPLER_TOP_MAX;
	sampler_params(sp, n, &d);
	memcpy(sp->top_ids, ids, (size_t)(n > 0 ? n : 0) * sizeof(*ids));
	memcpy(sp->top_vals, vals, (size_t)(n > 0 ? n : 0) * sizeof(*vals));
	return toast_draw_pick(sp->top_vals, sp->top_ids, n, &d, -1, sp->top_p);
}

bool toast_sampler_backend_draw(struct toast_sampler *sp, struct toast_draw *d)
{
	if (sp->p.temperature <= 0 && !sampler_penalizes(sp))
		return false;
	if (d) /* (a need of 0: the pick draws from every logit, n_top 0) */
		sampler_params(sp, toast_sampler_top_need(sp), d);
	return true;
}

bool toast_sampler_spec_ok(const struct toast_sampler *sp)
{
	return !sampler_penalizes(sp);
}

bool toast_sampler_draws(struct toast_sampler *sp, struct toast_draw *d, int rows)
{
	uint64_t rng[4];
	memcpy(rng, sp->rng, sizeof(rng));
	bool drawn = false;
	for (int r = 0; r < rows; r++)
		drawn = toast_sampler_backend_draw(sp, d + r);
	memcpy(sp->rng, rng, sizeof(rng));
	return drawn;
}

void toast_sampler_take(struct toast_sampler *sp, int n)
{
	for (int i = 0; i < n && sp->p.temperature > 0; i++) /* (sampler_params' uniforms) */
		sampler_uniform(sp);
}
