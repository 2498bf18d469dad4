/*
 * test_proto.c - the wire protocol without a daemon: line framing and its limits, request
 * parsing (every kind of bad input gets the right error code), request/event round trips, the
 * compose rule, HTTP head parsing, the history file, and the daemon's lock and stale-socket rules;
 * JSON strings written from bytes that are not UTF-8 (an error that quotes a bad request) are
 * still valid JSON.
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/history.h"
#include "proto/proto.h"
#include "server/server.h"
#include "server/srv.h"
#include "test.h"
#include "util/utf8.h"

static void test_lines(void)
{
	struct toast_buf b;
	toast_buf_init(&b);
	size_t scan = 0, len = 99;
	toast_buf_puts(&b, "abc");
	CHECK(toast_proto_line(&b, &scan, 16, &len) == 0 && scan == 3, "partial line: scan %zu", scan);
	toast_buf_puts(&b, "d\r\nef\n");
	CHECK(toast_proto_line(&b, &scan, 16, &len) == 1 && len == 4 && scan == 6, "crlf line: len %zu scan %zu", len, scan);
	toast_buf_consume(&b, scan);
	scan = 0;
	CHECK(toast_proto_line(&b, &scan, 16, &len) == 1 && len == 2 && scan == 3, "second line");
	toast_buf_consume(&b, scan);
	scan = 0;
	for (int i = 0; i < 20; i++)
		toast_buf_puts(&b, "x");
	CHECK(toast_proto_line(&b, &scan, 16, &len) == -1, "20 bytes without a newline, limit 16");
	toast_buf_puts(&b, "\n");
	scan = 0;
	CHECK(toast_proto_line(&b, &scan, 16, &len) == -1, "a complete line longer than the limit");
	toast_buf_deinit(&b);
}

/* parse line; expect code (OK: success) */
static void expect(const char *line, enum toast_proto_code code, const char *what)
{
	struct toast_proto_req r;
	struct toast_proto_fail f = {0};
	bool ok = toast_proto_req_parse(line, strlen(line), &r, &f);
	CHECK(ok == (code == TOAST_PROTO_OK) && (ok || f.code == code), "%s: got %s (%s), want %s", what,
	      ok ? "ok" : toast_proto_code_name(f.code), f.msg, toast_proto_code_name(code));
	toast_proto_req_deinit(&r);
}

