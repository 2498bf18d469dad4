/*
 * http.c - the little HTTP/1.1 the OpenAI-compatible API needs: parse a request head (bounded
 * by SRV_HTTP_MAX_HEAD, Content-Length bodies only) and format replies in OpenAI's shapes
 * (chat.completion, chat.completion.chunk over server-sent events, model list, errors).
 *
 * Every reply closes the connection (`Connection: close`): no keep-alive, no pipelining.
 * No socket I/O here: the loop owns the connections.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/srv.h"

static int http_fail(int *status, const char **why, int code, const char *msg)
{
	*status = code;
	*why = msg;
	return -1;
}

/* "127.x.x.x", "localhost" or "[::1]", each with an optional ":port" */
static bool http_host_loopback(const char *v, size_t n)
{
	const char *colon = n && v[0] != '[' ? memchr(v, ':', n) : NULL;
	if (n && v[0] == '[') {
		const char *close = memchr(v, ']', n);
		colon = close && close + 1 < v + n && close[1] == ':' ? close + 1 : NULL;
		n = close ? (size_t)(close - v) + 1 : n;
	} else if (colon) {
		n = (size_t)(colon - v);
	}
	if (n == 9 && strncasecmp(v, "localhost", 9) == 0)
		return true;
	if (n == 5 && memcmp(v, "[::1]", 5) == 0)
		return true;
	if (n < 7 || n > 15 || memcmp(v, "127.", 4) != 0)
		return false;
	for (size_t i = 4; i < n; i++)
		if (!isdigit((unsigned char)v[i]) && v[i] != '.')
			return false;
	return true;
}

int srv_http_parse_head(const char *buf, size_t len, struct srv_http_head *h, int *status, const char **why)
{
	memset(h, 0, sizeof(*h));
	h->host_ok = true; /* HTTP/1.0 clients may send no Host */
	size_t scan = len < SRV_HTTP_MAX_HEAD ? len : SRV_HTTP_MAX_HEAD;
	const char *end = memmem(buf, scan, "\r\n\r\n", 4);
	if (!end)
		return len >= SRV_HTTP_MAX_HEAD ? http_fail(status, why, 431, "request head too large") : 0;
	h->head_bytes = (size_t)(end - buf) + 4;
	const char *p = buf, *eol = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
	/* request line: METHOD SP TARGET SP HTTP/1.x */
	const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
	const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
	if (!sp1 || !sp2 || sp1 == p || (size_t)(sp1 - p) >= sizeof(h->method) || sp1[1] != '/')
		return http_fail(status, why, 400, "malformed request line");
	if ((size_t)(eol - sp2 - 1) != 8 || strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || (sp2[8] != '0' && sp2[8] != '1'))
		return http_fail(status, why, 505, "HTTP/1.0 or HTTP/1.1 only");
	memcpy(h->method, p, (size_t)(sp1 - p));
	const char *target = sp1 + 1, *q = memchr(target, '?', (size_t)(sp2 - target));
	size_t tlen = (size_t)((q ? q : sp2) - target);
	if (tlen >= sizeof(h->path))
		return http_fail(status, why, 404, "no such path");
	memcpy(h->path, target, tlen);
	/* headers */
	for (p = eol + 2; p < end + 2; p = eol + 2) {
		eol = memmem(p, (size_t)(end + 2 - p), "\r\n", 2);
		const char *colon = memchr(p, ':', (size_t)(eol - p));
		if (!colon || colon == p)
			return http_fail(status, why, 400, "malformed header");
		size_t nlen = (size_t)(colon - p);
		const char *v = colon + 1;
		while (v < eol && (*v == ' ' || *v == '\t'))
			v++;
		size_t vlen = (size_t)(eol - v);
		while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
			vlen--;
		if (nlen == 14 && strncasecmp(p, "content-length", 14) == 0) {
			size_t cl = 0;
			if (vlen == 0 || vlen > 12)
				return http_fail(status, why, vlen > 12 ? 413 : 400, "bad Content-Length");
			for (size_t i = 0; i < vlen; i++) {
				if (!isdigit((unsigned char)v[i]))
					return http_fail(status, why, 400, "bad Content-Length");
				cl = cl * 10 + (size_t)(v[i] - '0');
			}
			if (h->has_length && cl != h->content_length)
				return http_fail(status, why, 400, "conflicting Content-Length");
			h->content_length = cl;
			h->has_length = true;
		} else if (nlen == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
			h->chunked = true;
		} else if (nlen == 6 && strncasecmp(p, "expect", 6) == 0) {
			h->expect_continue = vlen == 12 && strncasecmp(v, "100-continue", 12) == 0;
		} else if (nlen == 12 && strncasecmp(p, "content-type", 12) == 0) {
			h->json = vlen >= 16 && strncasecmp(v, "application/json", 16) == 0 &&
				  (vlen == 16 || v[16] == ';' || v[16] == ' ');
		} else if (nlen == 4 && strncasecmp(p, "host", 4) == 0) {
			h->host_ok = http_host_loopback(v, vlen);
		}
	}
	if (h->chunked)
		return http_fail(status, why, 411, "chunked request bodies are not supported: send Content-Length");
	return 1;
}

