/*
 * proto.c - request parsing and validation, request and event writing, event parsing.
 *
 * Requests are parsed with jansson (which rejects invalid UTF-8, NUL characters and deep
 * nesting); events are written by hand with toast_buf_json_escape because a delta goes out for
 * every token. Strings handed out point into the request's JSON tree (r->root).
 */
#include "proto/proto.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/utf8.h"

const char *toast_proto_code_name(enum toast_proto_code c)
{
	switch (c) {
	case TOAST_PROTO_OK: return "ok";
	case TOAST_PROTO_BAD_REQUEST: return "bad_request";
	case TOAST_PROTO_BAD_VERSION: return "bad_version";
	case TOAST_PROTO_TOO_LARGE: return "too_large";
	case TOAST_PROTO_CONTEXT: return "context_length";
	case TOAST_PROTO_BUSY: return "busy";
	case TOAST_PROTO_SHUTDOWN: return "shutdown";
	case TOAST_PROTO_UNSUPPORTED: return "unsupported";
	case TOAST_PROTO_INTERNAL: return "internal";
	}
	return "internal";
}

enum toast_proto_code toast_proto_code_from_status(enum toast_status st)
{
	switch (st) {
	case TOAST_OK: return TOAST_PROTO_OK;
	case TOAST_ERR_INVALID:
	case TOAST_ERR_FORMAT: return TOAST_PROTO_BAD_REQUEST;
	case TOAST_ERR_CTX_FULL: return TOAST_PROTO_CONTEXT;
	case TOAST_ERR_UNSUPPORTED: return TOAST_PROTO_UNSUPPORTED;
	case TOAST_ERR_BUSY: return TOAST_PROTO_BUSY;
	case TOAST_ERR_CANCELLED: return TOAST_PROTO_SHUTDOWN;
	default: return TOAST_PROTO_INTERNAL;
	}
}

static bool proto_fail(struct toast_proto_fail *f, enum toast_proto_code code, const char *fmt, ...)
	TOAST_PRINTF(3, 4);
static bool proto_fail(struct toast_proto_fail *f, enum toast_proto_code code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
	va_end(ap);
	f->code = code;
	return false;
}

/* ---- framing ---- */

int toast_proto_line(const struct toast_buf *b, size_t *scan, size_t max, size_t *line_len)
{
	const char *nl = *scan < b->len ? memchr(b->data + *scan, '\n', b->len - *scan) : NULL;
	if (!nl) {
		*scan = b->len;
		return b->len > max ? -1 : 0;
	}
	size_t n = (size_t)(nl - b->data);
	if (n > max)
		return -1;
	*line_len = n > 0 && b->data[n - 1] == '\r' ? n - 1 : n;
	*scan = n + 1;
	return 1;
}

/* ---- requests ---- */

void toast_proto_params_init(struct toast_proto_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temperature = p->top_p = p->min_p = p->repeat_penalty = NAN;
	p->top_k = p->draft = -1;
	p->stream = true;
	p->enable_thinking = -1;
}

void toast_proto_req_deinit(struct toast_proto_req *r)
{
	if (!r)
		return;
	free(r->msgs);
	json_decref(r->root);
	memset(r, 0, sizeof(*r));
}

/* An optional number in [lo, hi]; absent or null leaves *out alone. */
static bool proto_num(json_t *obj, const char *key, double lo, double hi, double *out, struct toast_proto_fail *f)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return true;
	if (!json_is_number(v))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"%s\" must be a number", key);
	double x = json_number_value(v);
	if (!(x >= lo && x <= hi))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"%s\" must be in [%g, %g]", key, lo, hi);
	*out = x;
	return true;
}

static bool proto_int(json_t *obj, const char *key, long long lo, long long hi, long long *out, bool *set,
		      struct toast_proto_fail *f)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return true;
	if (!json_is_integer(v))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"%s\" must be an integer", key);
	long long x = json_integer_value(v);
	if (x < lo || x > hi)
		return proto_fail(f, x > hi ? TOAST_PROTO_TOO_LARGE : TOAST_PROTO_BAD_REQUEST,
				  "\"%s\" must be in [%lld, %lld]", key, lo, hi);
	*out = x;
	if (set)
		*set = true;
	return true;
}

static bool proto_bool(json_t *obj, const char *key, int *out, struct toast_proto_fail *f)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return true;
	if (!json_is_boolean(v))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"%s\" must be true or false", key);
	*out = json_is_true(v);
	return true;
}

