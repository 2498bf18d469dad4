/*
 * provider.h - toast's fallback when no daemon runs: an OpenAI-compatible chat completions
 * endpoint (TOAST_API_BASE, TOAST_API_KEY, TOAST_MODEL), streamed over server-sent events.
 */
#ifndef TOAST_CLIENT_PROVIDER_H
#define TOAST_CLIENT_PROVIDER_H

#include "proto/proto.h"

struct toast_provider {
	const char *base;  /* e.g. https://api.openai.com/v1 (".../chat/completions" is appended) */
	const char *key;   /* bearer token, may be empty */
	const char *model;
};

/* Called with each piece of the answer; return nonzero to stop. */
typedef int (*toast_text_cb)(void *ud, const char *text, size_t len);

/* Stream one chat completion. TOAST_ERR_UNSUPPORTED when libcurl cannot be loaded. */
enum toast_status toast_provider_chat(const struct toast_provider *p, const struct toast_chat_msg *msgs, int n_msgs,
				      const struct toast_proto_params *params, toast_text_cb cb, void *ud,
				      struct toast_error *err);

#endif
