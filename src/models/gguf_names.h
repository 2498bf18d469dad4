/*
 * gguf_names.h - GGUF as a model format (gguf_model.c): llama.cpp architecture names, the
 * Hugging Face <-> GGUF tensor name table, hparams from metadata, and the tensor directory of a
 * GGUF file under Hugging Face names (transforms in gguf_model.c's header comment).
 */
#ifndef TOAST_MODELS_GGUF_NAMES_H
#define TOAST_MODELS_GGUF_NAMES_H

#include "format/gguf.h"
#include "models/model.h"

/* "qwen3next", "llama", ... for an arch; NULL if GGUF has none */
const char *toast_gguf_arch_name(enum toast_arch a);
/* The GGUF name of Hugging Face tensor hf ("model.layers.3.mlp.gate.weight" ->
 * "blk.3.ffn_gate_inp.weight"; stacked experts as "model.layers.N.mlp.experts.gate_proj");
 * false when the arch has no such tensor. */
bool toast_gguf_name_from_hf(enum toast_arch arch, const char *hf, char *out, size_t cap);
/* hparams from a GGUF's metadata (and the presence of some tensors). */
enum toast_status toast_hparams_from_gguf(struct toast_hparams *hp, const struct toast_gguf *g,
					  struct toast_error *err);
/* The tensor directory of g under Hugging Face names; data points into g's mapping (or into
 * buffers td owns), so g must stay open while td is used. */
enum toast_status toast_gguf_tensordir(const struct toast_gguf *g, const struct toast_hparams *hp,
				       struct toast_tensordir *td, struct toast_error *err);

#endif