/* OpenAI content: a string, or an array of {"type":"text","text":...} parts (joined), or null. */
static bool proto_content(json_t *msg, int i, const char **out, size_t *n, struct toast_proto_fail *f)
{
	json_t *c = json_object_get(msg, "content");
	if (json_is_string(c)) {
		*out = json_string_value(c);
		*n = json_string_length(c);
		return true;
	}
	if (!c || json_is_null(c)) {
		*out = "";
		*n = 0;
		return true;
	}
	if (!json_is_array(c))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "messages[%d].content must be a string", i);
	struct toast_buf b;
	toast_buf_init(&b);
	size_t k;
	json_t *part;
	json_array_foreach(c, k, part)
	{
		json_t *t = json_object_get(part, "text");
		const char *type = json_string_value(json_object_get(part, "type"));
		if (!type || strcmp(type, "text") != 0 || !json_is_string(t)) {
			toast_buf_deinit(&b);
			return proto_fail(f, TOAST_PROTO_UNSUPPORTED, "messages[%d].content[%zu]: only text parts are supported", i, k);
		}
		if (!toast_buf_append(&b, json_string_value(t), json_string_length(t))) {
			toast_buf_deinit(&b);
			return proto_fail(f, TOAST_PROTO_INTERNAL, "out of memory");
		}
	}
	json_t *s = json_stringn(b.data ? b.data : "", b.len);
	toast_buf_deinit(&b);
	if (!s || json_object_set_new(msg, "content", s) != 0)
		return proto_fail(f, TOAST_PROTO_INTERNAL, "out of memory");
	*out = json_string_value(s);
	*n = json_string_length(s);
	return true;
}

static bool proto_role_ok(const char *role)
{
	static const char *roles[] = {"system", "user", "assistant", "tool"};
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		if (strcmp(role, roles[i]) == 0)
			return true;
	return false;
}

static bool proto_messages(json_t *obj, struct toast_proto_req *r, struct toast_proto_fail *f)
{
	json_t *ms = json_object_get(obj, "messages");
	if (!json_is_array(ms))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"messages\" must be an array of {role, content}");
	size_t n = json_array_size(ms);
	if (n == 0)
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"messages\" is empty");
	if (n > TOAST_PROTO_MAX_MESSAGES)
		return proto_fail(f, TOAST_PROTO_TOO_LARGE, "%zu messages, more than the %d allowed", n,
				  TOAST_PROTO_MAX_MESSAGES);
	r->msgs = calloc(n, sizeof(*r->msgs));
	if (!r->msgs)
		return proto_fail(f, TOAST_PROTO_INTERNAL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(ms, i);
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!json_is_object(m) || !role)
			return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "messages[%zu] needs a string \"role\"", i);
		if (!proto_role_ok(role))
			return proto_fail(f, TOAST_PROTO_BAD_REQUEST,
					  "messages[%zu]: unknown role (system, user, assistant or tool)", i);
		size_t len = 0;
		if (!proto_content(m, (int)i, &r->msgs[i].content, &len, f))
			return false;
		r->msgs[i].role = role;
		r->content_bytes += len;
	}
	r->n_msgs = (int)n;
	return true;
}

static bool proto_stop(json_t *obj, struct toast_proto_params *p, struct toast_proto_fail *f)
{
	json_t *s = json_object_get(obj, "stop");
	if (!s || json_is_null(s))
		return true;
	json_t *one[1] = {s};
	json_t **items = one;
	size_t n = 1;
	if (json_is_array(s)) {
		n = json_array_size(s);
		if (n > TOAST_PROTO_MAX_STOP)
			return proto_fail(f, TOAST_PROTO_TOO_LARGE, "more than %d stop strings", TOAST_PROTO_MAX_STOP);
		items = NULL;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *v = items ? items[i] : json_array_get(s, i);
		if (!json_is_string(v) || json_string_length(v) == 0)
			return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"stop\" must be a non-empty string or an array of them");
		if (json_string_length(v) > TOAST_PROTO_MAX_STOP_BYTES)
			return proto_fail(f, TOAST_PROTO_TOO_LARGE, "a stop string is longer than %d bytes",
					  TOAST_PROTO_MAX_STOP_BYTES);
		p->stop[p->n_stop++] = json_string_value(v);
	}
	return true;
}

