/*
 * chat.c - toast_chat_render / toast_chat_render_json: messages -> the prompt text the model was
 * trained on.
 *
 * The model's own chat template (chat_template.jinja, else tokenizer_config.json's chat_template)
 * runs in the Jinja interpreter with the variables transformers' apply_chat_template passes:
 * messages, tools (when given), add_generation_prompt, the template keyword enable_thinking
 * (when set), and bos_token / eos_token / pad_token / unk_token (when the model defines them).
 * A model without a template gets ChatML: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok.h"
#include "util/err.h"

#define CHAT_MAX_JSON ((size_t)64 << 20)

static enum toast_status chat_chatml(json_t *msgs, const struct toast_chat_opts *o, char **out,
				     struct toast_error *err)
{
	size_t n = 64, i;
	json_t *m;
	json_array_foreach(msgs, i, m)
	{
		json_t *c = json_object_get(m, "content");
		if (!json_is_string(json_object_get(m, "role")) || !(json_is_string(c) || json_is_null(c)))
			return toast_err_set(err, TOAST_ERR_INVALID,
					     "message %zu: the built-in ChatML format needs a string role and content", i);
		n += strlen(json_string_value(json_object_get(m, "role"))) + json_string_length(c) + 32;
	}
	char *s = malloc(n), *p = s;
	if (!s)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	json_array_foreach(msgs, i, m)
	{
		json_t *c = json_object_get(m, "content");
		p += sprintf(p, "<|im_start|>%s\n", json_string_value(json_object_get(m, "role")));
		memcpy(p, json_is_string(c) ? json_string_value(c) : "", json_string_length(c));
		p += json_string_length(c);
		p += sprintf(p, "<|im_end|>\n");
	}
	if (o->add_generation_prompt)
		p += sprintf(p, "<|im_start|>assistant\n");
	*p = 0;
	*out = s;
	return TOAST_OK;
}

static enum toast_status chat_render(const struct toast_tokenizer *tok, json_t *msgs, json_t *tools,
				     const struct toast_chat_opts *opts, char **out, struct toast_error *err)
{
	struct toast_chat_opts defaults = {.add_generation_prompt = true, .enable_thinking = -1};
	if (!opts)
		opts = &defaults;
	if (!tok->chat_template)
		return chat_chatml(msgs, opts, out, err);
	if (!tok->chat_tmpl)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "the model's chat template is not supported: %s",
				     tok->chat_tmpl_error ? tok->chat_tmpl_error : "?");
	json_t *ctx = json_object();
	if (!ctx)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	json_object_set(ctx, "messages", msgs);
	if (tools)
		json_object_set(ctx, "tools", tools);
	json_object_set_new(ctx, "add_generation_prompt", json_boolean(opts->add_generation_prompt));
	if (opts->enable_thinking >= 0)
		json_object_set_new(ctx, "enable_thinking", json_boolean(opts->enable_thinking));
	const char *names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
	const char *vals[] = {tok->bos_token, tok->eos_token, tok->pad_token, tok->unk_token};
	for (int i = 0; i < 4; i++)
		if (vals[i])
			json_object_set_new(ctx, names[i], json_string(vals[i]));
	size_t len;
	enum toast_status rc = jinja_render(tok->chat_tmpl, ctx, out, &len, err);
	json_decref(ctx);
	return rc;
}

enum toast_status toast_chat_render(const struct toast_tokenizer *tok, const struct toast_chat_msg *msgs, int n_msgs,
				    const struct toast_chat_opts *opts, char **out, struct toast_error *err)
{
	*out = NULL;
	if (n_msgs < 0 || (n_msgs > 0 && !msgs))
		return toast_err_set(err, TOAST_ERR_INVALID, "no messages");
	json_t *arr = json_array();
	for (int i = 0; arr && i < n_msgs; i++) {
		if (!msgs[i].role || !msgs[i].content) {
			json_decref(arr);
			return toast_err_set(err, TOAST_ERR_INVALID, "message %d has no role or content", i);
		}
		json_t *m = json_pack("{s:s, s:s}", "role", msgs[i].role, "content", msgs[i].content);
		if (!m) { /* jansson refuses invalid UTF-8 */
			json_decref(arr);
			return toast_err_set(err, TOAST_ERR_INVALID, "message %d is not valid UTF-8", i);
		}
		json_array_append_new(arr, m);
	}
	if (!arr)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = chat_render(tok, arr, NULL, opts, out, err);
	json_decref(arr);
	return rc;
}

enum toast_status toast_chat_render_json(const struct toast_tokenizer *tok, const char *messages_json,
					 const char *tools_json, const struct toast_chat_opts *opts, char **out,
					 struct toast_error *err)
{
	*out = NULL;
	json_error_t je;
	if (!messages_json || strlen(messages_json) > CHAT_MAX_JSON)
		return toast_err_set(err, TOAST_ERR_INVALID, "messages: missing or over %zu bytes", CHAT_MAX_JSON);
	json_t *msgs = json_loads(messages_json, 0, &je);
	if (!json_is_array(msgs)) {
		json_decref(msgs);
		return toast_err_set(err, TOAST_ERR_INVALID, "messages: expected a JSON array of messages (%s)",
				     msgs ? "not an array" : je.text);
	}
	size_t i;
	json_t *m;
	json_array_foreach(msgs, i, m) if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
	{
		json_decref(msgs);
		return toast_err_set(err, TOAST_ERR_INVALID, "messages[%zu]: expected an object with a \"role\"", i);
	}
	json_t *tools = NULL;
	if (tools_json) {
		tools = json_loads(tools_json, 0, &je);
		if (!json_is_array(tools)) {
			json_decref(msgs);
			json_decref(tools);
			return toast_err_set(err, TOAST_ERR_INVALID, "tools: expected a JSON array");
		}
	}
	enum toast_status rc = chat_render(tok, msgs, tools, opts, out, err);
	json_decref(msgs);
	json_decref(tools);
	return rc;
}
