/*
 * generate.c - toast_generate: feed a prompt, then sample, stream and feed tokens until a stop
 * condition (an end-of-generation token, a stop string, max_tokens, the context window, or the
 * callback asking to stop).
 *
 * Invariants:
 * - every token passed to the callback has been or is then fed into the session, the final one
 *   (an end-of-generation token too) included: the session ends as prompt + generated tokens;
 * - a token is sampled only when the context has room to feed it;
 * - streamed text is complete UTF-8 characters, and never contains any part of a stop string:
 *   text that could be the start of one is held back until it cannot be, and dropped with the
 *   stop string when it is one. The final callback carries whatever was held back.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/err.h"
#include "util/log.h"
#include "util/timeutil.h"

#define GEN_MAX_STOP 16
#define GEN_MAX_STOP_LEN 1024

struct gen_text {
	char *hold; /* text not yet streamed */
	size_t n_hold, cap_hold;
	char *out; /* what one callback gets */
	size_t cap_out;
};

/* Earliest occurrence of any stop string in the held text: its offset, or -1. */
static long gen_find_stop(const struct gen_text *t, const struct toast_gen_opts *o)
{
	long best = -1;
	for (int k = 0; k < o->n_stop; k++) {
		size_t l = strlen(o->stop[k]);
		for (size_t i = 0; i + l <= t->n_hold && (best < 0 || (long)i < best); i++)
			if (memcmp(t->hold + i, o->stop[k], l) == 0) {
				best = (long)i;
				break;
			}
	}
	return best;
}

/* Bytes of the held text that cannot be the start of a stop string (a char boundary). */
static size_t gen_safe_prefix(const struct gen_text *t, const struct toast_gen_opts *o)
{
	size_t safe = t->n_hold;
	for (size_t i = 0; i < t->n_hold && safe == t->n_hold; i++)
		for (int k = 0; k < o->n_stop; k++) {
			size_t l = strlen(o->stop[k]), rest = t->n_hold - i;
			if (rest < l && memcmp(t->hold + i, o->stop[k], rest) == 0) {
				safe = i;
				break;
			}
		}
	while (safe > 0 && safe < t->n_hold && ((unsigned char)t->hold[safe] & 0xC0) == 0x80)
		safe--;
	return safe;
}

static bool gen_hold(struct gen_text *t, const char *s, size_t n)
{
	if (n == 0) /* nothing held yet may mean no buffer yet: memcpy must not see NULL */
		return true;
	if (t->n_hold + n > t->cap_hold) {
		size_t cap = (t->n_hold + n) * 2 + 64;
		char *h = realloc(t->hold, cap);
		if (!h)
			return false;
		t->hold = h;
		t->cap_hold = cap;
	}
	memcpy(t->hold + t->n_hold, s, n);
	t->n_hold += n;
	return true;
}

/* Move the first n held bytes into out (room ensured by the caller); returns n. */
static size_t gen_take(struct gen_text *t, size_t n)
{
	if (t->n_hold == 0)
		return 0;
	memcpy(t->out, t->hold, n);
	memmove(t->hold, t->hold + n, t->n_hold - n);
	t->n_hold -= n;
	return n;
}

static enum toast_status gen_check(const struct toast_session *s, int n_prompt, const struct toast_gen_opts *o,
				   struct toast_error *err)
{
	if (!o || n_prompt < 0 || o->max_tokens < 0 || o->n_stop < 0 || o->n_stop > GEN_MAX_STOP || o->draft < 0 ||
	    o->draft > TOAST_DRAFT_MAX)
		return toast_err_set(err, TOAST_ERR_INVALID,
				     "generate: bad options (n_prompt %d, max_tokens %d, %d stop strings, at most %d; draft %d, "
				     "at most %d)",
				     n_prompt, o ? o->max_tokens : 0, o ? o->n_stop : 0, GEN_MAX_STOP, o ? o->draft : 0,
				     TOAST_DRAFT_MAX);
	for (int k = 0; k < o->n_stop; k++) {
		size_t l = o->stop[k] ? strlen(o->stop[k]) : 0;
		if (l == 0 || l > GEN_MAX_STOP_LEN)
			return toast_err_set(err, TOAST_ERR_INVALID, "generate: stop string %d is empty or over %d bytes", k,
					     GEN_MAX_STOP_LEN);
	}
	int n_past = toast_session_n_past(s), n_ctx = toast_session_n_ctx(s);
	if (n_prompt == 0 && !s->have_logits)
		return toast_err_set(err, TOAST_ERR_INVALID, "generate: no prompt and no previous token to continue from");
	if ((long)n_past + n_prompt >= n_ctx)
		return toast_err_set(err, TOAST_ERR_CTX_FULL,
				     "the prompt (%d tokens%s) leaves no room to generate in a context of %d tokens", n_past + n_prompt,
				     n_past ? ", some already in the session" : "", n_ctx);
	return TOAST_OK;
}