bool toast_proto_chat_parse(json_t *obj, struct toast_proto_req *r, struct toast_proto_fail *f)
{
	struct toast_proto_params *p = &r->p;
	long long max_tokens = 0, top_k = -1, seed = 0, draft = -1;
	int stream = p->stream;
	if (!proto_messages(obj, r, f) ||
	    !proto_int(obj, "max_tokens", 1, TOAST_PROTO_MAX_TOKENS, &max_tokens, NULL, f) ||
	    !proto_int(obj, "max_completion_tokens", 1, TOAST_PROTO_MAX_TOKENS, &max_tokens, NULL, f) ||
	    !proto_num(obj, "temperature", 0, 100, &p->temperature, f) ||
	    !proto_num(obj, "top_p", 0, 1, &p->top_p, f) || !proto_num(obj, "min_p", 0, 1, &p->min_p, f) ||
	    !proto_num(obj, "repeat_penalty", 0.01, 100, &p->repeat_penalty, f) ||
	    !proto_int(obj, "top_k", 0, 1 << 24, &top_k, NULL, f) ||
	    !proto_int(obj, "draft", 0, TOAST_DRAFT_MAX, &draft, NULL, f) ||
	    !proto_int(obj, "seed", INT64_MIN, INT64_MAX, &seed, &p->has_seed, f) || !proto_stop(obj, p, f) ||
	    !proto_bool(obj, "stream", &stream, f) || !proto_bool(obj, "enable_thinking", &p->enable_thinking, f))
		return false;
	json_t *kw = json_object_get(obj, "chat_template_kwargs"); /* the vLLM spelling */
	if (json_is_object(kw) && !proto_bool(kw, "enable_thinking", &p->enable_thinking, f))
		return false;
	p->max_tokens = (int)max_tokens;
	p->top_k = (int)top_k;
	p->draft = (int)draft;
	p->seed = (uint64_t)seed;
	p->stream = stream;
	return true;
}

bool toast_proto_req_parse(const char *line, size_t len, struct toast_proto_req *r, struct toast_proto_fail *f)
{
	memset(r, 0, sizeof(*r));
	toast_proto_params_init(&r->p);
	if (len > TOAST_PROTO_MAX_LINE)
		return proto_fail(f, TOAST_PROTO_TOO_LARGE, "request longer than %u bytes", TOAST_PROTO_MAX_LINE);
	json_error_t je;
	r->root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	if (!r->root)
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "malformed JSON at byte %d: %s", je.position, je.text);
	if (!json_is_object(r->root))
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "a request is a JSON object");
	json_t *id = json_object_get(r->root, "id");
	if (!json_is_string(id) || json_string_length(id) == 0)
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"id\" must be a non-empty string");
	if (json_string_length(id) > TOAST_PROTO_MAX_ID)
		return proto_fail(f, TOAST_PROTO_TOO_LARGE, "\"id\" is longer than %d bytes", TOAST_PROTO_MAX_ID);
	memcpy(r->id, json_string_value(id), json_string_length(id) + 1);
	json_t *v = json_object_get(r->root, "v");
	if (!v)
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"v\" (the protocol version, %d) is missing",
				  TOAST_PROTO_VERSION);
	if (!json_is_integer(v) || json_integer_value(v) != TOAST_PROTO_VERSION)
		return proto_fail(f, TOAST_PROTO_BAD_VERSION, "this daemon speaks protocol version %d",
				  TOAST_PROTO_VERSION);
	json_t *t = json_object_get(r->root, "type");
	const char *type = t ? json_string_value(t) : "chat";
	if (!type)
		return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"type\" must be a string");
	if (strcmp(type, "chat") == 0) {
		r->type = TOAST_REQ_CHAT;
		return toast_proto_chat_parse(r->root, r, f);
	}
	if (strcmp(type, "status") == 0) {
		r->type = TOAST_REQ_STATUS;
		return true;
	}
	if (strcmp(type, "tokenize") == 0) {
		r->type = TOAST_REQ_TOKENIZE;
		json_t *text = json_object_get(r->root, "text");
		if (!json_is_string(text))
			return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "\"text\" must be a string");
		r->text = json_string_value(text);
		r->text_len = json_string_length(text);
		return true;
	}
	return proto_fail(f, TOAST_PROTO_BAD_REQUEST, "unknown request type (chat, status or tokenize)");
}

static bool proto_str(struct toast_buf *b, const char *s, size_t n)
{
	return toast_buf_append(b, "\"", 1) && toast_buf_json_escape(b, s, n) && toast_buf_append(b, "\"", 1);
}

