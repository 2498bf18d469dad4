/*
 * libFuzzer harness: a chat template (the input) parsed and rendered with a fixed conversation
 * (messages with tool calls and content parts, tools, the special tokens). Build: `make fuzz`;
 * run: build-fuzz/fz_jinja -max_total_time=600 -rss_limit_mb=2560 -max_len=8192 DIR
 * build-fuzz/seeds-jinja (tests/fuzz/seeds.sh makes the seeds).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static json_t *ctx;
	if (!ctx)
		ctx = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
				 "{\"role\": \"user\", \"content\": \"hi <b>\"},"
				 "{\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\":"
				 " {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
				 "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}],"
				 "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
				 "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}",
				 0, NULL);
	char *src = malloc(size + 1);
	if (!src)
		return 0;
	memcpy(src, data, size);
	src[size] = 0;
	struct toast_error err = {0};
	struct jinja_template *t = NULL;
	char *out = NULL;
	size_t len;
	if (jinja_parse(src, &t, &err) == TOAST_OK)
		jinja_render(t, ctx, &out, &len, &err);
	jinja_free(t);
	free(out);
	free(src);
	return 0;
}
