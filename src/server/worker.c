/*
 * worker.c - the worker thread: owns the engine, its tokenizer and the session; runs queued
 * requests one at a time, first in first out; writes one audit record per request it runs.
 *
 * Invariants: only this thread calls the engine. Generated text is appended to the job under
 * out_mu and the loop is woken through an eventfd (at most one pending wake-up). The cancel flag
 * is read at every token, so a client that leaves or a stopping daemon ends a generation at the
 * next token (a prefill in progress runs to its end first).
 *
 * Session model: one session. With a session cache, worker_session_prepare() restores into it the
 * longest cached prefix of the prompt (the session itself when the conversation continues in
 * it), the cache marks the end of the prompt, and the finished request is snapshotted after its
 * client has its `done`. Without one, every request starts from an empty session.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "server/srv.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

struct srv_job *srv_job_new(const char *via, long uid)
{
	struct srv_job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	atomic_init(&j->refs, 1);
	atomic_init(&j->cancel, SRV_RUN);
	j->via = via;
	j->uid = uid;
	j->t_arrive = toast_now();
	toast_buf_init(&j->text);
	return j;
}

void srv_job_unref(struct srv_job *j)
{
	if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	toast_proto_req_deinit(&j->req);
	toast_buf_deinit(&j->text);
	free(j->raw);
	free(j);
}

/*
 * On a GPU the first step of each kind pays for loading its kernels, setting up cuBLAS and
 * recording the decode graph (~90 ms of a tiny model's first request on an H100, docs/PERF.md).
 * Paid here, before the daemon serves, on the worker's own session (the recorded decode step is
 * keyed on it; the state is reset after): a prompt-sized pass, a continuation-sized one and two
 * decode steps, so that the first request is as quick as the next. The CPU has nothing to load.
 */
static enum toast_status worker_warm(struct srv_worker *w, struct toast_error *err)
{
	const struct toast_model_info *in = toast_engine_info(w->e);
	int n = toast_session_n_ctx(w->sess) - 2;
	if (strcmp(in->backend, "cpu") == 0 || n < 2)
		return TOAST_OK;
	int32_t ids[64];
	n = n < 64 ? n : 64;
	for (int i = 0; i < n; i++)
		ids[i] = i % in->n_vocab;
	int32_t top;
	float v;
	int n_cont = n / 8 > 1 ? n / 8 : 1;
	enum toast_status rc = toast_session_feed(w->sess, ids, n - n_cont, NULL, err);
	if (rc == TOAST_OK)
		rc = toast_session_feed(w->sess, ids, n_cont, NULL, err);
	for (int k = 0; k < 2 && rc == TOAST_OK; k++)
		if ((rc = toast_session_feed(w->sess, ids + k, 1, NULL, err)) == TOAST_OK &&
		    toast_session_top(w->sess, 1, &top, &v, err) < 0)
			rc = TOAST_ERR_BACKEND;
	toast_session_reset(w->sess);
	return rc;
}