static bool proto_head(struct toast_buf *b, const char *id)
{
	if (!id || !*id)
		return toast_buf_puts(b, "{\"id\":null");
	return toast_buf_puts(b, "{\"id\":") && proto_str(b, id, strlen(id));
}

bool toast_proto_chat_write(struct toast_buf *b, const char *id, const struct toast_chat_msg *msgs, int n_msgs,
			    const struct toast_proto_params *p)
{
	bool ok = toast_buf_printf(b, "{\"v\":%d,\"type\":\"chat\",\"id\":", TOAST_PROTO_VERSION) &&
		  proto_str(b, id, strlen(id)) && toast_buf_puts(b, ",\"messages\":[");
	for (int i = 0; ok && i < n_msgs; i++)
		ok = toast_buf_puts(b, i ? ",{\"role\":" : "{\"role\":") &&
		     proto_str(b, msgs[i].role, strlen(msgs[i].role)) && toast_buf_puts(b, ",\"content\":") &&
		     proto_str(b, msgs[i].content, strlen(msgs[i].content)) && toast_buf_puts(b, "}");
	ok = ok && toast_buf_puts(b, "]");
	if (ok && p->max_tokens > 0)
		ok = toast_buf_printf(b, ",\"max_tokens\":%d", p->max_tokens);
	if (ok && !isnan(p->temperature))
		ok = toast_buf_printf(b, ",\"temperature\":%.9g", p->temperature);
	if (ok && !isnan(p->top_p))
		ok = toast_buf_printf(b, ",\"top_p\":%.9g", p->top_p);
	if (ok && !isnan(p->min_p))
		ok = toast_buf_printf(b, ",\"min_p\":%.9g", p->min_p);
	if (ok && !isnan(p->repeat_penalty))
		ok = toast_buf_printf(b, ",\"repeat_penalty\":%.9g", p->repeat_penalty);
	if (ok && p->top_k >= 0)
		ok = toast_buf_printf(b, ",\"top_k\":%d", p->top_k);
	if (ok && p->draft >= 0)
		ok = toast_buf_printf(b, ",\"draft\":%d", p->draft);
	if (ok && p->has_seed)
		ok = toast_buf_printf(b, ",\"seed\":%lld", (long long)p->seed);
	if (ok && p->enable_thinking >= 0)
		ok = toast_buf_printf(b, ",\"enable_thinking\":%s", p->enable_thinking ? "true" : "false");
	if (ok && p->n_stop > 0) {
		ok = toast_buf_puts(b, ",\"stop\":[");
		for (int i = 0; ok && i < p->n_stop; i++)
			ok = (!i || toast_buf_puts(b, ",")) && proto_str(b, p->stop[i], strlen(p->stop[i]));
		ok = ok && toast_buf_puts(b, "]");
	}
	return ok && toast_buf_printf(b, ",\"stream\":%s}\n", p->stream ? "true" : "false");
}

bool toast_proto_simple_write(struct toast_buf *b, const char *id, enum toast_proto_type type, const char *text)
{
	bool ok = toast_buf_printf(b, "{\"v\":%d,\"type\":\"%s\",\"id\":", TOAST_PROTO_VERSION,
				   type == TOAST_REQ_TOKENIZE ? "tokenize" : "status") &&
		  proto_str(b, id, strlen(id));
	if (ok && text)
		ok = toast_buf_puts(b, ",\"text\":") && proto_str(b, text, strlen(text));
	return ok && toast_buf_puts(b, "}\n");
}

/* ---- events ---- */

bool toast_proto_delta_write(struct toast_buf *b, const char *id, const char *text, size_t len)
{
	return proto_head(b, id) && toast_buf_puts(b, ",\"delta\":") && proto_str(b, text, len) &&
	       toast_buf_puts(b, "}\n");
}

static double proto_finite(double x)
{
	return isfinite(x) ? x : 0;
}

bool toast_proto_done_write(struct toast_buf *b, const char *id, const struct toast_proto_done *d)
{
	bool ok = proto_head(b, id) &&
		  toast_buf_printf(b,
				   ",\"done\":{\"finish_reason\":\"%s\",\"usage\":{\"prompt_tokens\":%d,"
				   "\"completion_tokens\":%d,\"cached_tokens\":%d",
				   d->finish_reason, d->prompt_tokens, d->completion_tokens, d->cached_tokens) &&
		  (!d->draft_tokens || toast_buf_printf(b, ",\"draft_tokens\":%d,\"draft_accepted\":%d", d->draft_tokens,
							d->draft_accepted)) &&
		  toast_buf_printf(b,
				   "},\"timings\":{\"queue_ms\":%.3f,\"prefill_ms\":%.3f,\"ttft_ms\":%.3f,"
				   "\"decode_ms\":%.3f,\"tokens_per_s\":%.2f}",
				   proto_finite(d->queue_ms), proto_finite(d->prefill_ms), proto_finite(d->ttft_ms),
				   proto_finite(d->decode_ms), proto_finite(d->tokens_per_s));
	if (ok && d->text)
		ok = toast_buf_puts(b, ",\"text\":") && proto_str(b, d->text, d->text_len);
	return ok && toast_buf_puts(b, "}}\n");
}

