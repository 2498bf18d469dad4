/*
 * libFuzzer harness: any text (the input) through a real tokenizer (Qwen3's 151,936 tokens:
 * FZ_TOKENIZER names a model directory, default build/testdata/models/qwen3next-vocab), then
 * decoded. Besides crashes it checks a property: the text y that decode(encode(x)) gives (x
 * made valid UTF-8 and normalised) comes back unchanged from another round trip. That holds for
 * Qwen3's tokenizer (NFC, added tokens that strip nothing), not for every one, upstream's
 * included: tests/data/tokenizer/llama3-style (NFKC, "[MASK]" added with lstrip, matched before
 * normalisation) takes "\n\uff3bMASK]" to "\n[MASK]" and that to "[MASK]", as Hugging Face's
 * tokenizers does; FZ_ROUNDTRIP=0 leaves the property out for such tokenizers.
 * Build: `make fuzz`; run: build-fuzz/fz_encode -max_total_time=600 -max_len=4096 DIR.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toasted.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *round_trip(const struct toast_tokenizer *tok, const char *text, size_t n, size_t *len)
{
	struct toast_error err = {0};
	int32_t *ids = NULL;
	int n_ids = 0;
	char *out = NULL;
	if (toast_tok_encode(tok, text, n, &ids, &n_ids, &err) == TOAST_OK &&
	    toast_tok_decode(tok, ids, n_ids, &out, len, &err) != TOAST_OK)
		out = NULL;
	free(ids);
	return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct toast_tokenizer *tok;
	static bool check;
	if (!tok) {
		const char *rt = getenv("FZ_ROUNDTRIP");
		check = !rt || strcmp(rt, "0") != 0;
		struct toast_error err = {0};
		const char *dir = getenv("FZ_TOKENIZER");
		dir = dir ? dir : "build/testdata/models/qwen3next-vocab";
		if (toast_tok_load(dir, &tok, &err) != TOAST_OK) {
			fprintf(stderr, "fz_encode: %s\n", err.msg);
			abort();
		}
	}
	size_t n1 = 0, n2 = 0;
	char *y = round_trip(tok, (const char *)data, size, &n1);
	char *z = y && check ? round_trip(tok, y, n1, &n2) : NULL;
	if (y && check && (!z || n1 != n2 || memcmp(y, z, n1) != 0)) {
		fprintf(stderr, "fz_encode: a second round trip changed the text (%zu -> %zu bytes)\n", n1, n2);
		abort();
	}
	free(y);
	free(z);
	return 0;
}