static void test_requests(void)
{
	struct toast_proto_req r;
	struct toast_proto_fail f = {0};
	const char *full = "{\"v\":1,\"id\":\"r1\",\"type\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
			   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
			   "\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":3,\"min_p\":0.1,\"seed\":42,\"stop\":\"\\n\","
			   "\"draft\":4,"
			   "\"stream\":false,\"unknown_field\":{\"x\":[1,2]},\"enable_thinking\":false}";
	CHECK(toast_proto_req_parse(full, strlen(full), &r, &f), "full request: %s", f.msg);
	CHECK(r.type == TOAST_REQ_CHAT && strcmp(r.id, "r1") == 0 && r.n_msgs == 2, "full request fields");
	CHECK(r.n_msgs == 2 && strcmp(r.msgs[1].content, "ab") == 0, "content parts are joined");
	CHECK(r.p.max_tokens == 7 && r.p.temperature == 0 && r.p.top_p == 0.5 && r.p.top_k == 3 && fabs(r.p.min_p - 0.1) < 1e-12 &&
		      r.p.draft == 4,
	      "sampling fields");
	CHECK(r.p.has_seed && r.p.seed == 42 && r.p.n_stop == 1 && strcmp(r.p.stop[0], "\n") == 0 && !r.p.stream &&
		      r.p.enable_thinking == 0,
	      "seed, stop, stream, enable_thinking");
	toast_proto_req_deinit(&r);
	const char *min = "{\"v\":1,\"id\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
	CHECK(toast_proto_req_parse(min, strlen(min), &r, &f), "minimal request: %s", f.msg);
	CHECK(r.p.stream && isnan(r.p.temperature) && r.p.top_k == -1 && r.p.draft == -1 && !r.p.has_seed && r.p.max_tokens == 0 &&
		      r.p.enable_thinking == -1,
	      "defaults: stream, everything else unset");
	toast_proto_req_deinit(&r);

	expect("{\"v\":1,\"id\":\"s\",\"type\":\"status\"}", TOAST_PROTO_OK, "status");
	expect("{\"v\":1,\"id\":\"t\",\"type\":\"tokenize\",\"text\":\"x\"}", TOAST_PROTO_OK, "tokenize");
	expect("{\"v\":1,\"id\":\"t\",\"type\":\"tokenize\"}", TOAST_PROTO_BAD_REQUEST, "tokenize without text");
	expect("{\"v\":1,\"id\":\"t\",\"type\":\"dance\"}", TOAST_PROTO_BAD_REQUEST, "unknown type");
	expect("{\"v\":1,\"id\":\"t\",\"type\":7}", TOAST_PROTO_BAD_REQUEST, "type not a string");
	expect("not json", TOAST_PROTO_BAD_REQUEST, "malformed JSON");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[}", TOAST_PROTO_BAD_REQUEST, "truncated JSON");
	expect("[1,2]", TOAST_PROTO_BAD_REQUEST, "not an object");
	expect("{\"id\":\"a\",\"type\":\"status\"}", TOAST_PROTO_BAD_REQUEST, "missing v");
	expect("{\"v\":2,\"id\":\"a\",\"type\":\"status\"}", TOAST_PROTO_BAD_VERSION, "v 2");
	expect("{\"v\":\"1\",\"id\":\"a\",\"type\":\"status\"}", TOAST_PROTO_BAD_VERSION, "v a string");
	expect("{\"v\":1,\"type\":\"status\"}", TOAST_PROTO_BAD_REQUEST, "missing id");
	expect("{\"v\":1,\"id\":5,\"type\":\"status\"}", TOAST_PROTO_BAD_REQUEST, "id a number");
	char longid[400];
	snprintf(longid, sizeof(longid), "{\"v\":1,\"id\":\"%0200d\",\"type\":\"status\"}", 0);
	expect(longid, TOAST_PROTO_TOO_LARGE, "id of 200 bytes");
	expect("{\"v\":1,\"id\":\"a\",\"id\":\"b\",\"type\":\"status\"}", TOAST_PROTO_BAD_REQUEST, "duplicate key");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[]}", TOAST_PROTO_BAD_REQUEST, "no messages");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":\"hi\"}", TOAST_PROTO_BAD_REQUEST, "messages a string");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", TOAST_PROTO_BAD_REQUEST,
	       "unknown role");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"content\":\"x\"}]}", TOAST_PROTO_BAD_REQUEST, "missing role");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", TOAST_PROTO_BAD_REQUEST,
	       "content a number");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
	       TOAST_PROTO_UNSUPPORTED, "image part");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"5\"}",
	       TOAST_PROTO_BAD_REQUEST, "max_tokens a string");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
	       TOAST_PROTO_BAD_REQUEST, "max_tokens not an integer");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}",
	       TOAST_PROTO_BAD_REQUEST, "max_tokens 0");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":99999999999}",
	       TOAST_PROTO_TOO_LARGE, "max_tokens huge");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"draft\":8}",
	       TOAST_PROTO_TOO_LARGE, "draft over 7");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"draft\":-1}",
	       TOAST_PROTO_BAD_REQUEST, "draft negative");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}",
	       TOAST_PROTO_BAD_REQUEST, "negative temperature");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":2}",
	       TOAST_PROTO_BAD_REQUEST, "top_p 2");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}",
	       TOAST_PROTO_BAD_REQUEST, "stream a string");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}",
	       TOAST_PROTO_BAD_REQUEST, "empty stop string");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}",
	       TOAST_PROTO_BAD_REQUEST, "stop a number");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
	       "\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
	       TOAST_PROTO_TOO_LARGE, "17 stop strings");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", TOAST_PROTO_BAD_REQUEST,
	       "NUL in content");
	expect("{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", TOAST_PROTO_BAD_REQUEST,
	       "lone surrogate");
	const char bad_utf8[] = "{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
	expect(bad_utf8, TOAST_PROTO_BAD_REQUEST, "invalid UTF-8");
	const char overlong[] = "{\"v\":1,\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}";
	expect(overlong, TOAST_PROTO_BAD_REQUEST, "overlong UTF-8");
	/* deep nesting is refused, not a stack overflow */
	struct toast_buf deep;
	toast_buf_init(&deep);
	toast_buf_puts(&deep, "{\"v\":1,\"id\":\"a\",\"x\":");
	for (int i = 0; i < 100000; i++)
		toast_buf_puts(&deep, "[");
	expect(deep.data, TOAST_PROTO_BAD_REQUEST, "100000 nested arrays");
	toast_buf_deinit(&deep);
	/* too many messages */
	struct toast_buf many;
	toast_buf_init(&many);
	toast_buf_puts(&many, "{\"v\":1,\"id\":\"a\",\"messages\":[");
	for (int i = 0; i <= TOAST_PROTO_MAX_MESSAGES; i++)
		toast_buf_puts(&many, i ? ",{\"role\":\"user\",\"content\":\"x\"}" : "{\"role\":\"user\",\"content\":\"x\"}");
	toast_buf_puts(&many, "]}");
	expect(many.data, TOAST_PROTO_TOO_LARGE, "4097 messages");
	toast_buf_deinit(&many);
}

