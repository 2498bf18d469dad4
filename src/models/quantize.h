/*
 * quantize.h - which quantised type each tensor gets under a mix (shared by `toasted convert`
 * and load-time `--quant`), and quantising a loaded model's matrices in place.
 */
#ifndef TOAST_MODELS_QUANTIZE_H
#define TOAST_MODELS_QUANTIZE_H

#include "models/model.h"

/* "q4_k_m" -> TOAST_MIX_Q4_K_M (case-insensitive; "none" too); false when unknown */
bool toast_quant_mix_parse(const char *s, enum toast_quant_mix *out);
const char *toast_quant_mix_name(enum toast_quant_mix mix);
/* GGUF general.file_type of a mix (llama.cpp's LLAMA_FTYPE numbers) */
int toast_quant_mix_ftype(enum toast_quant_mix mix);

/*
 * The type for matrix hf_name (Hugging Face name; rows of n_in elements; layer from the name, of
 * n_layer) under mix, as llama.cpp's quantiser chooses: the router, the shared-expert gate and
 * the GDN conv keep src; the output head (or a tied embedding) gets Q6_K under 4/5-bit mixes;
 * Q4_K_M/Q5_K_M give attention V and FFN down Q6_K in the first and last eighth of the layers
 * and every third layer between. A row that is not whole blocks falls back (Q4_K -> Q4_1,
 * Q5_K/Q6_K -> Q8_0, then BF16), as llama.cpp falls back to its 32-element types.
 */
enum toast_dtype toast_quant_pick(enum toast_quant_mix mix, const char *hf_name, bool tied_embd, int n_layer,
				  int64_t n_in, enum toast_dtype src);

/* Quantise every matrix (n_out > 1) of a bound model per mix (a quantised one is dequantised
 * first: requantising, for accuracy measurements); the new data is owned by m->td. Vectors are
 * left as they are. */
enum toast_status toast_model_quantize(struct toast_model *m, enum toast_quant_mix mix, struct toast_error *err);

#endif
