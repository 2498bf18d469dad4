/*
 * proto.h - the toasted wire protocol (docs/protocol.md is the contract), shared by the daemon
 * and the toast client: line framing, request parsing and writing, event writing and parsing,
 * error codes, limits, the default socket path, and how toast composes a user message.
 *
 * This module links only util and jansson, never the engine (it uses toasted.h for plain
 * struct definitions: toast_chat_msg). Every size taken from outside is bounded here.
 */
#ifndef TOAST_PROTO_PROTO_H
#define TOAST_PROTO_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toasted.h"
#include "util/buf.h"

#define TOAST_PROTO_VERSION 1
#define TOAST_PROTO_MAX_LINE (8u << 20) /* bytes of one request line (and of an HTTP body) */
#define TOAST_PROTO_MAX_EVENT (64u << 20) /* bytes of one event line a client accepts */
#define TOAST_PROTO_MAX_ID 128            /* bytes of a request id */
#define TOAST_PROTO_MAX_MESSAGES 4096
#define TOAST_PROTO_MAX_STOP 16           /* stop strings */
#define TOAST_PROTO_MAX_STOP_BYTES 256    /* bytes of one stop string */
#define TOAST_PROTO_MAX_TOKENS (1 << 24)  /* max_tokens; the daemon also checks its context */

enum toast_proto_code {
	TOAST_PROTO_OK = 0,
	TOAST_PROTO_BAD_REQUEST, /* "bad_request": malformed JSON, a wrong type, a missing or unknown value */
	TOAST_PROTO_BAD_VERSION, /* "bad_version": a protocol version this daemon does not speak */
	TOAST_PROTO_TOO_LARGE,   /* "too_large": a line, a count or a string beyond the limits */
	TOAST_PROTO_CONTEXT,     /* "context_length": the prompt (+ max_tokens) does not fit the context */
	TOAST_PROTO_BUSY,        /* "busy": the queue or the connection table is full */
	TOAST_PROTO_SHUTDOWN,    /* "shutdown": the daemon is stopping */
	TOAST_PROTO_UNSUPPORTED, /* "unsupported": valid, but this model/daemon cannot do it */
	TOAST_PROTO_INTERNAL,    /* "internal": the engine failed (backend error, out of memory) */
};
const char *toast_proto_code_name(enum toast_proto_code c);
enum toast_proto_code toast_proto_code_from_status(enum toast_status st);

struct toast_proto_fail {
	enum toast_proto_code code;
	char msg[256];
};

/* ---- framing ---------------------------------------------------------------------------- */

/*
 * Look for a complete line in b from *scan on (the bytes before *scan are known to hold no
 * newline). Returns 1 when one is complete: *line_len is its length without "\n" or "\r\n",
 * and *scan the bytes it takes with its newline (consume them, then set *scan to 0).
 * Returns 0 when more bytes are needed (*scan advanced), -1 when a line is longer than max.
 */
int toast_proto_line(const struct toast_buf *b, size_t *scan, size_t max, size_t *line_len);

/* ---- requests --------------------------------------------------------------------------- */

enum toast_proto_type { TOAST_REQ_CHAT, TOAST_REQ_STATUS, TOAST_REQ_TOKENIZE };

/* Sampling and generation parameters; unset ones keep the daemon's (= toasted run's) defaults. */
struct toast_proto_params {
	int max_tokens;                       /* 0: unset (until the context is full) */
	double temperature, top_p, min_p;     /* NAN: unset */
	double repeat_penalty;                /* NAN: unset */
	int top_k;                            /* -1: unset */
	int draft;                            /* speculative drafts (toast_gen_opts.draft); -1: unset */
	bool has_seed;
	uint64_t seed;
	const char *stop[TOAST_PROTO_MAX_STOP];
	int n_stop;
	bool stream;                          /* default true */
	int enable_thinking;                  /* -1: unset (the template's default), 0, 1 */
};
void toast_proto_params_init(struct toast_proto_params *p);