static void test_roundtrip(void)
{
	struct toast_chat_msg msgs[] = {{"system", "tab\there \"quoted\" \\ back"}, {"user", "ünï 😀 \x01 ctrl\nline"}};
	struct toast_proto_params p;
	toast_proto_params_init(&p);
	p.temperature = 0.7;
	p.top_k = 5;
	p.draft = 3;
	p.max_tokens = 9;
	p.seed = 123456789012345ULL;
	p.has_seed = true;
	p.stop[p.n_stop++] = "</s>";
	p.stream = false;
	struct toast_buf b;
	toast_buf_init(&b);
	CHECK(toast_proto_chat_write(&b, "id\"1", msgs, 2, &p), "chat_write");
	CHECK(b.len && b.data[b.len - 1] == '\n' && !memchr(b.data, '\n', b.len - 1), "one line");
	struct toast_proto_req r;
	struct toast_proto_fail f = {0};
	CHECK(toast_proto_req_parse(b.data, b.len - 1, &r, &f), "written request parses: %s", f.msg);
	CHECK(strcmp(r.id, "id\"1") == 0 && r.n_msgs == 2 && strcmp(r.msgs[0].content, msgs[0].content) == 0 &&
		      strcmp(r.msgs[1].content, msgs[1].content) == 0,
	      "messages survive the round trip");
	CHECK(fabs(r.p.temperature - 0.7) < 1e-6 && r.p.top_k == 5 && r.p.draft == 3 && r.p.max_tokens == 9 && r.p.seed == p.seed &&
		      !r.p.stream && r.p.n_stop == 1 && isnan(r.p.top_p),
	      "params survive the round trip");
	toast_proto_req_deinit(&r);

	toast_buf_consume(&b, b.len);
	struct toast_proto_done d = {.finish_reason = "length", .prompt_tokens = 3, .completion_tokens = 4,
				     .draft_tokens = 6, .draft_accepted = 2, .ttft_ms = NAN, .text = "whole", .text_len = 5};
	CHECK(toast_proto_delta_write(&b, "x", "é\n\"", strlen("é\n\"")) && toast_proto_done_write(&b, "x", &d) &&
		      toast_proto_error_write(&b, NULL, TOAST_PROTO_BUSY, "full") &&
		      toast_proto_done_raw_write(&b, "t", "tokens", "[1,2]"),
	      "event writes");
	const char *kinds[] = {"delta", "done", "error", "done"};
	enum toast_proto_event_kind want[] = {TOAST_EV_DELTA, TOAST_EV_DONE, TOAST_EV_ERROR, TOAST_EV_DONE};
	size_t scan = 0, len = 0;
	for (int i = 0; i < 4; i++) {
		struct toast_proto_event ev;
		struct toast_error err = {0};
		CHECK(toast_proto_line(&b, &scan, 1 << 20, &len) == 1, "event %d is a line", i);
		CHECK(toast_proto_event_parse(b.data, len, &ev, &err) && ev.kind == want[i], "event %s parses: %s", kinds[i],
		      err.msg);
		if (i == 0)
			CHECK(ev.text_len == strlen("é\n\"") && memcmp(ev.text, "é\n\"", ev.text_len) == 0, "delta text");
		json_t *usage = i == 1 ? json_object_get(ev.done, "usage") : NULL;
		if (i == 1)
			CHECK(strcmp(ev.finish_reason, "length") == 0 && ev.text && strcmp(ev.text, "whole") == 0 &&
				      json_integer_value(json_object_get(usage, "completion_tokens")) == 4 &&
				      json_integer_value(json_object_get(usage, "draft_tokens")) == 6 &&
				      json_integer_value(json_object_get(usage, "draft_accepted")) == 2,
			      "done fields (NaN timings are written as 0)");
		if (i == 2)
			CHECK(strcmp(ev.code, "busy") == 0 && strcmp(ev.text, "full") == 0 && !ev.id, "error fields");
		toast_proto_event_deinit(&ev);
		toast_buf_consume(&b, scan);
		scan = 0;
	}
	struct toast_proto_event ev;
	CHECK(!toast_proto_event_parse("{\"id\":\"a\"}", 10, &ev, NULL), "an event without delta/done/error is refused");
	toast_proto_event_deinit(&ev);
	toast_buf_deinit(&b);
}