/* the next token: from the few largest logits when the sampler can (on the GPU only those
 * cross to the host), else from all of them */
static enum toast_status gen_sample(struct toast_session *s, struct toast_sampler *sp, int32_t *id,
				    struct toast_error *err)
{
	int m = toast_sampler_top_need(sp);
	if (m > 0) {
		int32_t ids[TOAST_SAMPLER_TOP_MAX];
		float vals[TOAST_SAMPLER_TOP_MAX];
		int n = toast_session_top(s, m, ids, vals, err);
		if (n < 0)
			return TOAST_ERR_BACKEND;
		*id = toast_sampler_sample_top(sp, ids, vals, n);
		return TOAST_OK;
	}
	const float *l = toast_session_logits(s);
	if (!l)
		return toast_err_set(err, TOAST_ERR_BACKEND, "the logits could not be read from the backend");
	*id = toast_sampler_sample(sp, l);
	return TOAST_OK;
}

/* Prompt lookup: the tokens after the latest earlier occurrence of the last 4 (down to min_g)
 * of h[0..n) followed by last (the longest that occurred), at most k of them, into out; returns
 * how many. Matches of 2 drafted half wrong (SmolLM2: a code edit's 58% taken, against 71% from
 * 3 or more, a story's 46% against 70%). */
#define GEN_NGRAM_MAX 4
#define GEN_NGRAM_MIN 3
static int gen_lookup(const int32_t *h, int n, int32_t last, int k, int min_g, int32_t *out)
{
	int L = n + 1;
#define H(i) ((i) < n ? h[i] : last)
	for (int g = L - 1 < GEN_NGRAM_MAX ? L - 1 : GEN_NGRAM_MAX; g >= min_g; g--)
		for (int e = L - 2; e >= g - 1; e--) { /* an occurrence ending at e, followed by e + 1 */
			int j = 0;
			while (j < g && H(e - j) == H(L - 1 - j))
				j++;
			if (j < g)
				continue;
			int m = 0;
			for (; m < k && e + 1 + m < L; m++)
				out[m] = H(e + 1 + m);
			return m;
		}
#undef H
	return 0;
}

/* speculative decoding (toast_gen_opts.draft): the last step's tokens, all in the session */
struct gen_spec {
	int k;                          /* the next draft's length at most (0: off) */
	float rate;                     /* the part of the drafts taken lately (a moving average) */
	int32_t next;                   /* the greedy pick after the step's tokens, -1: not known */
	int32_t q[TOAST_DRAFT_MAX + 1]; /* the step's tokens */
	int n, i;                       /* of them, n kept, the first i passed on */
};
_Static_assert(TOAST_DRAFT_MAX + 1 <= TOAST_GDN_KEEP_MAX, "a draft and its first token are one step");
/* Below this part taken lately, drafts only from matches of GEN_NGRAM_MAX: a step of two costs
 * ~1.5x one on a GPU (docs/PERF.md), so a draft of one pays only where over half are taken, and
 * more with the host's wait for the picks (0.7 is from when it cost 1.6x; not measured since). */
#define GEN_RATE_MIN 0.7f

static int gen_min_ngram(const struct gen_spec *g)
{
	return g->rate >= GEN_RATE_MIN ? GEN_NGRAM_MIN : GEN_NGRAM_MAX;
}