enum toast_status srv_worker_init(struct srv_worker *w, struct toast_engine *e, int n_ctx, int queue_depth,
				  bool debug, struct toast_error *err)
{
	memset(w, 0, sizeof(*w));
	w->wake_fd = -1;
	pthread_mutex_init(&w->mu, NULL);
	pthread_mutex_init(&w->out_mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	atomic_init(&w->wake_pending, false);
	w->e = e;
	w->tok = toast_engine_tokenizer(e);
	w->debug = debug;
	w->q_cap = queue_depth;
	w->q = calloc((size_t)queue_depth, sizeof(*w->q));
	if (!w->q)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = toast_session_new(e, n_ctx, &w->sess, err);
	return rc == TOAST_OK ? worker_warm(w, err) : rc;
}

enum toast_status srv_worker_cache(struct srv_worker *w, const struct toast_cache_opts *o, struct toast_error *err)
{
	enum toast_status rc = toast_cache_new(w->e, o, &w->cache, err);
	if (rc == TOAST_OK)
		toast_cache_get_stats(w->cache, &w->stats.cache);
	return rc;
}

void srv_worker_deinit(struct srv_worker *w)
{
	toast_cache_free(w->cache);
	w->cache = NULL;
	toast_session_free(w->sess);
	for (int i = 0; i < w->q_len; i++)
		srv_job_unref(w->q[(w->q_head + i) % w->q_cap]);
	free(w->q);
	pthread_mutex_destroy(&w->mu);
	pthread_mutex_destroy(&w->out_mu);
	pthread_cond_destroy(&w->cv);
	w->q = NULL;
	w->sess = NULL;
}

static void worker_wake(struct srv_worker *w)
{
	if (atomic_exchange(&w->wake_pending, true))
		return;
	uint64_t one = 1;
	while (write(w->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

enum toast_status srv_worker_submit(struct srv_worker *w, struct srv_job *j)
{
	enum toast_status rc = TOAST_ERR_BUSY;
	pthread_mutex_lock(&w->mu);
	if (!w->stop && w->q_len < w->q_cap) {
		atomic_fetch_add(&j->refs, 1);
		w->q[(w->q_head + w->q_len) % w->q_cap] = j;
		w->q_len++;
		w->stats.queued = w->q_len;
		pthread_cond_signal(&w->cv);
		rc = TOAST_OK;
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

struct srv_stats srv_worker_stats(struct srv_worker *w)
{
	pthread_mutex_lock(&w->mu);
	struct srv_stats s = w->stats;
	pthread_mutex_unlock(&w->mu);
	return s;
}

static void worker_finish(struct srv_worker *w, struct srv_job *j, enum toast_proto_code code, const char *msg)
{
	pthread_mutex_lock(&w->out_mu);
	j->code = code;
	snprintf(j->msg, sizeof(j->msg), "%s", msg ? msg : "");
	j->finished = true;
	pthread_mutex_unlock(&w->out_mu);
	worker_wake(w);
}

/*
 * Make the session ready for a prompt of n tokens and return how many of them it already holds
 * (the prefix toast_generate() then skips); *hit tells whether that came from a saved state.
 */
static int worker_session_prepare(struct srv_worker *w, const int32_t *ids, int n, bool *hit)
{
	int n_keep = 0;
	struct toast_error err = {0};
	if (!w->cache)
		toast_session_reset(w->sess);
	else if (toast_cache_restore(w->cache, w->sess, ids, n, &n_keep, &err) != TOAST_OK)
		TOAST_ERROR("session cache: %s", err.msg); /* the session is reset: the request prefills it all */
	*hit = n_keep > 0;
	return n_keep;
}

static void worker_on_prompt(void *ud, struct toast_session *s)
{
	toast_cache_mark_prompt(ud, s);
}

/* After a request that ran: snapshot what the session holds, and publish the cache's counters. */
static void worker_session_save(struct srv_worker *w)
{
	struct toast_error err = {0};
	if (!w->cache)
		return;
	if (toast_cache_save(w->cache, w->sess, &err) != TOAST_OK)
		TOAST_ERROR("session cache: %s", err.msg);
	pthread_mutex_lock(&w->mu);
	toast_cache_get_stats(w->cache, &w->stats.cache);
	pthread_mutex_unlock(&w->mu);
}

struct worker_gen {
	struct srv_worker *w;
	struct srv_job *j;
	bool oom;
	struct toast_buf all; /* with --debug: the whole answer, for the audit record */
};

static int worker_on_token(void *ud, int32_t id, const char *text, size_t len)
{
	struct worker_gen *g = ud;
	(void)id;
	if (len) {
		pthread_mutex_lock(&g->w->out_mu);
		g->oom |= !toast_buf_append(&g->j->text, text, len);
		pthread_mutex_unlock(&g->w->out_mu);
		if (g->w->debug)
			g->oom |= !toast_buf_append(&g->all, text, len);
		worker_wake(g->w);
	}
	return g->oom || atomic_load(&g->j->cancel) != SRV_RUN;
}

static const char *worker_finish_reason(enum toast_finish f)
{
	switch (f) {
	case TOAST_FINISH_STOP: return "stop";
	case TOAST_FINISH_LENGTH: return "length";
	case TOAST_FINISH_CTX: return "context";
	case TOAST_FINISH_CANCELLED: return "cancelled";
	}
	return "stop";
}

static void worker_gen_opts(const struct toast_proto_params *p, struct toast_gen_opts *go)
{
	memset(go, 0, sizeof(*go));
	toast_sampling_init(&go->sampling);
	if (!isnan(p->temperature))
		go->sampling.temperature = (float)p->temperature;
	if (!isnan(p->top_p))
		go->sampling.top_p = (float)p->top_p;
	if (!isnan(p->min_p))
		go->sampling.min_p = (float)p->min_p;
	if (p->top_k >= 0)
		go->sampling.top_k = p->top_k;
	if (!isnan(p->repeat_penalty))
		go->sampling.repeat_penalty = (float)p->repeat_penalty;
	/* no seed: a random one, as `toasted run` does */
	if (p->has_seed)
		go->sampling.seed = p->seed;
	else if (getrandom(&go->sampling.seed, sizeof(go->sampling.seed), 0) != (ssize_t)sizeof(go->sampling.seed))
		go->sampling.seed = (uint64_t)(toast_now() * 1e9);
	go->max_tokens = p->max_tokens;
	go->draft = p->draft >= 0 ? p->draft : 0;
	go->stop = p->stop;
	go->n_stop = p->n_stop;
}

static void worker_chat(struct srv_worker *w, struct srv_job *j, struct srv_audit *a)
{
	const struct toast_proto_req *r = &j->req;
	struct toast_error err = {0};
	char *prompt = NULL;
	int32_t *ids = NULL;
	int n_ids = 0;
	struct worker_gen g = {w, j, false, {0}};
	enum toast_proto_code code = TOAST_PROTO_OK;
	enum toast_status rc = TOAST_OK;
	bool cancelled = false, ran = false;
	double t_start = toast_now();
	a->queue_ms = (t_start - j->t_arrive) * 1e3;
	if (!w->tok) {
		code = TOAST_PROTO_UNSUPPORTED;
		snprintf(err.msg, sizeof(err.msg), "the model has no tokenizer (tokenizer.json): it cannot chat");
		goto out;
	}
	struct toast_chat_opts co = {.add_generation_prompt = true, .enable_thinking = r->p.enable_thinking};
	rc = toast_chat_render(w->tok, r->msgs, r->n_msgs, &co, &prompt, &err);
	if (rc == TOAST_OK)
		rc = toast_tok_encode(w->tok, prompt, strlen(prompt), &ids, &n_ids, &err);
	if (rc != TOAST_OK) {
		code = toast_proto_code_from_status(rc);
		goto out;
	}
	a->prompt_tokens = n_ids;
	int n_ctx = toast_session_n_ctx(w->sess);
	if (n_ids == 0) {
		code = TOAST_PROTO_BAD_REQUEST;
		snprintf(err.msg, sizeof(err.msg), "the conversation renders to an empty prompt");
		goto out;
	}
	if (n_ids >= n_ctx || (r->p.max_tokens > 0 && n_ids + r->p.max_tokens > n_ctx)) {
		code = TOAST_PROTO_CONTEXT;
		if (r->p.max_tokens > 0)
			snprintf(err.msg, sizeof(err.msg), "the prompt is %d tokens + max_tokens %d; the context holds %d",
				 n_ids, r->p.max_tokens, n_ctx);
		else
			snprintf(err.msg, sizeof(err.msg), "the prompt is %d tokens; the context holds %d", n_ids, n_ctx);
		goto out;
	}
	bool hit;
	int n_keep = worker_session_prepare(w, ids, n_ids, &hit);
	pthread_mutex_lock(&w->mu);
	w->stats.cache_hits += hit;
	w->stats.cache_misses += !hit;
	w->stats.cache_tokens_reused += (uint64_t)n_keep;
	pthread_mutex_unlock(&w->mu);
	struct toast_gen_opts go;
	worker_gen_opts(&r->p, &go);
	if (w->cache) {
		go.on_prompt = worker_on_prompt;
		go.on_prompt_ud = w->cache;
	}
	struct toast_gen_result res = {0};
	/* the session already holds ids[0, n_keep): feed the rest */
	ran = true;
	rc = toast_generate(w->sess, w->tok, ids + n_keep, n_ids - n_keep, &go, worker_on_token, &g, &res, &err);
	a->cached_tokens = res.n_prompt - res.n_prefilled;
	a->completion_tokens = res.n_generated;
	if (rc == TOAST_OK && g.oom) {
		rc = TOAST_ERR_NOMEM;
		snprintf(err.msg, sizeof(err.msg), "out of memory holding the answer");
	}
	if (rc != TOAST_OK) {
		code = toast_proto_code_from_status(rc);
		goto out;
	}
	a->finish_reason = worker_finish_reason(res.finish);
	a->ttft_ms = (t_start - j->t_arrive + res.t_first) * 1e3;
	a->tokens_per_s = res.n_generated > 1 && res.t_decode > 0 ? (res.n_generated - 1) / res.t_decode : 0;
	if (res.finish == TOAST_FINISH_CANCELLED) {
		cancelled = atomic_load(&j->cancel) == SRV_CANCEL_GONE;
		code = TOAST_PROTO_SHUTDOWN;
		snprintf(err.msg, sizeof(err.msg), "the daemon is stopping");
		goto out;
	}
	pthread_mutex_lock(&w->out_mu);
	j->done = (struct toast_proto_done){
		.finish_reason = a->finish_reason,
		.prompt_tokens = res.n_prompt,
		.cached_tokens = a->cached_tokens,
		.completion_tokens = res.n_generated,
		.draft_tokens = res.n_drafted,
		.draft_accepted = res.n_accepted,
		.queue_ms = a->queue_ms,
		.prefill_ms = res.t_prefill * 1e3,
		.ttft_ms = a->ttft_ms,
		.decode_ms = res.t_decode * 1e3,
		.tokens_per_s = a->tokens_per_s,
	};
	pthread_mutex_unlock(&w->out_mu);
out:
	if (w->debug) {
		a->text = g.all.data;
		a->text_len = g.all.len;
	}
	a->outcome = code == TOAST_PROTO_OK ? "ok" : "error";
	if (code != TOAST_PROTO_OK)
		a->error = toast_proto_code_name(code);
	if (cancelled) {
		a->outcome = "cancelled";
		a->error = NULL;
	}
	a->total_ms = (toast_now() - j->t_arrive) * 1e3;
	srv_audit_write(a);
	worker_finish(w, j, code, err.msg);
	if (ran) /* the client has its answer: the snapshot delays only the next request */
		worker_session_save(w);
	toast_buf_deinit(&g.all);
	free(ids);
	free(prompt);
}

static void worker_tokenize(struct srv_worker *w, struct srv_job *j, struct srv_audit *a)
{
	struct toast_error err = {0};
	enum toast_proto_code code = TOAST_PROTO_UNSUPPORTED;
	int32_t *ids = NULL;
	int n = 0;
	struct toast_buf b;
	toast_buf_init(&b);
	a->queue_ms = (toast_now() - j->t_arrive) * 1e3;
	if (!w->tok) {
		snprintf(err.msg, sizeof(err.msg), "the model has no tokenizer (tokenizer.json)");
	} else {
		enum toast_status rc = toast_tok_encode(w->tok, j->req.text, j->req.text_len, &ids, &n, &err);
		bool ok = rc == TOAST_OK && toast_buf_puts(&b, "[");
		for (int i = 0; ok && i < n; i++)
			ok = toast_buf_printf(&b, i ? ",%" PRId32 : "%" PRId32, ids[i]);
		ok = ok && toast_buf_puts(&b, "]");
		code = rc != TOAST_OK ? toast_proto_code_from_status(rc) : ok ? TOAST_PROTO_OK : TOAST_PROTO_INTERNAL;
		if (rc == TOAST_OK && !ok)
			snprintf(err.msg, sizeof(err.msg), "out of memory");
	}
	a->prompt_tokens = n;
	a->outcome = code == TOAST_PROTO_OK ? "ok" : "error";
	a->error = code == TOAST_PROTO_OK ? NULL : toast_proto_code_name(code);
	a->total_ms = (toast_now() - j->t_arrive) * 1e3;
	srv_audit_write(a);
	if (code == TOAST_PROTO_OK) {
		pthread_mutex_lock(&w->out_mu);
		j->raw = toast_buf_steal(&b);
		pthread_mutex_unlock(&w->out_mu);
	}
	worker_finish(w, j, code, err.msg);
	toast_buf_deinit(&b);
	free(ids);
}

static void *worker_main(void *arg)
{
	struct srv_worker *w = arg;
	for (;;) {
		pthread_mutex_lock(&w->mu);
		while (!w->q_len && !w->stop)
			pthread_cond_wait(&w->cv, &w->mu);
		if (!w->q_len) {
			pthread_mutex_unlock(&w->mu);
			break;
		}
		struct srv_job *j = w->q[w->q_head];
		w->q_head = (w->q_head + 1) % w->q_cap;
		w->q_len--;
		w->stats.queued = w->q_len;
		w->stats.busy = true;
		bool stopping = w->stop;
		pthread_mutex_unlock(&w->mu);

		struct srv_audit a = {.id = j->req.id, .via = j->via, .uid = j->uid, .req = w->debug ? &j->req : NULL};
		a.type = j->req.type == TOAST_REQ_TOKENIZE ? "tokenize" : "chat";
		if (stopping || atomic_load(&j->cancel) != SRV_RUN) {
			a.outcome = atomic_load(&j->cancel) == SRV_CANCEL_GONE ? "cancelled" : "error";
			a.error = "shutdown";
			a.queue_ms = a.total_ms = (toast_now() - j->t_arrive) * 1e3;
			srv_audit_write(&a);
			worker_finish(w, j, TOAST_PROTO_SHUTDOWN, "the daemon is stopping");
		} else if (j->req.type == TOAST_REQ_TOKENIZE) {
			worker_tokenize(w, j, &a);
		} else {
			worker_chat(w, j, &a);
		}

		pthread_mutex_lock(&w->mu);
		w->stats.busy = false;
		if (strcmp(a.outcome, "ok") == 0)
			w->stats.n_ok++;
		else if (strcmp(a.outcome, "cancelled") == 0)
			w->stats.n_cancelled++;
		else
			w->stats.n_error++;
		w->stats.prompt_tokens += (uint64_t)a.prompt_tokens;
		w->stats.generated_tokens += (uint64_t)a.completion_tokens;
		pthread_mutex_unlock(&w->mu);
		srv_job_unref(j);
	}
	return NULL;
}

enum toast_status srv_worker_start(struct srv_worker *w, struct toast_error *err)
{
	int e = pthread_create(&w->th, NULL, worker_main, w);
	if (e)
		return toast_err_set(err, TOAST_ERR_IO, "cannot start the worker thread: %s", strerror(e));
	w->started = true;
	return TOAST_OK;
}

void srv_worker_stop(struct srv_worker *w)
{
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

void srv_worker_join(struct srv_worker *w)
{
	if (w->started)
		pthread_join(w->th, NULL);
	w->started = false;
}

/* ---- audit ---- */

static bool audit_str(struct toast_buf *b, const char *key, const char *s, size_t n)
{
	return toast_buf_printf(b, ",\"%s\":\"", key) && toast_buf_json_escape(b, s, n) && toast_buf_puts(b, "\"");
}

void srv_audit_write(const struct srv_audit *a)
{
	char ts[32];
	toast_log_time(ts);
	struct toast_buf b;
	toast_buf_init(&b);
	bool ok = toast_buf_printf(&b, "{\"time\":\"%s\",\"event\":\"request\"", ts) &&
		  audit_str(&b, "id", a->id ? a->id : "", a->id ? strlen(a->id) : 0) &&
		  toast_buf_printf(&b, ",\"type\":\"%s\",\"via\":\"%s\",\"uid\":%ld,\"outcome\":\"%s\"",
				   a->type ? a->type : "unknown", a->via, a->uid, a->outcome);
	if (ok && a->error)
		ok = toast_buf_printf(&b, ",\"error\":\"%s\"", a->error);
	if (ok && a->finish_reason)
		ok = toast_buf_printf(&b, ",\"finish_reason\":\"%s\"", a->finish_reason);
	ok = ok && toast_buf_printf(&b,
				    ",\"prompt_tokens\":%d,\"cached_tokens\":%d,\"cache\":\"%s\",\"completion_tokens\":%d,"
				    "\"queue_ms\":%.3f,\"ttft_ms\":%.3f,\"tokens_per_s\":%.2f,\"total_ms\":%.3f",
				    a->prompt_tokens, a->cached_tokens, a->cached_tokens > 0 ? "hit" : "miss",
				    a->completion_tokens, a->queue_ms, a->ttft_ms, a->tokens_per_s, a->total_ms);
	if (ok && a->req && a->req->n_msgs) {
		ok = toast_buf_puts(&b, ",\"messages\":[");
		for (int i = 0; ok && i < a->req->n_msgs; i++) {
			const struct toast_chat_msg *m = &a->req->msgs[i];
			ok = toast_buf_puts(&b, i ? ",{\"role\":\"" : "{\"role\":\"") && toast_buf_puts(&b, m->role) &&
			     toast_buf_puts(&b, "\"") && audit_str(&b, "content", m->content, strlen(m->content)) &&
			     toast_buf_puts(&b, "}");
		}
		ok = ok && toast_buf_puts(&b, "]");
	}
	if (ok && a->text)
		ok = audit_str(&b, "text", a->text, a->text_len);
	if (ok && toast_buf_puts(&b, "}"))
		toast_log_line(b.data);
	toast_buf_deinit(&b);
}
