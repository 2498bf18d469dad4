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

/* Load progress: bytes of weights made ready so far, of total. Return nonzero to cancel the load
 * (toast_engine_open then fails with TOAST_ERR_CANCELLED). */
typedef int (*toast_progress_cb)(void *ud, size_t done_bytes, size_t total_bytes);

#define TOAST_MAX_CHUNK 32768 /* the most tokens a prefill pass may take */

struct toast_engine_opts {
	const char *backend; /* "cpu", "cuda", or NULL: cuda when a GPU is usable, else cpu */
	int n_threads;       /* CPU threads; 0: all online cores */
	int chunk;           /* tokens per prefill forward pass (<= TOAST_MAX_CHUNK); 0: the default (64 on the
				CPU; on a GPU 32768, 16384 or 8192 as 32 GiB, 16 GiB or less are
				free once the weights are in) */
	const char *quant;   /* NULL: weights as stored; or quantise a float model's matrices at load:
				"q8_0", "q4_0", "q4_1", "q4_k_m", "q5_k_m", "q6_k", "bf16" */
	toast_progress_cb progress; /* NULL: none; called from the loading thread, once per layer */
	void *progress_ud;
	const char *synthetic; /* a preset shape ("qwen3-next-80b-a3b") or a config.json path (with a '/'):
				* random weights, no weight files; path is ignored */
	int synthetic_layers;  /* with synthetic: use only the first N layers (0: all) */
	const char *synthetic_type; /* with synthetic: the matrices' type, NULL or "bf16" (default), "q4_k",
				       "q8_0", "mlx4", ... (any quantised type name, case-insensitive) */
	const char *kv_cache; /* NULL or "default": the KV cache in the activation type (bf16 on a GPU, f32
				 on the CPU); "q8": 8-bit codes with a scale per token and head (half the
				 bytes of bf16, so decode at long context reads half as much) */
};

void toast_engine_opts_init(struct toast_engine_opts *o);

struct toast_model_info {
	const char *arch;        /* "qwen3_next", "qwen3", "qwen3_moe", "qwen3_5_text", "llama", or the GGUF
				    architecture ("qwen3next", ...) */
	const char *backend;     /* "cpu" or "cuda" */
	int chunk;               /* tokens a prefill pass takes */
	int n_vocab, n_embd, n_layer, n_layer_attn;
	int n_ctx_train;         /* max_position_embeddings */
	int n_expert, n_expert_used;
	size_t weight_bytes;     /* bytes of all bound weights */
	bool quantized;          /* some weight matrices are quantised (GGUF Q*, MLX, or --quant) */
	size_t decode_bytes;     /* weight bytes one decode step must read (active experts only) */
	size_t state_bytes_fixed;/* recurrent + conv state per session */
	size_t kv_bytes_per_tok; /* KV cache bytes per token of context */
	const char *kv_cache;    /* its type: "bf16", "f32" or "q8" */
	/* FLOPs a prompt needs: per token (matrix products; the DeltaNet's chunked state products),
	 * per (query, key) pair that causal attention relates (Q·Kᵀ and P·V over the attention
	 * layers), and once for the last token's output head */
	double token_flops, pair_flops, head_flops;
};

/* Load the model at `path`: a directory (config.json + safetensors) or a GGUF file. A directory
 * that `toasted pull` left incomplete (see src/format/modeldir.h) is refused with
 * TOAST_ERR_INVALID and a message saying how to resume. */
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
/* The tokens the session holds: [toast_session_n_past(s)] entries, valid until it changes. */
const int32_t *toast_session_tokens(const struct toast_session *s);

/*
 * Feed n tokens after the n_past already seen, in chunks. On success the logits of the last
 * token are available from toast_session_logits(). When all_logits is not NULL it receives the
 * logits of every token: [n][n_vocab]. TOAST_ERR_CTX_FULL when n_past + n > n_ctx (nothing fed).
 */
enum toast_status toast_session_feed(struct toast_session *s, const int32_t *ids, int n,
				     float *all_logits, struct toast_error *err);
/* [n_vocab] logits of the last token fed (copied from the device when needed); NULL before any
 * token or when the backend failed. Valid until the session changes. */