enum toast_status toast_generate(struct toast_session *s, const struct toast_tokenizer *tok, const int32_t *prompt,
				 int n_prompt, const struct toast_gen_opts *opts, toast_token_cb cb, void *ud,
				 struct toast_gen_result *res, struct toast_error *err)
{
	double t0 = toast_now();
	memset(res, 0, sizeof(*res));
	enum toast_status rc = gen_check(s, n_prompt, opts, err);
	if (rc != TOAST_OK)
		return rc;
	int n_keep = toast_session_n_past(s), n_ctx = toast_session_n_ctx(s);
	res->n_prompt = n_keep + n_prompt;
	res->n_prefilled = n_prompt;
	struct toast_sampler *sp = NULL;
	struct gen_text t = {0};
	size_t max_stop = 0;
	for (int k = 0; k < opts->n_stop; k++)
		max_stop = strlen(opts->stop[k]) > max_stop ? strlen(opts->stop[k]) : max_stop;
	/* one callback's text: a token's piece, plus what was held back (shorter than a stop string) */
	t.cap_out = (tok ? toast_detok_cap(tok) : 16) + max_stop + 16;
	t.out = malloc(t.cap_out);
	char *piece = malloc(t.cap_out);
	if (!t.out || !piece) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto out;
	}
	rc = toast_sampler_new(&opts->sampling, s->e->model.hp.n_vocab, &sp, err);
	if (rc != TOAST_OK)
		goto out;
	/* the penalty window sees what the session held before, as it would after a full prefill */
	for (int i = n_keep > opts->sampling.repeat_last_n ? n_keep - opts->sampling.repeat_last_n : 0; i < n_keep; i++)
		toast_sampler_accept(sp, s->tokens[i]);
	for (int i = 0; i < n_prompt; i++)
		toast_sampler_accept(sp, prompt[i]);
	if (n_prompt > 0) {
		rc = toast_session_feed(s, prompt, n_prompt, NULL, err);
		if (rc != TOAST_OK)
			goto out;
	}
	if (opts->on_prompt)
		opts->on_prompt(opts->on_prompt_ud, s);
	double t_prefilled = toast_now(), t_first = 0;
	res->t_prefill = t_prefilled - t0;
	struct toast_detok dt;
	toast_detok_init(&dt);
	/* on a backend that picks (greedy, or the sampler's draw where the backend can make it):
	 * each token is fed as it is picked, before the host knows it (engine.h), and the host
	 * streams it while the next step runs; from the first token whose logits are on the
	 * backend (not yet those a cache restore put on the host) */
	/* speculative decoding (no repetition penalty): where a draft is found the chain ends (its
	 * pending pick is the next token, known), and steps of a token and its draft follow until
	 * none is; then the chain begins again */
	struct gen_spec g = {.k = opts->draft, .rate = 1, .next = -1};
	if (g.k > 0 && !toast_sampler_spec_ok(sp))
		g.k = 0;
	bool chainable = s->e->be->async_steps;
	bool chain = false;
	for (;;) {
		if (chainable && !chain && g.next < 0 && g.i >= g.n)
			chain = toast_session_chain_begin(s, sp);
		bool async = s->e->be->async_steps && !chain;
		bool in_session = false; /* fed by a speculative step */
		int32_t id;
		if (chain) {
			if ((id = toast_session_chain_step(s, sp, err)) < 0) {
				rc = err ? err->code : TOAST_ERR_BACKEND;
				goto out;
			}
			int32_t d; /* a draft follows id: the chain ends after it */
			if (g.k > 0 && gen_lookup(s->tokens, toast_session_n_past(s) - 1, id, 1, gen_min_ngram(&g), &d) > 0 &&
			    (g.next = toast_session_chain_end(s, err)) < 0) {
				rc = err ? err->code : TOAST_ERR_BACKEND;
				goto out;
			}
		} else if (g.i < g.n) {
			id = g.q[g.i++];
			in_session = true;
		} else if (g.next >= 0) {
			id = g.next;
			g.next = -1;
		} else if ((rc = gen_sample(s, sp, &id, err)) != TOAST_OK) {
			goto out;
		}
		if (g.k > 0 && !in_session && !chain) { /* a draft of what follows id, verified with it */
			int n_past = toast_session_n_past(s), k = g.k;
			k = k < n_ctx - n_past - 1 ? k : n_ctx - n_past - 1;
			if (opts->max_tokens > 0 && k > opts->max_tokens - res->n_generated - 1)
				k = opts->max_tokens - res->n_generated - 1;
			int nd = k > 0 ? gen_lookup(s->tokens, n_past, id, k, gen_min_ngram(&g), g.q + 1) : 0;
			/* steps of 2, 4 or 8 (TOAST_DRAFT_MAX + 1): few shapes to record */
			nd = nd >= TOAST_DRAFT_MAX ? TOAST_DRAFT_MAX : nd >= 3 ? 3 : nd > 0;
			if (nd > 0) {
				g.q[0] = id;
				g.n = toast_session_spec_step(s, g.q, 1 + nd, sp, &g.next, err);
				if (g.n < 0) {
					rc = err ? err->code : TOAST_ERR_BACKEND;
					goto out;
				}
				if (g.n == 0) { /* no memory for the states it keeps: no more drafts (id is fed below) */
					TOAST_WARN("speculative decoding off: %s", err ? err->msg : "");
					g.k = 0;
				} else {
					res->n_drafted += nd;
					res->n_accepted += g.n - 1;
					g.rate = 0.7f * g.rate + 0.3f * (float)(g.n - 1) / (float)nd;
					/* all taken: longer drafts; else as long as the part taken (one at least) */
					g.k = g.n - 1 == nd ? (2 * g.k < opts->draft ? 2 * g.k : opts->draft) : g.n > 1 ? g.n - 1 : 1;
					g.i = 1;
					in_session = true;
				}
			}
		}
		toast_sampler_accept(sp, id);
		if (res->n_generated++ == 0) {
			t_first = toast_now();
			res->t_first = t_first - t0;
		}
		bool eog = tok && !opts->ignore_eos && toast_tok_is_eog(tok, id);
		enum toast_finish finish = TOAST_FINISH_STOP;
		bool last = eog;
		if (!last && opts->max_tokens > 0 && res->n_generated >= opts->max_tokens) {
			last = true;
			finish = TOAST_FINISH_LENGTH;
		}
		/* the session's tokens through id (chain: id is fed; a speculative step: and those after it) */
		int through = chain ? toast_session_n_past(s) : in_session ? toast_session_n_past(s) - (g.n - g.i)
										    : toast_session_n_past(s) + 1;
		if (!last && through >= n_ctx) {
			last = true;
			finish = TOAST_FINISH_CTX;
		}
		/* the token is fed whatever follows; where that only queues the step, it runs while
		 * the text is found and streamed (a write to a pipe a token, else on its path) */
		enum toast_status fed = TOAST_ERR_INVALID;
		if (async && !in_session)
			fed = toast_session_feed(s, &id, 1, NULL, err);
		size_t n_piece = tok && !eog ? toast_detok_push(&dt, tok, id, piece, t.cap_out) : 0;
		if (!gen_hold(&t, piece, n_piece)) {
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			goto out;
		}
		size_t n_out;
		long stop_at = gen_find_stop(&t, opts);
		if (stop_at >= 0) {
			n_out = gen_take(&t, (size_t)stop_at);
			last = true;
			finish = TOAST_FINISH_STOP;
		} else if (last) {
			n_out = gen_take(&t, t.n_hold);
			n_out += toast_detok_flush(&dt, t.out + n_out, t.cap_out - n_out);
		} else {
			n_out = gen_take(&t, gen_safe_prefix(&t, opts));
		}
		int cancel = cb ? cb(ud, id, t.out, n_out) : 0;
		rc = chain || in_session ? TOAST_OK : async ? fed : toast_session_feed(s, &id, 1, NULL, err);
		if (rc == TOAST_OK && (cancel || last) && g.i < g.n) /* the session ends at id */
			rc = toast_session_spec_trim(s, g.i, err);
		if (rc != TOAST_OK)
			goto out;
		if (cancel || last) {
			res->finish = cancel ? TOAST_FINISH_CANCELLED : finish;
			break;
		}
		chain = chain && g.next < 0; /* (ended) */
	}
	res->t_decode = toast_now() - t_first;
out:
	toast_sampler_free(sp);
	free(t.hold);
	free(t.out);
	free(piece);
	return rc;
}
