/*
 * provider.c - chat completions from an OpenAI-compatible endpoint through libcurl.
 *
 * libcurl is loaded with dlopen() on first use, not linked: linking it (and the ~30 libraries
 * it pulls in) costs every toast start about 6 ms of dynamic loading (docs/PERF.md), and toast
 * needs it only when no daemon runs. The SSE stream is parsed line by line ("data: {...}"),
 * bounded by TOAST_PROTO_MAX_EVENT per line.
 */
#define _GNU_SOURCE
#include "client/provider.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static struct {
	void *h;
	CURL *(*easy_init)(void);
	CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
	CURLcode (*easy_perform)(CURL *);
	CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
	void (*easy_cleanup)(CURL *);
	const char *(*easy_strerror)(CURLcode);
	struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
	void (*slist_free_all)(struct curl_slist *);
} curl;

static enum toast_status provider_load_curl(struct toast_error *err)
{
	if (curl.h)
		return TOAST_OK;
	void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libcurl.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "cannot load libcurl (apt-get install libcurl4): %s", dlerror());
	struct {
		void **fn;
		const char *name;
	} syms[] = {
		{(void **)&curl.easy_init, "curl_easy_init"},       {(void **)&curl.easy_setopt, "curl_easy_setopt"},
		{(void **)&curl.easy_perform, "curl_easy_perform"}, {(void **)&curl.easy_getinfo, "curl_easy_getinfo"},
		{(void **)&curl.easy_cleanup, "curl_easy_cleanup"}, {(void **)&curl.easy_strerror, "curl_easy_strerror"},
		{(void **)&curl.slist_append, "curl_slist_append"}, {(void **)&curl.slist_free_all, "curl_slist_free_all"},
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].fn = dlsym(h, syms[i].name);
		if (!*syms[i].fn) {
			dlclose(h);
			return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "libcurl lacks %s", syms[i].name);
		}
	}
	curl.h = h;
	return TOAST_OK;
}

/* The request body: OpenAI's fields only (an endpoint may reject unknown ones), the
 * non-standard top_k and min_p only when asked for. */
