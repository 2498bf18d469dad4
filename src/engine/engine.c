/*
 * engine.c - engine (model + backend) and session (one timeline of state) lifecycles, and
 * feeding tokens through the model in chunks.
 *
 * A session owns its state; the engine owns the activation buffers all its sessions share,
 * which is why an engine and its sessions are used from one thread at a time. The engine also
 * owns the model's tokenizer when the directory has a tokenizer.json.
 */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "backend/draw.h"
#include "format/modeldir.h"
#include "models/quantize.h"
#include "tokenizer/tok_gguf.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

/* tokens a prefill pass takes by default: the CPU's caches like small chunks; a GPU wants big
 * ones (a pass reads every expert's weights once; H200, a 17K prompt of the Qwen3-Next shape:
 * 186 ms in passes of 4,096, 169 in 8,192, 162 in 16,384, 152 in one; docs/PERF.md), as big as
 * the memory left once the weights are in allows: a pass needs some hundreds of KB a token of
 * activations and scratch (Qwen3-Next-80B: ~8 GB at 32,768) */
#define ENGINE_DEFAULT_CHUNK_CPU 64
#define ENGINE_DEFAULT_CHUNK_GPU 8192
#define ENGINE_MAX_THREADS 1024

static int engine_gpu_chunk(size_t free_bytes)
{
	const size_t gib = (size_t)1 << 30;
	return free_bytes >= 32 * gib ? TOAST_MAX_CHUNK : free_bytes >= 16 * gib ? 16384 : ENGINE_DEFAULT_CHUNK_GPU;
}

void toast_engine_opts_init(struct toast_engine_opts *o)
{
	memset(o, 0, sizeof(*o));
}

static enum toast_status engine_backend(const struct toast_engine_opts *o, struct toast_backend **be,
					struct toast_error *err)
{
	const char *name = o->backend;
	if (!name)
		name = toast_backend_cuda_available() ? "cuda" : "cpu";
	if (strcmp(name, "cpu") == 0)
		return toast_backend_cpu_new(o->n_threads, be, err);
	if (strcmp(name, "cuda") == 0)
		return toast_backend_cuda_new(be, err);
	return toast_err_set(err, TOAST_ERR_INVALID, "unknown backend \"%s\" (cpu or cuda)", name);
}

