/*
 * libFuzzer harness: a real chat template (Qwen3's: FZ_TEMPLATE names a tokenizer_config.json,
 * default build/testdata/models/qwen3next-vocab/tokenizer_config.json) rendered with a context
 * that is the input, as a client's messages and tools reach it. Build: `make fuzz`; run:
 * build-fuzz/fz_chat -max_total_time=600 DIR build-fuzz/seeds-chat.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "tokenizer/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct jinja_template *t;
	struct toast_error err = {0};
	if (!t) {
		const char *path = getenv("FZ_TEMPLATE");
		path = path ? path : "build/testdata/models/qwen3next-vocab/tokenizer_config.json";
		json_t *cfg = json_load_file(path, 0, NULL);
		const char *src = json_string_value(json_object_get(cfg, "chat_template"));
		if (!src || jinja_parse(src, &t, &err) != TOAST_OK) {
			fprintf(stderr, "fz_chat: no chat template in %s %s\n", path, err.msg);
			abort();
		}
		json_decref(cfg);
	}
	json_t *ctx = json_loadb((const char *)data, size, 0, NULL);
	if (!json_is_object(ctx)) {
		json_decref(ctx);
		return 0;
	}
	char *out = NULL;
	size_t len;
	jinja_render(t, ctx, &out, &len, &err);
	free(out);
	json_decref(ctx);
	return 0;
}