const float *toast_session_logits(struct toast_session *s);
/* The m (1..256) largest logits of the last token fed, larger first, the lower id first among
 * equal values, NaN never: ids and vals. On the GPU only those m pairs cross to the host.
 * Returns how many (fewer than m when the rest are NaN), or -1 with err set. */
int toast_session_top(struct toast_session *s, int m, int32_t *ids, float *vals, struct toast_error *err);

/* ---- diagnostics ---- */

/* Called with host f32 copies of the residual stream during a feed: index 0 after the
 * embedding, i after decoder layer i-1 for i < n_layer, n_layer after the final norm. */
typedef void (*toast_layer_cb)(void *ud, int index, const float *x, int n_tokens, int n_embd);
/* toast_session_feed that also reports every layer's output (slower: copies each layer out). */
enum toast_status toast_session_feed_layers(struct toast_session *s, const int32_t *ids, int n, float *all_logits,
					    toast_layer_cb cb, void *ud, struct toast_error *err);
/* Copy bandwidth of the memory the engine computes from (device memory on CUDA), in bytes/s,
 * counting bytes read plus bytes written: the denominator of a bandwidth floor. */
double toast_engine_bandwidth(struct toast_engine *e);
/* The rate of a large bf16 GEMM on the engine's backend as prefill runs them, FLOP/s, measured
 * now: the denominator of a compute floor; 0 where the backend does not measure it (CPU). */
double toast_engine_gemm_rate(struct toast_engine *e);
/* Benchmarks only: pretend the session holds n tokens (their KV rows and ids are whatever is there),
 * so that decode at a long context can be timed without prefilling it. */
void toast_session_bench_seek(struct toast_session *s, int n);
/* Benchmarks only: feeds of up to T <= 8 tokens are recorded and replayed as decode steps are
 * (on a backend that records), so that a step of several tokens (a speculative decoder's
 * verification) can be timed as decode is. */
void toast_session_bench_record(struct toast_session *s, int T);
/* Benchmarks only: feeds of 2..T <= 8 tokens also keep the recurrent states after each of their
 * tokens, as a speculative step does (toast_gen_opts.draft) to keep fewer of them; 0 stops. */
enum toast_status toast_session_bench_keep(struct toast_session *s, int T, struct toast_error *err);
/* Benchmarks only: after a feed of T tokens with the states kept, keep only its first n (what a
 * speculative step does when its draft is refused). Queued. */
enum toast_status toast_session_bench_rewind(struct toast_session *s, int T, int n, struct toast_error *err);

/* ---- tokenizer (src/tokenizer/) ---------------------------------------------------------- */

struct toast_tokenizer;

/* Load tokenizer.json (+ tokenizer_config.json, generation_config.json, config.json and
 * chat_template.jinja when present) from a model directory. Byte-level BPE only: anything else
 * is TOAST_ERR_UNSUPPORTED with a message naming it. */
enum toast_status toast_tok_load(const char *model_dir, struct toast_tokenizer **out, struct toast_error *err);
void toast_tok_free(struct toast_tokenizer *tok);
int toast_tok_n_vocab(const struct toast_tokenizer *tok);
/*
 * Encode n bytes of text into *ids (malloc'd, *n_ids entries), exactly as Hugging Face
 * `tokenizers` encodes it without adding special tokens. Added/special tokens such as
 * <|im_start|> are matched in the text. Any bytes are accepted: each maximal invalid UTF-8
 * subsequence (an encoded surrogate included) is first replaced by U+FFFD, as upstream's callers
 * must do (String::from_utf8_lossy, bytes.decode("utf-8", "replace")) since its API takes only
 * valid strings; nothing is dropped. Thread-safe: the tokenizer is only read.
 */
enum toast_status toast_tok_encode(const struct toast_tokenizer *tok, const char *text, size_t n, int32_t **ids,
				   int *n_ids, struct toast_error *err);
/* The raw bytes of token id (not NUL-terminated), or NULL for an id outside the vocabulary. */
const char *toast_tok_piece(const struct toast_tokenizer *tok, int32_t id, size_t *len);
/* Decode ids to text (malloc'd, NUL-terminated, *len without the NUL): the pieces' bytes with each
 * maximal invalid UTF-8 subsequence replaced by U+FFFD (upstream's decode). TOAST_ERR_INVALID for
 * an id without a piece. */