enum toast_status toast_engine_open(const char *path, const struct toast_engine_opts *opts,
				    struct toast_engine **out, struct toast_error *err)
{
	*out = NULL;
	struct toast_engine_opts defaults;
	if (!opts) {
		toast_engine_opts_init(&defaults);
		opts = &defaults;
	}
	/* a directory that `toasted pull` left incomplete must not be served, whatever it holds */
	enum toast_status rc = opts->synthetic ? TOAST_OK : toast_modeldir_check(path, err);
	if (rc != TOAST_OK)
		return rc;
	if (opts->chunk < 0 || opts->chunk > TOAST_MAX_CHUNK)
		return toast_err_set(err, TOAST_ERR_INVALID, "chunk size %d outside [1, %d]", opts->chunk, TOAST_MAX_CHUNK);
	if (opts->n_threads < 0 || opts->n_threads > ENGINE_MAX_THREADS)
		return toast_err_set(err, TOAST_ERR_INVALID, "thread count %d outside [1, %d]", opts->n_threads,
				     ENGINE_MAX_THREADS);
	enum toast_kv_type kv = TOAST_KV_ACT;
	if (opts->kv_cache && strcmp(opts->kv_cache, "q8") == 0)
		kv = TOAST_KV_Q8;
	else if (opts->kv_cache && strcmp(opts->kv_cache, "default") != 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "unknown KV cache type \"%s\" (default, q8)", opts->kv_cache);
	struct toast_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (opts->quant && !toast_quant_mix_parse(opts->quant, &e->quant)) {
		free(e);
		return toast_err_set(err, TOAST_ERR_INVALID,
				     "unknown quantisation \"%s\" (q8_0, q4_0, q4_1, q4_k_m, q5_k_m, q6_k, bf16)", opts->quant);
	}
	rc = engine_backend(opts, &e->be, err);
	if (rc == TOAST_OK && opts->synthetic) {
		/* a preset name, or a config.json file: a shape of one's own */
		const char *cfg = toast_model_preset(opts->synthetic);
		/* a weight type, or a quantisation mix (q4_k_m: the types a converted file has) */
		enum toast_dtype st = opts->synthetic_type ? toast_dtype_parse(opts->synthetic_type) : TOAST_DT_BF16;
		enum toast_quant_mix mix = TOAST_MIX_NONE;
		char *text = NULL;
		if (st == TOAST_DT_UNKNOWN && toast_quant_mix_parse(opts->synthetic_type, &mix) && mix != TOAST_MIX_NONE)
			st = TOAST_DT_BF16;
		if (st == TOAST_DT_UNKNOWN)
			rc = toast_err_set(err, TOAST_ERR_INVALID,
					   "unknown weight type \"%s\" for a synthetic model (bf16, q4_k, q6_k, mlx4, .., or a "
					   "mix: q4_k_m, q5_k_m)",
					   opts->synthetic_type);
		else if (!cfg && strchr(opts->synthetic, '/'))
			rc = toast_read_file(opts->synthetic, 1 << 20, &text, NULL, err);
		else if (!cfg)
			rc = toast_err_set(err, TOAST_ERR_INVALID,
					   "unknown synthetic shape \"%s\" (qwen3-next-80b-a3b, qwen3.5-35b-a3b, or a config.json path)",
					   opts->synthetic);
		if (rc == TOAST_OK)
			rc = toast_model_load_synthetic(&e->model, cfg ? cfg : text, opts->synthetic_layers, st, mix, e->be,
							err);
		free(text);
	} else if (rc == TOAST_OK) {
		rc = toast_model_load(&e->model, path, e->be, e->quant, opts->progress, opts->progress_ud, err);
	}
	e->model.kv_type = kv;
	if (rc == TOAST_OK && opts->chunk)
		e->chunk = opts->chunk;
	else if (rc == TOAST_OK) /* the weights are in: what is left bounds a GPU's default pass */
		e->chunk = strcmp(e->be->name, "cpu") == 0 ? ENGINE_DEFAULT_CHUNK_CPU
							   : engine_gpu_chunk(e->be->ops->mem_free(e->be));
	if (rc == TOAST_OK)
		rc = toast_model_work_new(&e->model, e->chunk, &e->work, err);
	char tok_path[4096];
	if (rc == TOAST_OK && e->model.is_gguf && toast_gguf_find(&e->model.gguf, "tokenizer.ggml.tokens"))
		rc = toast_tok_from_gguf(&e->model.gguf, &e->tok, err);
	else if (rc == TOAST_OK && !opts->synthetic && toast_path_join(tok_path, sizeof(tok_path), path, "tokenizer.json") &&
		 toast_file_exists(tok_path))
		rc = toast_tok_load(path, &e->tok, err);
	if (rc != TOAST_OK) {
		toast_engine_close(e);
		return rc;
	}
	const struct toast_hparams *hp = &e->model.hp;
	struct toast_model_info *in = &e->info;
	in->chunk = e->chunk;
	in->arch = hp->arch_name;
	in->backend = e->be->name;
	in->n_vocab = hp->n_vocab;
	in->n_embd = hp->n_embd;
	in->n_layer = hp->n_layer;
	for (int il = 0; il < hp->n_layer; il++)
		in->n_layer_attn += hp->layer_is_attn[il];
	in->n_ctx_train = hp->n_ctx_train;
	in->n_expert = hp->n_expert;
	in->n_expert_used = hp->n_expert_used;
	in->weight_bytes = e->model.weight_bytes;
	in->quantized = e->model.quantized;
	in->decode_bytes = e->model.decode_bytes;
	in->kv_bytes_per_tok = toast_model_kv_bytes(&e->model, TOAST_KV_UNIT) / TOAST_KV_UNIT;
	in->kv_cache = e->model.kv_type == TOAST_KV_Q8 ? "q8" : e->be->act_type == TOAST_DT_BF16 ? "bf16" : "f32";
	in->state_bytes_fixed = toast_model_rec_bytes(&e->model);
	/* the chunked delta rule per token and value head: S0 read by W and Q, the state update
	 * (3 dk x dv products), and the chunk's own K·Kᵀ, Q·Kᵀ, P·V' rows (chunks of 64) */
	double gdn = 2.0 * hp->ssm_n_v_head * (3.0 * hp->ssm_d_k * hp->ssm_d_v + 64.0 * (2 * hp->ssm_d_k + hp->ssm_d_v));
	in->token_flops = e->model.token_flops + (hp->n_layer - in->n_layer_attn) * gdn;
	in->pair_flops = 4.0 * in->n_layer_attn * hp->n_head * hp->head_dim;
	in->head_flops = 2.0 * hp->n_vocab * hp->n_embd;
	*out = e;
	return TOAST_OK;
}

