/*
 * convert.h - `toasted convert`: a Hugging Face model directory to one GGUF file.
 */
#ifndef TOAST_MODELS_CONVERT_H
#define TOAST_MODELS_CONVERT_H

#include "format/gguf.h"
#include "models/model.h"

/* Write dir's model to out_path as GGUF v3 with the quantisation mix (not TOAST_MIX_NONE). */
enum toast_status toast_convert(const char *dir, const char *out_path, enum toast_quant_mix mix,
				struct toast_error *err);
/* The tokenizer.ggml.* metadata and chat template from dir's tokenizer.json and
 * tokenizer_config.json (nothing when there is no tokenizer.json). */
enum toast_status toast_convert_tokenizer(struct toast_gguf_writer *w, const char *dir, const struct toast_hparams *hp,
					  struct toast_error *err);

#endif