int srv_http_status_of(enum toast_proto_code code)
{
	switch (code) {
	case TOAST_PROTO_OK: return 200;
	case TOAST_PROTO_BAD_REQUEST:
	case TOAST_PROTO_BAD_VERSION:
	case TOAST_PROTO_CONTEXT:
	case TOAST_PROTO_UNSUPPORTED: return 400;
	case TOAST_PROTO_TOO_LARGE: return 413;
	case TOAST_PROTO_BUSY:
	case TOAST_PROTO_SHUTDOWN: return 503;
	case TOAST_PROTO_INTERNAL: return 500;
	}
	return 500;
}

static const char *http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 411: return "Length Required";
	case 413: return "Payload Too Large";
	case 415: return "Unsupported Media Type";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return "Internal Server Error";
	}
}

static bool http_str(struct toast_buf *b, const char *s, size_t n)
{
	return toast_buf_puts(b, "\"") && toast_buf_json_escape(b, s, n) && toast_buf_puts(b, "\"");
}

bool srv_http_json(struct toast_buf *out, int status, const char *body, size_t len)
{
	return toast_buf_printf(out,
				"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
				"Connection: close\r\n\r\n",
				status, http_reason(status), len) &&
	       toast_buf_append(out, body, len);
}

static bool http_error_body(struct toast_buf *b, int status, const char *code, const char *msg)
{
	return toast_buf_puts(b, "{\"error\":{\"message\":") && http_str(b, msg, strlen(msg)) &&
	       toast_buf_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}",
				status >= 500 ? "server_error" : "invalid_request_error", code);
}

bool srv_http_error(struct toast_buf *out, int status, enum toast_proto_code code, const char *msg)
{
	struct toast_buf b;
	toast_buf_init(&b);
	const char *name = code == TOAST_PROTO_OK ? (status == 404 ? "not_found" : "bad_request") : toast_proto_code_name(code);
	bool ok = http_error_body(&b, status, name, msg) && srv_http_json(out, status, b.data, b.len);
	toast_buf_deinit(&b);
	return ok;
}

bool srv_http_continue(struct toast_buf *out)
{
	return toast_buf_puts(out, "HTTP/1.1 100 Continue\r\n\r\n");
}

bool srv_http_models(struct toast_buf *out, const char *model, long created)
{
	struct toast_buf b;
	toast_buf_init(&b);
	bool ok = toast_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":") && http_str(&b, model, strlen(model)) &&
		  toast_buf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"toasted\"}]}", created) &&
		  srv_http_json(out, 200, b.data, b.len);
	toast_buf_deinit(&b);
	return ok;
}

static bool http_chunk_head(struct toast_buf *out, const char *id, const char *model, long created)
{
	return toast_buf_puts(out, "data: {\"id\":") && http_str(out, id, strlen(id)) &&
	       toast_buf_printf(out, ",\"object\":\"chat.completion.chunk\",\"created\":%ld,\"model\":", created) &&
	       http_str(out, model, strlen(model)) && toast_buf_puts(out, ",\"choices\":[{\"index\":0,");
}

bool srv_http_sse_start(struct toast_buf *out, const char *id, const char *model, long created)
{
	return toast_buf_puts(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
				   "Connection: close\r\n\r\n") &&
	       http_chunk_head(out, id, model, created) &&
	       toast_buf_puts(out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n");
}

bool srv_http_sse_delta(struct toast_buf *out, const char *id, const char *model, long created, const char *text,
			size_t len)
{
	return http_chunk_head(out, id, model, created) && toast_buf_puts(out, "\"delta\":{\"content\":") &&
	       http_str(out, text, len) && toast_buf_puts(out, "},\"finish_reason\":null}]}\n\n");
}

const char *srv_http_finish(const char *ours)
{
	return strcmp(ours, "context") == 0 ? "length" : ours;
}

static bool http_usage(struct toast_buf *out, const struct toast_proto_done *d)
{
	return toast_buf_printf(out,
				"\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
				"\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
				d->prompt_tokens, d->completion_tokens, d->prompt_tokens + d->completion_tokens,
				d->cached_tokens);
}

bool srv_http_sse_end(struct toast_buf *out, const char *id, const char *model, long created,
		      const struct toast_proto_done *d)
{
	return http_chunk_head(out, id, model, created) &&
	       toast_buf_printf(out, "\"delta\":{},\"finish_reason\":\"%s\"}],", srv_http_finish(d->finish_reason)) &&
	       http_usage(out, d) && toast_buf_puts(out, "}\n\ndata: [DONE]\n\n");
}

bool srv_http_sse_error(struct toast_buf *out, enum toast_proto_code code, const char *msg)
{
	return toast_buf_puts(out, "data: ") &&
	       http_error_body(out, srv_http_status_of(code), toast_proto_code_name(code), msg) &&
	       toast_buf_puts(out, "\n\n");
}

bool srv_http_completion(struct toast_buf *out, const char *id, const char *model, long created, const char *text,
			 size_t len, const struct toast_proto_done *d)
{
	struct toast_buf b;
	toast_buf_init(&b);
	bool ok = toast_buf_puts(&b, "{\"id\":") && http_str(&b, id, strlen(id)) &&
		  toast_buf_printf(&b, ",\"object\":\"chat.completion\",\"created\":%ld,\"model\":", created) &&
		  http_str(&b, model, strlen(model)) &&
		  toast_buf_puts(&b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":") &&
		  http_str(&b, text, len) &&
		  toast_buf_printf(&b, "},\"finish_reason\":\"%s\"}],", srv_http_finish(d->finish_reason)) &&
		  http_usage(&b, d) && toast_buf_puts(&b, "}") && srv_http_json(out, 200, b.data, b.len);
	toast_buf_deinit(&b);
	return ok;
}
