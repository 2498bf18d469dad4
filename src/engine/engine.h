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
};

struct toast_session {
	struct toast_engine *e;
	struct toast_state state;
	int n_past;
	int32_t *tokens; /* host [n_ctx]: the tokens the state holds, [0, n_past) */
	float *logits;   /* host [n_vocab] */
	bool have_logits;
};

#endif
