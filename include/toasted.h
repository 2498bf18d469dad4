/*
 * toasted.h - the public engine API.
 *
 * An engine is a loaded model (weights bound to a backend); a session is one inference timeline
 * that owns its KV cache and recurrent state. The server and the CLI include only this header.
 *
 * Conventions: fallible functions return enum toast_status and take an optional
 * struct toast_error * last (NULL is allowed); destructors accept NULL. Nothing here calls exit().
 * An engine and its sessions are used from one thread at a time.
 */
#ifndef TOASTED_H
#define TOASTED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOAST_VERSION "0.1.0"

enum toast_status {
	TOAST_OK = 0,
	TOAST_ERR_IO,          /* a file or socket operation failed */
	TOAST_ERR_FORMAT,      /* a file's content is malformed or inconsistent */
	TOAST_ERR_INVALID,     /* an argument or request is invalid */
	TOAST_ERR_NOMEM,       /* an allocation failed */
	TOAST_ERR_BACKEND,     /* the compute backend failed (a sticky GPU error, ...) */
	TOAST_ERR_CTX_FULL,    /* the context window is full */
	TOAST_ERR_UNSUPPORTED, /* a valid input this build does not handle */
	TOAST_ERR_CANCELLED,   /* the caller asked to stop */
	TOAST_ERR_BUSY,        /* a bounded queue is full */
};

struct toast_error {
	enum toast_status code;
	char msg[512];
};

/* A short constant name for a status ("io", "format", ...). */
const char *toast_status_name(enum toast_status st);

/* ---- engine ---------------------------------------------------------------------------- */

struct toast_engine;
struct toast_session;

struct toast_engine_opts {
	const char *backend; /* "cpu", "cuda", or NULL: cuda when a GPU is usable, else cpu */
	int n_threads;       /* CPU threads; 0: all online cores */
	int chunk;           /* tokens per prefill forward pass; 0: the default (64) */
};

void toast_engine_opts_init(struct toast_engine_opts *o);

struct toast_model_info {
	const char *arch;        /* "qwen3_next", "qwen3", "qwen3_moe", "qwen3_5_text", ... */
	const char *backend;     /* "cpu" or "cuda" */
	int n_vocab, n_embd, n_layer, n_layer_attn;
	int n_ctx_train;         /* max_position_embeddings */
	int n_expert, n_expert_used;
	size_t weight_bytes;     /* bytes of all bound weights */
	size_t decode_bytes;     /* weight bytes one decode step must read (active experts only) */
	size_t state_bytes_fixed;/* recurrent + conv state per session */
	size_t kv_bytes_per_tok; /* KV cache bytes per token of context */
};

/* Load the model in directory `path` (config.json + safetensors). */
enum toast_status toast_engine_open(const char *path, const struct toast_engine_opts *opts,
				    struct toast_engine **out, struct toast_error *err);
void toast_engine_close(struct toast_engine *e);
const struct toast_model_info *toast_engine_info(const struct toast_engine *e);

/* ---- session --------------------------------------------------------------------------- */

/* A session with room for n_ctx tokens (0: min(n_ctx_train, 4096)). */
enum toast_status toast_session_new(struct toast_engine *e, int n_ctx, struct toast_session **out,
				    struct toast_error *err);
void toast_session_free(struct toast_session *s);
/* Forget all tokens: the state is as new. */
void toast_session_reset(struct toast_session *s);
int toast_session_n_past(const struct toast_session *s);
int toast_session_n_ctx(const struct toast_session *s);

/*
 * Feed n tokens after the n_past already seen, in chunks. On success the logits of the last
 * token are available from toast_session_logits(). When all_logits is not NULL it receives the
 * logits of every token: [n][n_vocab]. TOAST_ERR_CTX_FULL when n_past + n > n_ctx (nothing fed).
 */
enum toast_status toast_session_feed(struct toast_session *s, const int32_t *ids, int n,
				     float *all_logits, struct toast_error *err);
/* [n_vocab] logits of the last token fed; NULL before any token. */
const float *toast_session_logits(const struct toast_session *s);

#ifdef __cplusplus
}
#endif
#endif