static char *provider_body(const struct toast_provider *p, const struct toast_chat_msg *msgs, int n,
			   const struct toast_proto_params *pp)
{
	json_t *o = json_object(), *ms = json_array();
	json_object_set_new(o, "model", json_string(p->model));
	for (int i = 0; i < n; i++)
		json_array_append_new(ms, json_pack("{s:s, s:s}", "role", msgs[i].role, "content", msgs[i].content));
	json_object_set_new(o, "messages", ms);
	json_object_set_new(o, "stream", json_true());
	if (pp->max_tokens > 0)
		json_object_set_new(o, "max_tokens", json_integer(pp->max_tokens));
	if (!isnan(pp->temperature))
		json_object_set_new(o, "temperature", json_real(pp->temperature));
	if (!isnan(pp->top_p))
		json_object_set_new(o, "top_p", json_real(pp->top_p));
	if (!isnan(pp->min_p))
		json_object_set_new(o, "min_p", json_real(pp->min_p));
	if (pp->top_k >= 0)
		json_object_set_new(o, "top_k", json_integer(pp->top_k));
	if (pp->has_seed)
		json_object_set_new(o, "seed", json_integer((json_int_t)pp->seed));
	if (pp->n_stop) {
		json_t *st = json_array();
		for (int i = 0; i < pp->n_stop; i++)
			json_array_append_new(st, json_string(pp->stop[i]));
		json_object_set_new(o, "stop", st);
	}
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

struct provider_rx {
	struct toast_buf in;   /* bytes not yet split into lines */
	size_t scan;
	long http_status;
	CURL *h;
	toast_text_cb cb;
	void *ud;
	bool done, stopped, failed;
	struct toast_error *err;
};

/* One SSE line: "data: {...}" with a delta, "data: [DONE]", or an error object. */
static void provider_line(struct provider_rx *rx, const char *line, size_t len)
{
	if (len < 5 || strncmp(line, "data:", 5) != 0)
		return;
	line += 5;
	len -= 5;
	while (len && *line == ' ')
		line++, len--;
	if (len == 6 && memcmp(line, "[DONE]", 6) == 0) {
		rx->done = true;
		return;
	}
	json_t *o = json_loadb(line, len, 0, NULL);
	json_t *e = json_object_get(o, "error");
	const char *text = json_string_value(
		json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta"), "content"));
	if (e) {
		const char *m = json_string_value(json_object_get(e, "message"));
		toast_err_set(rx->err, TOAST_ERR_IO, "the provider failed: %s", m ? m : "(no message)");
		rx->failed = true;
	} else if (text && *text && rx->cb(rx->ud, text, strlen(text))) {
		rx->stopped = true;
	}
	json_decref(o);
}

static size_t provider_write(char *p, size_t size, size_t n, void *ud)
{
	struct provider_rx *rx = ud;
	size_t bytes = size * n;
	if (!rx->http_status)
		curl.easy_getinfo(rx->h, CURLINFO_RESPONSE_CODE, &rx->http_status);
	if (!toast_buf_append(&rx->in, p, bytes))
		return 0;
	if (rx->http_status != 200)
		return rx->in.len > (1u << 20) ? 0 : bytes; /* an error body: kept for the message */
	for (;;) {
		size_t len = 0;
		int rc = toast_proto_line(&rx->in, &rx->scan, TOAST_PROTO_MAX_EVENT, &len);
		if (rc < 0)
			return 0;
		if (rc == 0)
			break;
		size_t used = rx->scan;
		rx->scan = 0;
		provider_line(rx, rx->in.data, len);
		toast_buf_consume(&rx->in, used);
		if (rx->stopped || rx->failed)
			return 0;
	}
	return bytes;
}

enum toast_status toast_provider_chat(const struct toast_provider *p, const struct toast_chat_msg *msgs, int n_msgs,
				      const struct toast_proto_params *params, toast_text_cb cb, void *ud,
				      struct toast_error *err)
{
	enum toast_status rc = provider_load_curl(err);
	if (rc != TOAST_OK)
		return rc;
	struct provider_rx rx = {.cb = cb, .ud = ud, .err = err};
	toast_buf_init(&rx.in);
	struct toast_buf url, auth;
	toast_buf_init(&url);
	toast_buf_init(&auth);
	size_t bl = strlen(p->base);
	while (bl && p->base[bl - 1] == '/')
		bl--;
	char *body = provider_body(p, msgs, n_msgs, params);
	struct curl_slist *hdr = NULL;
	CURL *h = curl.easy_init();
	rx.h = h;
	if (!body || !h || !toast_buf_printf(&url, "%.*s/chat/completions", (int)bl, p->base) ||
	    !toast_buf_printf(&auth, "Authorization: Bearer %s", p->key ? p->key : "")) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto out;
	}
	hdr = curl.slist_append(hdr, "Content-Type: application/json");
	hdr = curl.slist_append(hdr, "Accept: text/event-stream");
	if (p->key && *p->key)
		hdr = curl.slist_append(hdr, auth.data);
	curl.easy_setopt(h, CURLOPT_URL, url.data);
	curl.easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	curl.easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl.easy_setopt(h, CURLOPT_WRITEFUNCTION, provider_write);
	curl.easy_setopt(h, CURLOPT_WRITEDATA, &rx);
	curl.easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
	curl.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl.easy_setopt(h, CURLOPT_USERAGENT, "toast/" TOAST_VERSION);
	CURLcode cc = curl.easy_perform(h);
	curl.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &rx.http_status);
	if (rx.failed || rx.stopped) {
		rc = rx.failed ? TOAST_ERR_IO : TOAST_ERR_CANCELLED;
	} else if (cc != CURLE_OK) {
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", url.data, curl.easy_strerror(cc));
	} else if (rx.http_status != 200) {
		json_t *o = json_loadb(rx.in.data ? rx.in.data : "", rx.in.len, 0, NULL);
		const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: HTTP %ld: %s", url.data, rx.http_status, m ? m : "(no message)");
		json_decref(o);
	} else if (!rx.done) {
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: the stream ended without [DONE]", url.data);
	}
out:
	if (h)
		curl.easy_cleanup(h);
	curl.slist_free_all(hdr);
	free(body);
	toast_buf_deinit(&rx.in);
	toast_buf_deinit(&url);
	toast_buf_deinit(&auth);
	return rc;
}