struct toast_proto_req {
	enum toast_proto_type type;
	char id[TOAST_PROTO_MAX_ID + 1];
	struct toast_chat_msg *msgs; /* chat: [n_msgs], strings owned by root */
	int n_msgs;
	size_t content_bytes;        /* chat: bytes of all message contents */
	struct toast_proto_params p;
	const char *text;            /* tokenize: the text (owned by root) */
	size_t text_len;
	json_t *root;
};
void toast_proto_req_deinit(struct toast_proto_req *r);

/*
 * Parse one request line. On failure, fail names the problem, and r->id holds the request id
 * when it could be read (else ""), so the error can be addressed. r is deinit'ed by the caller
 * in both cases.
 */
bool toast_proto_req_parse(const char *line, size_t len, struct toast_proto_req *r, struct toast_proto_fail *fail);
/* The chat fields of an object (the protocol's chat request or an OpenAI chat completion body:
 * messages, max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop,
 * stream). Unknown fields are ignored. r->root must own obj. */
bool toast_proto_chat_parse(json_t *obj, struct toast_proto_req *r, struct toast_proto_fail *fail);

/* Append one chat request line (with its "\n"). */
bool toast_proto_chat_write(struct toast_buf *out, const char *id, const struct toast_chat_msg *msgs, int n_msgs,
			    const struct toast_proto_params *p);
/* Append a status or tokenize request line (text is NULL for status). */
bool toast_proto_simple_write(struct toast_buf *out, const char *id, enum toast_proto_type type, const char *text);

/* ---- events ----------------------------------------------------------------------------- */

struct toast_proto_done {
	const char *finish_reason;   /* "stop", "length", "context" */
	int prompt_tokens, cached_tokens, completion_tokens;
	int draft_tokens, draft_accepted; /* speculative drafts verified, taken (written when drafted) */
	double queue_ms, prefill_ms, ttft_ms, decode_ms, tokens_per_s;
	const char *text;            /* the whole answer when the request did not stream, else NULL */
	size_t text_len;
};

bool toast_proto_delta_write(struct toast_buf *out, const char *id, const char *text, size_t len);
bool toast_proto_done_write(struct toast_buf *out, const char *id, const struct toast_proto_done *d);
/* a done event whose payload is `key: raw_json` (status, tokens) */
bool toast_proto_done_raw_write(struct toast_buf *out, const char *id, const char *key, const char *raw_json);
bool toast_proto_error_write(struct toast_buf *out, const char *id, enum toast_proto_code code, const char *msg);

enum toast_proto_event_kind { TOAST_EV_DELTA, TOAST_EV_DONE, TOAST_EV_ERROR };
struct toast_proto_event {
	enum toast_proto_event_kind kind;
	const char *id;
	const char *text;       /* delta: the text; done: "text" when present; error: the message */
	size_t text_len;
	const char *code;       /* error: the code name */
	const char *finish_reason;
	json_t *done;           /* done: the payload object (borrowed from root) */
	json_t *root;
};
/* Parse an event line; false (with a message in err) when it is not a valid event. */
bool toast_proto_event_parse(const char *line, size_t len, struct toast_proto_event *ev, struct toast_error *err);
void toast_proto_event_deinit(struct toast_proto_event *ev);

/* ---- shared conventions ----------------------------------------------------------------- */

/* The default socket: $TOASTED_SOCKET, else $XDG_RUNTIME_DIR/toasted.sock, else
 * /tmp/toasted-$UID/toasted.sock. false when it does not fit n bytes (sun_path limit). */
bool toast_proto_default_socket(char *buf, size_t n);

/*
 * The one user message that `toast PROMPT` and `toasted run PROMPT` send: the instruction, then
 * the material read from standard input, separated by a blank line ("\n\n"); either may be
 * absent (an empty stdin counts as none). Invalid UTF-8 is repaired (U+FFFD), as the tokenizer
 * would. Appends to out; false when out of memory.
 */
bool toast_compose_user(struct toast_buf *out, const char *instruction, const char *material, size_t material_len);

#endif