void toast_engine_close(struct toast_engine *e)
{
	if (!e)
		return;
	toast_tok_free(e->tok);
	if (e->be) {
		if (e->model.be) /* a model that failed to load has already been unloaded */
			toast_model_work_free(&e->model, &e->work);
		toast_model_unload(&e->model);
		toast_backend_free(e->be);
	}
	free(e);
}

const struct toast_model_info *toast_engine_info(const struct toast_engine *e)
{
	return &e->info;
}

const struct toast_tokenizer *toast_engine_tokenizer(const struct toast_engine *e)
{
	return e->tok;
}

enum toast_status toast_session_new(struct toast_engine *e, int n_ctx, struct toast_session **out,
				    struct toast_error *err)
{
	*out = NULL;
	if (n_ctx == 0)
		n_ctx = e->model.hp.n_ctx_train < 4096 ? e->model.hp.n_ctx_train : 4096;
	if (n_ctx < 1 || n_ctx > e->model.hp.n_ctx_train)
		return toast_err_set(err, TOAST_ERR_INVALID, "context size %d outside [1, %d]", n_ctx,
				     e->model.hp.n_ctx_train);
	struct toast_session *s = calloc(1, sizeof(*s));
	if (!s)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	s->e = e;
	s->logits = malloc((size_t)e->model.hp.n_vocab * sizeof(float));
	s->tokens = calloc((size_t)n_ctx, sizeof(int32_t));
	enum toast_status rc = s->logits && s->tokens ? toast_model_state_new(&e->model, n_ctx, &s->state, err)
						      : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (rc != TOAST_OK) {
		free(s->logits);
		free(s->tokens);
		free(s);
		return rc;
	}
	*out = s;
	return TOAST_OK;
}

void toast_session_logits_on_host(struct toast_session *s)
{
	if (s->e->logits_owner == s)
		s->e->logits_owner = NULL;
	s->logits_dev = false;
}

/* bring the session's pending logits to its host buffer */
static enum toast_status session_logits_fetch(struct toast_session *s, struct toast_error *err)
{
	if (!s->logits_dev)
		return TOAST_OK;
	struct toast_engine *e = s->e;
	enum toast_status rc =
		e->be->ops->read(e->be, s->logits, e->work.logits, (size_t)e->model.hp.n_vocab * sizeof(float), err);
	toast_session_logits_on_host(s);
	if (rc != TOAST_OK)
		s->have_logits = false;
	return rc;
}

/* work.logits is about to be overwritten by s's pass: another session's pending logits go home
 * first, and s's own are no longer there */
static enum toast_status session_logits_claim(struct toast_session *s, struct toast_error *err)
{
	struct toast_session *o = s->e->logits_owner;
	enum toast_status rc = o && o != s ? session_logits_fetch(o, err) : TOAST_OK;
	if (rc == TOAST_OK)
		toast_session_logits_on_host(s);
	return rc;
}

void toast_session_free(struct toast_session *s)
{
	if (!s)
		return;
	toast_session_logits_on_host(s);
	toast_model_state_free(&s->e->model, &s->state);
	free(s->logits);
	free(s->tokens);
	free(s);
}

void toast_session_reset(struct toast_session *s)
{
	toast_model_state_zero(&s->e->model, &s->state);
	s->n_past = 0;
	s->have_logits = false;
	toast_session_logits_on_host(s);
}