bool toast_proto_done_raw_write(struct toast_buf *b, const char *id, const char *key, const char *raw_json)
{
	return proto_head(b, id) && toast_buf_printf(b, ",\"done\":{\"%s\":%s}}\n", key, raw_json);
}

bool toast_proto_error_write(struct toast_buf *b, const char *id, enum toast_proto_code code, const char *msg)
{
	return proto_head(b, id) && toast_buf_printf(b, ",\"error\":{\"code\":\"%s\",\"message\":", toast_proto_code_name(code)) &&
	       proto_str(b, msg, strlen(msg)) && toast_buf_puts(b, "}}\n");
}

bool toast_proto_event_parse(const char *line, size_t len, struct toast_proto_event *ev, struct toast_error *err)
{
	memset(ev, 0, sizeof(*ev));
	json_error_t je;
	ev->root = json_loadb(line, len, 0, &je);
	if (!ev->root || !json_is_object(ev->root)) {
		toast_err_set(err, TOAST_ERR_FORMAT, "malformed event from the daemon: %s", ev->root ? "not an object" : je.text);
		return false;
	}
	ev->id = json_string_value(json_object_get(ev->root, "id"));
	json_t *v;
	if ((v = json_object_get(ev->root, "delta")) && json_is_string(v)) {
		ev->kind = TOAST_EV_DELTA;
		ev->text = json_string_value(v);
		ev->text_len = json_string_length(v);
		return true;
	}
	if ((v = json_object_get(ev->root, "done")) && json_is_object(v)) {
		ev->kind = TOAST_EV_DONE;
		ev->done = v;
		json_t *t = json_object_get(v, "text");
		if (json_is_string(t)) {
			ev->text = json_string_value(t);
			ev->text_len = json_string_length(t);
		}
		ev->finish_reason = json_string_value(json_object_get(v, "finish_reason"));
		return true;
	}
	if ((v = json_object_get(ev->root, "error")) && json_is_object(v)) {
		ev->kind = TOAST_EV_ERROR;
		ev->code = json_string_value(json_object_get(v, "code"));
		ev->text = json_string_value(json_object_get(v, "message"));
		if (!ev->code)
			ev->code = "internal";
		if (!ev->text)
			ev->text = "(no message)";
		ev->text_len = strlen(ev->text);
		return true;
	}
	toast_err_set(err, TOAST_ERR_FORMAT, "unknown event from the daemon");
	return false;
}

void toast_proto_event_deinit(struct toast_proto_event *ev)
{
	if (!ev)
		return;
	json_decref(ev->root);
	memset(ev, 0, sizeof(*ev));
}

/* ---- conventions ---- */

bool toast_proto_default_socket(char *buf, size_t n)
{
	const char *env = getenv("TOASTED_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int len;
	if (env && *env)
		len = snprintf(buf, n, "%s", env);
	else if (xdg && xdg[0] == '/')
		len = snprintf(buf, n, "%s/toasted.sock", xdg);
	else
		len = snprintf(buf, n, "/tmp/toasted-%u/toasted.sock", (unsigned)getuid());
	return len > 0 && (size_t)len < n;
}

bool toast_compose_user(struct toast_buf *out, const char *instruction, const char *material, size_t material_len)
{
	size_t pl = instruction ? strlen(instruction) : 0;
	struct toast_buf raw;
	toast_buf_init(&raw);
	bool ok = toast_buf_append(&raw, instruction ? instruction : "", pl) &&
		  (!pl || !material_len || toast_buf_append(&raw, "\n\n", 2)) &&
		  toast_buf_append(&raw, material ? material : "", material_len);
	size_t n = 0;
	char *clean = ok ? toast_utf8_sanitize(raw.data, raw.len, &n) : NULL;
	ok = clean && toast_buf_append(out, clean, n);
	free(clean);
	toast_buf_deinit(&raw);
	return ok;
}