enum toast_status toast_tok_decode(const struct toast_tokenizer *tok, const int32_t *ids, int n, char **text,
				   size_t *len, struct toast_error *err);
/* The id of the token whose bytes are exactly `text` (added tokens first), or -1. */
int32_t toast_tok_lookup(const struct toast_tokenizer *tok, const char *text);
/* true for tokens that end generation (eos, <|im_end|>, <|endoftext|>, ... as the model defines). */
bool toast_tok_is_eog(const struct toast_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 characters. */
struct toast_detok {
	unsigned char pending[8];
	int n_pending;
};
void toast_detok_init(struct toast_detok *d);
/* Room one push or flush may need: 3 * (longest piece + 8) + 16 bytes (an invalid byte
 * becomes a 3-byte U+FFFD). */
size_t toast_detok_cap(const struct toast_tokenizer *tok);
/* Append the text of id to out (cap >= toast_detok_cap(tok) bytes; never written past cap);
 * returns bytes written (not NUL-terminated). Bytes of an unfinished character are held back
 * until it completes; each maximal invalid subsequence becomes one U+FFFD, so pushing a
 * sequence and flushing gives exactly toast_tok_decode() of it. Ids without a piece add nothing. */
size_t toast_detok_push(struct toast_detok *d, const struct toast_tokenizer *tok, int32_t id, char *out, size_t cap);
/* Flush held-back bytes at the end of a stream (an unfinished character becomes U+FFFD). */
size_t toast_detok_flush(struct toast_detok *d, char *out, size_t cap);

/* ---- chat template (src/tokenizer/) ------------------------------------------------------- */

struct toast_chat_msg {
	const char *role;    /* "system", "user", "assistant", "tool" */
	const char *content;
};

struct toast_chat_opts {
	bool add_generation_prompt; /* end with the assistant turn's opening */
	int enable_thinking;        /* -1: template default (undefined), 0: false, 1: true */
};

/* Render messages into the prompt text the model was trained on (its chat_template.jinja or
 * tokenizer_config.json chat_template, run as transformers' apply_chat_template runs it; built-in
 * ChatML when it has none). *out is malloc'd. opts NULL: a generation prompt, thinking default.
 * TOAST_ERR_INVALID when the template raises (raise_exception) or fails, with its message;
 * TOAST_ERR_UNSUPPORTED when the template uses what the interpreter does not support. */
enum toast_status toast_chat_render(const struct toast_tokenizer *tok, const struct toast_chat_msg *msgs, int n_msgs,
				    const struct toast_chat_opts *opts, char **out, struct toast_error *err);
/* The same from an OpenAI-style JSON messages array (content may be a list of parts, tool_calls,
 * reasoning_content, ... whatever the template reads), and an optional JSON array of tools. */
enum toast_status toast_chat_render_json(const struct toast_tokenizer *tok, const char *messages_json,
					 const char *tools_json, const struct toast_chat_opts *opts, char **out,
					 struct toast_error *err);

/* ---- sampling and generation (src/engine/) ------------------------------------------------ */

struct toast_sampling {
	float temperature;    /* 0: greedy (argmax) */
	int top_k;            /* 0: off */
	float top_p;          /* 1: off */
	float min_p;          /* 0: off */
	float repeat_penalty; /* 1: off (the default) */
	int repeat_last_n;    /* tokens the penalty looks back over */
	uint64_t seed;        /* same seed, same logits: same tokens */
};
void toast_sampling_init(struct toast_sampling *s); /* the defaults above; temperature 0.7, top_p 0.8, top_k 20 */
/* Sampling applies, in this order (as transformers does): repetition penalty, temperature, top-k,
 * top-p, min-p, then a draw from a generator seeded with seed (state per sampler, no globals). */

struct toast_sampler;
enum toast_status toast_sampler_new(const struct toast_sampling *s, int n_vocab, struct toast_sampler **out,
				    struct toast_error *err);
void toast_sampler_free(struct toast_sampler *sp);
/* Choose the next token from logits[n_vocab] (not modified). */
int32_t toast_sampler_sample(struct toast_sampler *sp, const float *logits);
/* How many of the largest logits toast_sampler_sample_top needs to choose exactly as
 * toast_sampler_sample would from all of them (1 for greedy, else top_k; plus repeat_last_n
 * under a repetition penalty over 1), or 0 when it needs them all (no top-k, a penalty under
 * 1, or more than 256). */
#define TOAST_SAMPLER_TOP_MAX 256
int toast_sampler_top_need(const struct toast_sampler *sp);
/* The same choice from the n largest logits (toast_session_top's answer, n >= the need). */
int32_t toast_sampler_sample_top(struct toast_sampler *sp, const int32_t *ids, const float *vals, int n);
/* Record a token as seen (for the repetition penalty). */
void toast_sampler_accept(struct toast_sampler *sp, int32_t id);

enum toast_finish {
	TOAST_FINISH_STOP,      /* an end-of-generation token or a stop string */
	TOAST_FINISH_LENGTH,    /* max_tokens reached */
	TOAST_FINISH_CTX,       /* the context window is full */
	TOAST_FINISH_CANCELLED, /* the callback asked to stop */
};

struct toast_gen_opts {
	int max_tokens;               /* 0: until the context is full */
	struct toast_sampling sampling;
	const char *const *stop;      /* stop strings (not emitted), n_stop of them */
	int n_stop;
	bool ignore_eos;
	/* Called once the prompt is in the session, before the first token is sampled (NULL:
	 * none): where a session cache marks the end of the prompt (toast_cache_mark_prompt). */
	void (*on_prompt)(void *ud, struct toast_session *s);
	void *on_prompt_ud;
	/* Speculative decoding (any sampling without a repetition penalty; with one, nothing is
	 * drafted): drafts of up to this many tokens (at most TOAST_DRAFT_MAX) copied from where the
	 * last tokens occurred earlier in the session (the prompt, or the reply so far: prompt
	 * lookup), verified in one forward pass, a draft token taken where the model's pick there
	 * (greedy, or the sampler's draw with the uniform that token takes) is that token: the tokens
	 * are those decoding without drafts gives (with the same seed). Pays where the reply repeats
	 * its input (edits, code, quotes). 0: off. */
	int draft;
};
#define TOAST_DRAFT_MAX 7

struct toast_gen_result {
	int n_prompt;        /* prompt tokens of the request: those the session held before + n_prompt */
	int n_prefilled;     /* of those, tokens actually run through the model (the rest came from state) */
	int n_generated;     /* tokens passed to the callback (a final end-of-generation token included) */
	enum toast_finish finish;
	double t_prefill;    /* seconds */
	double t_first;      /* seconds from the call to the first generated token */
	double t_decode;     /* seconds spent generating after the first token */
	int n_drafted;       /* draft tokens verified (opts.draft) */
	int n_accepted;      /* of those, tokens the model agreed with */
};

/* Called once for every generated token, in order, with the text that token completes
 * (complete UTF-8 characters only; empty while a character or a possible stop string is held
 * back, and for an end-of-generation token, whose text is not emitted). The last call carries
 * whatever was still held back. Return nonzero to cancel (the token is still fed). */
typedef int (*toast_token_cb)(void *ud, int32_t id, const char *text, size_t len);

/*
 * Generate from a session: the prompt tokens are fed after what the session already holds
 * (from n_keep = toast_session_n_past(s): the caller may have restored a prefix; the sampler's
 * repetition penalty sees those tokens too, as if they had been fed now), then tokens
 * are sampled until a stop condition: an end-of-generation token (unless opts->ignore_eos), a
 * stop string (its text and what follows are never emitted), max_tokens, or a full context
 * (TOAST_FINISH_CTX). Every token passed to the callback is fed into the session, the final one
 * included, so the session ends holding prompt + generated tokens; a token is sampled only when
 * the context has room to feed it. tok may be NULL (no text, no end-of-generation tokens).
 * TOAST_ERR_CTX_FULL (nothing generated) when the prompt leaves no room for one token.
 */
enum toast_status toast_generate(struct toast_session *s, const struct toast_tokenizer *tok, const int32_t *prompt,
				 int n_prompt, const struct toast_gen_opts *opts, toast_token_cb cb, void *ud,
				 struct toast_gen_result *res, struct toast_error *err);

/* The engine's tokenizer (loaded with the model when the model has one), or NULL. */
const struct toast_tokenizer *toast_engine_tokenizer(const struct toast_engine *e);

/* ---- session cache (src/engine/cache.c) --------------------------------------------------- */

/*
 * Snapshots of session state keyed by the exact tokens they hold, so that a conversation sent
 * again with one more message prefills only what is new. A snapshot holds the KV rows of the
 * attention layers, the DeltaNet states, the tokens and the last logits, at two points: the end
 * of a request (prompt + reply + end-of-turn token) and the end of its prompt (so that a
 * regenerated or edited reply still reuses the history; that point costs one copy of the
 * DeltaNet states, whose size does not grow with the context). A recurrent state cannot be
 * rewound, so a snapshot is used only at one of its points, never a prefix of one.
 *
 * Lookup: the snapshot point whose tokens are the longest prefix of the new prompt (FNV-1a
 * hashes of prefixes, confirmed by comparing the tokens); a template that renders history
 * differently from the tokens once generated is a miss, never a wrong hit. The session itself
 * counts as the newest snapshot: a conversation that continues in it is restored for free.
 * Saving a snapshot replaces every snapshot it extends (the one restored for the request and
 * any whose tokens are a prefix of its own), so a conversation holds one snapshot however many
 * turns it has; the memory budget evicts the least recently used. With a directory, every
 * snapshot is also written to a file (a header, the tokens, the state, checksums) and the files
 * are indexed again when a cache opens on the same directory; a file is loaded only when used,
 * and one that is truncated, corrupted or made by another model is never loaded.
 *
 * One cache serves the sessions of one engine, from the engine's thread.
 */
struct toast_cache;

struct toast_cache_opts {
	size_t budget_bytes;     /* memory for snapshots; 0: a quarter of what is free where they live */
	bool device;             /* keep snapshots in backend memory (GPU memory on CUDA) instead of host
				  * memory (pinned on CUDA); the same on the CPU */
	const char *dir;         /* NULL: memory only */
	size_t dir_budget_bytes; /* bytes of files in dir; 0: a quarter of the free space there */
};

struct toast_cache_stats {
	size_t budget_bytes, bytes_held; /* memory: the budget and what snapshots hold */
	int entries;                     /* snapshots (in memory or only in their file) */
	uint64_t evictions;              /* snapshots (or their memory) dropped for the budgets */
	uint64_t replaced;               /* snapshots replaced by one that extends them */
	uint64_t rejected;               /* snapshot files found broken or of another model */
	size_t dir_budget_bytes, file_bytes;
	int files;
	bool device;
};

enum toast_status toast_cache_new(struct toast_engine *e, const struct toast_cache_opts *o, struct toast_cache **out,
				  struct toast_error *err);
void toast_cache_free(struct toast_cache *c);
/*
 * Make s hold the longest prefix of ids[0, n) found in the cache (or in s itself) and set *n_keep
 * to its length; on a miss s is reset and *n_keep is 0. Feed the rest (toast_generate does).
 * An unusable snapshot file counts as a miss; an error is returned only when the backend fails
 * (s is then reset).
 */
enum toast_status toast_cache_restore(struct toast_cache *c, struct toast_session *s, const int32_t *ids, int n,
				      int *n_keep, struct toast_error *err);
/* The prompt is in s: remember this point for the next toast_cache_save (gen opts on_prompt). */
void toast_cache_mark_prompt(struct toast_cache *c, struct toast_session *s);
/* Snapshot what s holds (after a request). Nothing is saved when it does not fit the budget;
 * an error only when the backend fails. */
enum toast_status toast_cache_save(struct toast_cache *c, struct toast_session *s, struct toast_error *err);
void toast_cache_get_stats(const struct toast_cache *c, struct toast_cache_stats *st);

#ifdef __cplusplus
}
#endif
#endif