double toast_engine_bandwidth(struct toast_engine *e)
{
	struct toast_backend *be = e->be;
	size_t n = (size_t)1 << 30;
	void *a = be->ops->alloc(be, n), *b = be->ops->alloc(be, n);
	double best = 0;
	if (a && b) {
		struct toast_error err;
		be->ops->copy(be, b, a, n); /* first touch */
		be->ops->sync(be, &err);
		for (int i = 0; i < 5; i++) {
			double t0 = toast_now();
			be->ops->copy(be, b, a, n);
			be->ops->sync(be, &err);
			double bw = 2.0 * (double)n / (toast_now() - t0);
			best = bw > best ? bw : best;
		}
	}
	be->ops->release(be, a);
	be->ops->release(be, b);
	return best;
}

double toast_engine_gemm_rate(struct toast_engine *e)
{
	return e->be->ops->gemm_rate ? e->be->ops->gemm_rate(e->be) : 0;
}

void toast_session_bench_seek(struct toast_session *s, int n)
{
	s->n_past = n < s->state.n_ctx ? n : s->state.n_ctx;
}

void toast_session_bench_record(struct toast_session *s, int T)
{
	s->state.record_T = T < TOAST_RECORD_MAX_T ? T : TOAST_RECORD_MAX_T;
}

enum toast_status toast_session_bench_keep(struct toast_session *s, int T, struct toast_error *err)
{
	return toast_model_state_keep(&s->e->model, &s->state, T, err);
}

enum toast_status toast_session_bench_rewind(struct toast_session *s, int T, int n, struct toast_error *err)
{
	enum toast_status rc = toast_model_state_rewind(&s->e->model, &s->state, s->n_past - T, T, n, err);
	if (rc == TOAST_OK)
		s->n_past -= T - n;
	return rc;
}

int toast_session_n_past(const struct toast_session *s)
{
	return s->n_past;
}

const int32_t *toast_session_tokens(const struct toast_session *s)
{
	return s->tokens;
}

int toast_session_n_ctx(const struct toast_session *s)
{
	return s->state.n_ctx;
}

const float *toast_session_logits(struct toast_session *s)
{
	struct toast_error err;
	if (s->have_logits && session_logits_fetch(s, &err) != TOAST_OK)
		TOAST_WARN("reading logits: %s", err.msg);
	return s->have_logits ? s->logits : NULL;
}

int toast_session_top(struct toast_session *s, int m, int32_t *ids, float *vals, struct toast_error *err)
{
	struct toast_engine *e = s->e;
	int V = e->model.hp.n_vocab;
	if (m < 1 || m > TOAST_TOP_MAX || !s->have_logits) {
		toast_err_set(err, TOAST_ERR_INVALID, "top %d of the logits: %s", m,
			      s->have_logits ? "out of [1, 256]" : "no token fed yet");
		return -1;
	}
	if (!s->logits_dev)
		return toast_top_host(s->logits, V, m, ids, vals);
	return e->be->ops->top(e->be, e->work.logits, V, m, ids, vals, err);
}

enum toast_status toast_session_feed_layers(struct toast_session *s, const int32_t *ids, int n, float *all_logits,
					  toast_layer_cb hook, void *hook_ud, struct toast_error *err)
{
	struct toast_engine *e = s->e;
	int V = e->model.hp.n_vocab;
	if (n <= 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "no tokens to feed");
	if (n > s->state.n_ctx - s->n_past)
		return toast_err_set(err, TOAST_ERR_CTX_FULL, "%d tokens do not fit: %d of %d context tokens used", n,
				     s->n_past, s->state.n_ctx);
	enum toast_status rc = session_logits_claim(s, err);
	if (rc != TOAST_OK)
		return rc;
	for (int i = 0; i < n; i += e->chunk) {
		int T = n - i < e->chunk ? n - i : e->chunk;
		rc = toast_model_forward(&e->model, &s->state, &e->work, ids + i, T, s->n_past, all_logits != NULL, hook,
					 hook_ud, err);
		if (rc == TOAST_OK && all_logits)
			rc = e->be->ops->read(e->be, all_logits + (size_t)i * V, e->work.logits_all, (size_t)T * V * sizeof(float),
					      err);
		if (rc == TOAST_OK && all_logits)
			memcpy(s->logits, all_logits + (size_t)(i + T - 1) * V, (size_t)V * sizeof(float));
		if (rc != TOAST_OK) {
			/* the state has advanced past n_past by an unknown amount: it is no longer valid */
			toast_session_reset(s);
			return rc;
		}
		memcpy(s->tokens + s->n_past, ids + i, (size_t)T * sizeof(int32_t));
		s->n_past += T;
		s->have_logits = true;
	}
	/* the last logits stay in work.logits (row 0) until someone asks: sampling usually wants
	 * only the top few (toast_session_top), not n_vocab floats */
	if (!all_logits) {
		s->logits_dev = true;
		e->logits_owner = s;
	}
	return TOAST_OK;
}

