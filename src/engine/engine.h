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
};

struct toast_session {
	struct toast_engine *e;
	struct toast_state state;
	int n_past;
	int32_t *tokens; /* host [n_ctx]: the tokens the state holds, [0, n_past) */
	float *logits;   /* host [n_vocab]; the truth unless logits_dev */
	bool have_logits;
	bool logits_dev; /* the last logits are in e->work.logits (row 0), not yet read */
};

/* The host copy of the session's logits has just been written (a cache restore): it is the truth. */
void toast_session_logits_on_host(struct toast_session *s);

#endif
