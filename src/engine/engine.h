/*
 * engine.h - engine internals shared by engine/ files and tests (not part of the public API).
 */
#ifndef TOAST_ENGINE_ENGINE_H
#define TOAST_ENGINE_ENGINE_H

#include "models/model.h"
#include "toasted.h"

struct toast_engine {
	struct toast_model model;
	struct toast_backend *be;
	struct toast_work work; /* shared by the engine's sessions: one computes at a time */
	int chunk;
	enum toast_quant_mix quant;
	struct toast_model_info info;
	struct toast_tokenizer *tok; /* NULL when the model directory has no tokenizer.json */
	/* the session whose last logits are still only in work.logits (row 0), if any: its next
	 * competitor for work.logits first copies them to the session's host buffer */
	struct toast_session *logits_owner;
	int picks_pending; /* queued on the backend (toast_backend_ops.pick), not yet read */
};

struct toast_session {
	struct toast_engine *e;
	struct toast_state state;
	int n_past;
	int32_t *tokens; /* host [n_ctx]: the tokens the state holds, [0, n_past) */
	float *logits;   /* host [n_vocab]; the truth unless logits_dev */
	bool have_logits;
	bool logits_dev; /* the last logits are in e->work.logits (row 0), not yet read */
	int spec_pos, spec_T, spec_n; /* the last speculative step: at spec_pos, spec_n of spec_T kept */
};

/* The host copy of the session's logits has just been written (a cache restore): it is the truth. */
void toast_session_logits_on_host(struct toast_session *s);

/*
 * Decoding with the picks made on the backend, each step queued before its token is known
 * (toast_backend_ops.pick), so the host streams a token while the step that feeds it runs:
 * greedy, or the sampler's draw where the backend can make it (toast_sampler_backend_draw).
 * chain_begin queues the pick of the session's last logits: false when the backend cannot
 * pick, the sampler cannot be drawn from there, or the logits are not on it (the caller picks
 * on the host; nothing is taken from the sampler). Each chain_step then feeds that pick as a
 * token, queues the pick of the logits it makes and returns the fed token once known, as
 * toast_session_top then toast_sampler_sample_top then toast_session_feed would; -1 on failure
 * (err set, the session reset). One uniform is taken from the sampler a pick queued.
 */
bool toast_session_chain_begin(struct toast_session *s, struct toast_sampler *sp);
int32_t toast_session_chain_step(struct toast_session *s, struct toast_sampler *sp, struct toast_error *err);
/* Leave a chain after a step: the pending pick (the token after the last fed, not fed) once
 * known, or -1 on failure (err set, the session reset); the session keeps its logits. */
int32_t toast_session_chain_end(struct toast_session *s, struct toast_error *err);

/*
 * Speculative steps. spec_step feeds ids[0..T) (1 <= T <= TOAST_GDN_KEEP_MAX; ids[0] the pick of
 * the session's logits, ids[1..T) a draft of what follows) in one forward pass, picks a token
 * from each row of logits (sp NULL or greedy: the largest, the lower id among equals, as top()
 * and greedy sampling choose; else sp's draw, toast_sampler_spec_ok, each row with the uniform
 * its token takes in order) and keeps ids[0..n), n - 1 being how many of the draft agree in order
 * with the model's picks: the session then holds them, as feeding them one at a time would leave
 * it, with the logits of ids[n - 1], whose pick is *next; sp has given the n picks' uniforms, as
 * sampling them one at a time would (a draft token is taken where the draw would have chosen it:
 * the tokens are those of plain sampling with the same seed). Returns n; 0 when the states after
 * each token cannot be kept (no memory: nothing done, err says why); -1 on failure (err set, the
 * session reset). spec_trim(s, n) keeps only the first n (1 <= n <= what spec_step kept) of
 * them; only before anything else runs on the session.
 */
int toast_session_spec_step(struct toast_session *s, const int32_t *ids, int T, struct toast_sampler *sp,
			    int32_t *next, struct toast_error *err);
enum toast_status toast_session_spec_trim(struct toast_session *s, int n, struct toast_error *err);

/* The draw of the next token on a backend (toast_backend_ops.pick): true with *d set (prev false)
 * and its uniform taken from the generator (d NULL: nothing taken; d->n_top 0 where the draw is
 * from every logit, toast_sampler_top_need 0), false for greedy with no penalty (no draw: the
 * largest). */
bool toast_sampler_backend_draw(struct toast_sampler *sp, struct toast_draw *d);
/* Speculative sampling (toast_session_spec_step with a sampler): spec_ok when a token's draw
 * depends only on its row of logits and its uniform (no repetition penalty), so that the draws
 * of a step's rows can be made at once. draws fills d[0..rows) with the draws of the next rows
 * tokens, as toast_sampler_backend_draw would make them one after the other, and leaves the
 * generator where it was (false, nothing filled: greedy, no draw). take then takes the uniforms
 * of the next n tokens' draws, as n draws would. */
bool toast_sampler_spec_ok(const struct toast_sampler *sp);
bool toast_sampler_draws(struct toast_sampler *sp, struct toast_draw *d, int rows);
void toast_sampler_take(struct toast_sampler *sp, int n);

#endif