int32_t toast_session_chain_end(struct toast_session *s, struct toast_error *err)
{
	struct toast_engine *e = s->e;
	if (e->picks_pending != 1 || e->logits_owner != s) {
		toast_err_set(err, TOAST_ERR_INVALID, "chain end: no pick of this session's logits is queued");
		return -1;
	}
	int32_t id = e->be->ops->pick_read(e->be, err);
	e->picks_pending = 0;
	if (id < 0)
		toast_session_reset(s);
	return id;
}

/* a chain's last pick, never read, dropped */
static enum toast_status session_picks_drop(struct toast_engine *e, struct toast_error *err)
{
	for (; e->picks_pending > 0; e->picks_pending--)
		if (e->be->ops->pick_read(e->be, err) < 0)
			return TOAST_ERR_BACKEND;
	return TOAST_OK;
}

/* the session's logits are row `row` of the last pass's logits_all, left in work.logits */
static void session_logits_row(struct toast_session *s, int row)
{
	struct toast_engine *e = s->e;
	size_t V = (size_t)e->model.hp.n_vocab;
	e->be->ops->copy(e->be, e->work.logits, e->work.logits_all + row * V, V * sizeof(float));
	s->have_logits = true;
	s->logits_dev = true;
	e->logits_owner = s;
}

int toast_session_spec_step(struct toast_session *s, const int32_t *ids, int T, struct toast_sampler *sp,
			    int32_t *next, struct toast_error *err)
{
	struct toast_engine *e = s->e;
	struct toast_backend *be = e->be;
	int V = e->model.hp.n_vocab, pos = s->n_past;
	if (T < 1 || T > TOAST_GDN_KEEP_MAX || T > e->work.max_T || T > s->state.n_ctx - pos) {
		toast_err_set(err, TOAST_ERR_INVALID, "speculative step of %d tokens at %d (at most %d, context %d)", T, pos,
			      TOAST_GDN_KEEP_MAX < e->work.max_T ? TOAST_GDN_KEEP_MAX : e->work.max_T, s->state.n_ctx);
		return -1;
	}
	if (sp && !toast_sampler_spec_ok(sp)) {
		toast_err_set(err, TOAST_ERR_INVALID, "speculative step: a repetition penalty's draws depend on each other");
		return -1;
	}
	if (session_logits_claim(s, err) != TOAST_OK)
		return -1;
	/* the states after each token kept (once a session; without the memory, nothing is done);
	 * steps of every size recorded */
	if (s->state.keep_T < TOAST_GDN_KEEP_MAX &&
	    toast_model_state_keep(&e->model, &s->state, TOAST_GDN_KEEP_MAX, err) != TOAST_OK)
		return 0;
	s->state.record_T = TOAST_GDN_KEEP_MAX;
	enum toast_status rc = session_picks_drop(e, err);
	if (rc == TOAST_OK)
		rc = toast_model_forward(&e->model, &s->state, &e->work, ids, T, pos, true, NULL, NULL, err);
	/* each row's pick: one wait where the backend can */
	struct toast_draw d[TOAST_GDN_KEEP_MAX];
	bool drawn = sp && toast_sampler_draws(sp, d, T);
	int32_t picks[TOAST_GDN_KEEP_MAX];
	if (rc == TOAST_OK && be->ops->pick_rows) {
		if (be->ops->pick_rows(be, e->work.logits_all, V, T, drawn ? d : NULL, picks, err) < 0)
			rc = TOAST_ERR_BACKEND;
	} else {
		for (int r = 0; rc == TOAST_OK && r < T; r++) {
			be->ops->pick(be, e->work.logits_all + (size_t)r * V, V, drawn ? d + r : NULL);
			rc = (picks[r] = be->ops->pick_read(be, err)) < 0 ? TOAST_ERR_BACKEND : TOAST_OK;
		}
	}
	int n = 1; /* the draft's tokens the model agrees with, in order, and the first token */
	while (rc == TOAST_OK && n < T && ids[n] == picks[n - 1])
		n++;
	*next = picks[n - 1];
	if (drawn)
		toast_sampler_take(sp, n);
	if (rc == TOAST_OK && n < T)
		rc = toast_model_state_rewind(&e->model, &s->state, pos, T, n, err);
	if (rc != TOAST_OK) {
		toast_session_reset(s);
		return -1;
	}
	memcpy(s->tokens + pos, ids, (size_t)n * sizeof(int32_t));
	s->n_past = pos + n;
	s->spec_pos = pos, s->spec_T = T, s->spec_n = n;
	session_logits_row(s, n - 1);
	return n;
}

