/*
 * libFuzzer harness: a tokenizer.json document (the input) built into a tokenizer, which then
 * encodes and decodes a fixed text (ASCII, digits, accents, CJK, an added-token spelling,
 * invalid UTF-8). Build: `make fuzz`; run: build-fuzz/fz_tok -max_total_time=600 DIR
 * build-fuzz/seeds-tok.
 */
#include <stdint.h>
#include <stdlib.h>

#include <jansson.h>

#include "tokenizer/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char text[] = "Hello, world! 123 4567 \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87  \n\n\t<|im_start|>x\xff\xfe";
	json_t *root = json_loadb((const char *)data, size, 0, NULL);
	if (!root)
		return 0;
	struct toast_error err = {0};
	struct toast_tokenizer *tok = NULL;
	if (tok_build(root, NULL, NULL, NULL, "fuzz", &tok, &err) == TOAST_OK) {
		int32_t *ids = NULL;
		int n = 0;
		if (toast_tok_encode(tok, text, sizeof(text) - 1, &ids, &n, &err) == TOAST_OK) {
			char *out = NULL;
			size_t len = 0;
			if (toast_tok_decode(tok, ids, n, &out, &len, &err) == TOAST_OK)
				free(out);
			free(ids);
		}
		toast_tok_free(tok);
	}
	json_decref(root);
	return 0;
}