/* toast_buf_json_escape: valid UTF-8 as it is, controls escaped, any other byte U+FFFD */
static void test_escape(void)
{
	static const struct {
		const char *in, *want; /* want: the decoded string */
	} cases[] = {
		{"plain \"q\" \\ \n\t", "plain \"q\" \\ \n\t"},
		{"\x01\x1f", "\x01\x1f"},
		{"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}, /* é € 😀 */
		{"a\xd8'", "a\xef\xbf\xbd'"},                                             /* a lone lead byte */
		{"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"},
		{"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                               /* overlong */
		{"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},            /* a surrogate */
		{"\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd"},                               /* cut short */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct toast_buf b;
		toast_buf_init(&b);
		bool ok = toast_buf_puts(&b, "\"") && toast_buf_json_escape(&b, cases[i].in, strlen(cases[i].in)) &&
			  toast_buf_puts(&b, "\"");
		json_error_t je;
		json_t *j = ok ? json_loadb(b.data, b.len, JSON_DECODE_ANY, &je) : NULL;
		CHECK(ok && toast_utf8_valid(b.data, b.len) && j && json_is_string(j) &&
			      strcmp(json_string_value(j), cases[i].want) == 0,
		      "escape case %zu: %.*s", i, (int)b.len, b.data ? b.data : "");
		json_decref(j);
		toast_buf_deinit(&b);
	}
	/* a malformed request whose error quotes its bytes (a fuzzed line, fuzz_proto seed 878360) */
	static const char line[] = "{\"v\\\xd8\x9f 1,\x1e\"i\xb0";
	struct toast_proto_req r;
	struct toast_proto_fail f = {0};
	CHECK(!toast_proto_req_parse(line, sizeof(line) - 1, &r, &f) && f.code == TOAST_PROTO_BAD_REQUEST,
	      "the fuzzed line is a bad request");
	toast_proto_req_deinit(&r);
	struct toast_buf b;
	toast_buf_init(&b);
	struct toast_proto_event ev = {0};
	struct toast_error err = {0};
	CHECK(toast_proto_error_write(&b, NULL, f.code, f.msg) && toast_utf8_valid(b.data, b.len) &&
		      toast_proto_event_parse(b.data, b.len - 1, &ev, &err) && ev.kind == TOAST_EV_ERROR,
	      "its error line is JSON: %.*s %s", (int)b.len, b.data ? b.data : "", err.msg);
	toast_proto_event_deinit(&ev);
	toast_buf_deinit(&b);
}

static void test_compose(void)
{
	struct toast_buf b;
	const struct {
		const char *ins, *mat, *want;
	} cases[] = {{"why?", "log line\n", "why?\n\nlog line\n"}, {"why?", NULL, "why?"}, {NULL, "only\n", "only\n"},
		     {"", "", ""}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		toast_buf_init(&b);
		CHECK(toast_compose_user(&b, cases[i].ins, cases[i].mat, cases[i].mat ? strlen(cases[i].mat) : 0) && b.data &&
			      strcmp(b.data, cases[i].want) == 0,
		      "compose case %zu: \"%s\"", i, b.data ? b.data : "(null)");
		toast_buf_deinit(&b);
	}
}

static int head(const char *s, struct srv_http_head *h)
{
	int status = 0;
	const char *why = "";
	int rc = srv_http_parse_head(s, strlen(s), h, &status, &why);
	return rc < 0 ? -status : rc;
}

static void test_http(void)
{
	struct srv_http_head h;
	CHECK(head("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json; "
		   "charset=utf-8\r\ncontent-length: 12\r\nExpect: 100-continue\r\n\r\n{...",
		   &h) == 1,
	      "a POST head");
	CHECK(strcmp(h.method, "POST") == 0 && strcmp(h.path, "/v1/chat/completions") == 0 && h.content_length == 12 &&
		      h.has_length && h.json && h.host_ok && h.expect_continue,
	      "POST head fields");
	CHECK(h.head_bytes == strlen("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: "
				     "application/json; charset=utf-8\r\ncontent-length: 12\r\nExpect: 100-continue\r\n\r\n"),
	      "head_bytes");
	CHECK(head("GET /v1/models HTTP/1.1\r\nHost: localhost\r\n", &h) == 0, "an incomplete head needs more");
	CHECK(head("GET /v1/models HTTP/1.1\r\nHost: evil.example:8080\r\n\r\n", &h) == 1 && !h.host_ok,
	      "a foreign Host is flagged (DNS rebinding)");
	CHECK(head("GET /v1/models HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", &h) == 1 && h.host_ok, "[::1] is loopback");
	CHECK(head("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1.evil.com\r\n\r\n", &h) == 1 && !h.host_ok,
	      "127.0.0.1.evil.com is not loopback");
	CHECK(head("POST / HTTP/1.1\r\nContent-Type: text/plain\r\n\r\n", &h) == 1 && !h.json, "text/plain is not JSON");
	CHECK(head("GET /v1/models HTTP/2.0\r\n\r\n", &h) == -505, "HTTP/2.0 refused");
	CHECK(head("GARBAGE\r\n\r\n", &h) == -400, "a malformed request line");
	CHECK(head("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &h) == -411, "chunked bodies refused");
	CHECK(head("POST / HTTP/1.1\r\nContent-Length: 12a\r\n\r\n", &h) == -400, "a bad Content-Length");
	CHECK(head("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &h) == -400,
	      "conflicting Content-Length");
	CHECK(head("POST / HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n", &h) == -413, "a huge Content-Length");
	CHECK(head("POST / HTTP/1.1\r\nNoColonHere\r\n\r\n", &h) == -400, "a header without a colon");
	struct toast_buf big;
	toast_buf_init(&big);
	toast_buf_puts(&big, "GET / HTTP/1.1\r\n");
	while (big.len < SRV_HTTP_MAX_HEAD + 10)
		toast_buf_puts(&big, "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
	CHECK(head(big.data, &h) == -431, "a head over the limit");
	toast_buf_deinit(&big);
}

static void test_history(const char *dir)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/state/toast/conversation.jsonl", dir);
	struct toast_history h = {0}, g = {0};
	CHECK(toast_history_load(&h, path, NULL) == TOAST_OK && h.n == 0, "a missing history is empty");
	toast_history_add(&h, "user", "q1 \"x\"\n", 7);
	toast_history_add(&h, "assistant", "a1", 2);
	CHECK(toast_history_set_system(&h, "sys") && h.n == 3 && strcmp(h.msgs[0].role, "system") == 0 &&
		      strcmp(h.msgs[1].content, "q1 \"x\"\n") == 0,
	      "set_system puts the system message first");
	CHECK(toast_history_set_system(&h, "sys2") && h.n == 3 && strcmp(h.msgs[0].content, "sys2") == 0,
	      "set_system replaces it");
	toast_history_add(&h, "user", "unanswered", 10);
	toast_history_pop(&h);
	CHECK(h.n == 3, "pop drops the last message");
	struct toast_error err = {0};
	CHECK(toast_history_save(&h, path, &err) == TOAST_OK, "save: %s", err.msg);
	struct stat st;
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "the history file is 0600");
	CHECK(toast_history_load(&g, path, &err) == TOAST_OK && g.n == 3, "load: %s", err.msg);
	for (int i = 0; i < 3 && g.n == 3; i++)
		CHECK(strcmp(g.msgs[i].role, h.msgs[i].role) == 0 && strcmp(g.msgs[i].content, h.msgs[i].content) == 0,
		      "message %d survives", i);
	toast_history_free(&g);
	FILE *f = fopen(path, "a");
	fputs("{\"role\":\"user\"}\n", f);
	fclose(f);
	CHECK(toast_history_load(&g, path, &err) == TOAST_ERR_FORMAT, "a damaged history is an error");
	toast_history_free(&g);
	toast_history_free(&h);
}

static void test_daemon_files(const char *dir)
{
	char sock[256];
	snprintf(sock, sizeof(sock), "%s/run/d.sock", dir);
	struct toast_error err = {0};
	CHECK(toast_daemon_prepare_dir(sock, &err) == TOAST_OK, "prepare_dir: %s", err.msg);
	int fd1 = -1, fd2 = -1;
	CHECK(toast_daemon_lock(sock, &fd1, &err) == TOAST_OK, "lock: %s", err.msg);
	toast_daemon_write_pid(fd1, 4242);
	CHECK(toast_daemon_lock(sock, &fd2, &err) == TOAST_ERR_BUSY && strstr(err.msg, "4242"),
	      "a second lock is refused and names the holder: %s", err.msg);
	CHECK(toast_daemon_running(sock) == 4242, "running() reads the holder's pid");
	toast_daemon_write_pid(fd1, 0); /* a daemon stopping (or starting): the lock held, no pid */
	CHECK(toast_daemon_running(sock) == -1, "a holder without its pid still runs (stop waited on it)");
	CHECK(toast_daemon_lock(sock, &fd2, &err) == TOAST_ERR_BUSY && strstr(err.msg, "starting or stopping"),
	      "a second lock is refused while the holder has no pid: %s", err.msg);
	close(fd1);
	CHECK(toast_daemon_running(sock) == 0, "no holder, nothing running");
	CHECK(toast_daemon_lock(sock, &fd2, &err) == TOAST_OK, "the lock is free again once its holder closes it");
	close(fd2);

	/* a stale socket (bound, nobody listening) is replaced; a live one and a plain file are not */
	int lfd = -1;
	CHECK(toast_daemon_clear_stale(sock, &err) == TOAST_OK, "no socket: nothing to clear");
	CHECK(toast_daemon_listen_unix(sock, &lfd, &err) == TOAST_OK, "listen: %s", err.msg);
	struct stat st;
	CHECK(stat(sock, &st) == 0 && (st.st_mode & 0777) == 0600, "the socket is 0600");
	CHECK(toast_daemon_clear_stale(sock, &err) == TOAST_ERR_BUSY && access(sock, F_OK) == 0,
	      "a live socket is never replaced");
	close(lfd);
	CHECK(access(sock, F_OK) == 0, "closing leaves the socket file behind (stale)");
	CHECK(toast_daemon_clear_stale(sock, &err) == TOAST_OK && access(sock, F_OK) != 0, "a stale socket is removed: %s",
	      err.msg);
	int f = open(sock, O_CREAT | O_WRONLY, 0600);
	close(f);
	CHECK(toast_daemon_clear_stale(sock, &err) != TOAST_OK && access(sock, F_OK) == 0,
	      "a regular file at the socket path is left alone");
	unlink(sock);
	char bound[64];
	CHECK(toast_daemon_listen_tcp("0.0.0.0:0", &lfd, bound, sizeof(bound), &err) == TOAST_ERR_INVALID,
	      "0.0.0.0 is refused (loopback only)");
	CHECK(toast_daemon_listen_tcp("10.1.2.3:80", &lfd, bound, sizeof(bound), &err) == TOAST_ERR_INVALID,
	      "10.1.2.3 is refused");
	CHECK(toast_daemon_listen_tcp("127.0.0.1", &lfd, bound, sizeof(bound), &err) == TOAST_ERR_INVALID, "no port");
	CHECK(toast_daemon_listen_tcp("127.0.0.1:0", &lfd, bound, sizeof(bound), &err) == TOAST_OK &&
		      strncmp(bound, "127.0.0.1:", 10) == 0 && atoi(bound + 10) > 0,
	      "port 0 binds a free port: %s", bound);
	close(lfd);
	char def[64];
	snprintf(def, sizeof(def), "/tmp/toasted-%u/x.sock", (unsigned)getuid());
	char defdir[64];
	snprintf(defdir, sizeof(defdir), "/tmp/toasted-%u", (unsigned)getuid());
	struct stat ds;
	if (stat(defdir, &ds) != 0 || (ds.st_mode & 077) == 0) {
		CHECK(toast_daemon_prepare_dir(def, &err) == TOAST_OK && stat(defdir, &ds) == 0 && (ds.st_mode & 0777) == 0700,
		      "the default directory is created 0700");
	}
}

int main(void)
{
	char dir[] = "/tmp/toast-test-proto-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	test_lines();
	test_requests();
	test_roundtrip();
	test_escape();
	test_compose();
	test_http();
	test_history(dir);
	test_daemon_files(dir);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return test_done("test_proto");
}