enum toast_status toast_session_spec_trim(struct toast_session *s, int n, struct toast_error *err)
{
	if (n < 1 || n > s->spec_n || s->n_past != s->spec_pos + s->spec_n)
		return toast_err_set(err, TOAST_ERR_INVALID, "trim a speculative step to %d of its %d tokens", n, s->spec_n);
	if (n == s->spec_n)
		return TOAST_OK;
	enum toast_status rc = toast_model_state_rewind(&s->e->model, &s->state, s->spec_pos, s->spec_T, n, err);
	if (rc != TOAST_OK)
		return rc;
	s->n_past = s->spec_pos + n;
	s->spec_n = n;
	session_logits_row(s, n - 1);
	return TOAST_OK;
}

/* the backend's pick of the logits in work.logits, queued behind the pending ones (a sampled
 * pick takes the sampler's next uniform); prev: the pick before it is pending, its token not yet
 * accepted by the sampler (a penalty counts it) */
static void session_pick(struct toast_engine *e, struct toast_sampler *sp, bool prev)
{
	struct toast_draw d;
	bool drawn = toast_sampler_backend_draw(sp, &d);
	d.prev = prev;
	e->be->ops->pick(e->be, e->work.logits, e->model.hp.n_vocab, drawn ? &d : NULL);
	e->picks_pending++;
}

bool toast_session_chain_begin(struct toast_session *s, struct toast_sampler *sp)
{
	struct toast_engine *e = s->e;
	if (!e->be->ops->pick || !s->have_logits || !s->logits_dev ||
	    e->logits_owner != s || session_picks_drop(e, &(struct toast_error){0}) != TOAST_OK)
		return false;
	session_pick(e, sp, false);
	return true;
}

int32_t toast_session_chain_step(struct toast_session *s, struct toast_sampler *sp, struct toast_error *err)
{
	struct toast_engine *e = s->e;
	if (s->n_past >= s->state.n_ctx) {
		toast_err_set(err, TOAST_ERR_CTX_FULL, "no room to feed a token: %d of %d context tokens used", s->n_past,
			      s->state.n_ctx);
		return -1;
	}
	if (e->picks_pending != 1 || e->logits_owner != s) {
		toast_err_set(err, TOAST_ERR_INVALID, "chain step: no pick of this session's logits is queued");
		return -1;
	}
	int32_t id = -1;
	/* the step reads the pick on the device; then the pick of its logits is queued behind it
	 * before the host waits for the first (two pending) */
	enum toast_status rc =
		toast_model_forward(&e->model, &s->state, &e->work, NULL, 1, s->n_past, false, NULL, NULL, err);
	if (rc == TOAST_OK) {
		session_pick(e, sp, true);
		id = e->be->ops->pick_read(e->be, err);
		e->picks_pending = 1;
	}
	if (id < 0) {
		toast_session_reset(s);
		return -1;
	}
	s->tokens[s->n_past++] = id;
	return id;
}

enum toast_status toast_session_feed(struct toast_session *s, const int32_t *ids, int n, float *all_logits,
				     struct toast_error *err)
{
	return toast_session_feed_layers(s, ids, n, all_logits, NULL, NULL, err);
}
