/*
 * srv.h - daemon internals shared by the loop (loop.c, http.c) and the worker (worker.c).
 *
 * A job is one request handed from the loop to the worker. The loop creates it, the worker
 * runs it; both hold a reference. The request part is immutable once queued; the result part
 * is written by the worker and taken by the loop under srv_worker.out_mu. The loop never calls
 * the engine; the worker never touches a socket.
 */
#ifndef TOAST_SERVER_SRV_H
#define TOAST_SERVER_SRV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "proto/proto.h"
#include "server/server.h"
#include "util/buf.h"

enum srv_cancel { SRV_RUN = 0, SRV_CANCEL_GONE, SRV_CANCEL_SHUTDOWN };

struct srv_job {
	atomic_int refs;
	atomic_int cancel;            /* enum srv_cancel, set by the loop; the worker stops at the next token */
	struct toast_proto_req req;   /* immutable once queued */
	const char *via;              /* "unix" or "http" */
	long uid;                     /* the peer's uid (SO_PEERCRED), -1 when unknown */
	double t_arrive;              /* toast_now() when the request was complete */
	/* results, under srv_worker.out_mu */
	struct toast_buf text;        /* generated text the loop has not taken yet */
	bool finished;
	enum toast_proto_code code;   /* once finished: OK or the error */
	char msg[512];
	struct toast_proto_done done; /* once finished OK (chat); done.text unused */
	char *raw;                    /* once finished OK (tokenize): the tokens as a JSON array */
};

struct srv_job *srv_job_new(const char *via, long uid);
void srv_job_unref(struct srv_job *j);

/* Counters the worker keeps; cache is a copy of the session cache's (zero without one). */
struct srv_stats {
	uint64_t n_ok, n_error, n_cancelled;
	uint64_t prompt_tokens, generated_tokens;
	uint64_t cache_hits, cache_misses, cache_tokens_reused;
	struct toast_cache_stats cache;
	bool busy;  /* a request is running */
	int queued; /* requests waiting */
};

struct srv_worker {
	pthread_t th;
	bool started;
	pthread_mutex_t mu; /* the queue, stop, stats */
	pthread_cond_t cv;
	struct srv_job **q; /* ring [q_cap] */
	int q_cap, q_head, q_len;
	bool stop;
	struct srv_stats stats;
	pthread_mutex_t out_mu; /* results of every job */
	int wake_fd;            /* eventfd the loop polls */
	atomic_bool wake_pending;
	struct toast_engine *e;
	struct toast_session *sess;
	struct toast_cache *cache; /* NULL: every request starts from an empty session */
	const struct toast_tokenizer *tok;
	bool debug;
};

enum toast_status srv_worker_init(struct srv_worker *w, struct toast_engine *e, int n_ctx, int queue_depth,
				  bool debug, struct toast_error *err);
/* Give the worker a session cache (before it starts). */
enum toast_status srv_worker_cache(struct srv_worker *w, const struct toast_cache_opts *o, struct toast_error *err);
void srv_worker_deinit(struct srv_worker *w);
enum toast_status srv_worker_start(struct srv_worker *w, struct toast_error *err);
/* Queue j (taking a reference). TOAST_ERR_BUSY when the queue is full or the worker stops. */
enum toast_status srv_worker_submit(struct srv_worker *w, struct srv_job *j);
/* Refuse new jobs, finish queued ones with a `shutdown` error, let the thread exit; join it. */
void srv_worker_stop(struct srv_worker *w);
void srv_worker_join(struct srv_worker *w);
struct srv_stats srv_worker_stats(struct srv_worker *w);

/* One audit record: a JSON line in the log. */
struct srv_audit {
	const char *id, *type, *via, *outcome, *error, *finish_reason;
	long uid;
	int prompt_tokens, cached_tokens, completion_tokens;
	double queue_ms, ttft_ms, tokens_per_s, total_ms;
	const struct toast_proto_req *req; /* with --debug: the messages */
	const char *text;                  /* with --debug: the answer */
	size_t text_len;
};
void srv_audit_write(const struct srv_audit *a);

/* ---- HTTP (http.c): parsing a request head, and OpenAI-shaped replies -------------------- */

#define SRV_HTTP_MAX_HEAD (16u << 10)

struct srv_http_head {
	char method[8];
	char path[128];
	size_t head_bytes;     /* bytes of the request line and headers, with the blank line */
	size_t content_length;
	bool has_length, chunked, expect_continue, json, host_ok;
};

/* 1: a complete head; 0: more bytes needed; -1: bad (*status and *why for the reply). */
int srv_http_parse_head(const char *buf, size_t len, struct srv_http_head *h, int *status, const char **why);
int srv_http_status_of(enum toast_proto_code code);
bool srv_http_error(struct toast_buf *out, int status, enum toast_proto_code code, const char *msg);
bool srv_http_json(struct toast_buf *out, int status, const char *body, size_t len);
bool srv_http_continue(struct toast_buf *out);
bool srv_http_models(struct toast_buf *out, const char *model, long created);
bool srv_http_sse_start(struct toast_buf *out, const char *id, const char *model, long created);
bool srv_http_sse_delta(struct toast_buf *out, const char *id, const char *model, long created, const char *text,
			size_t len);
bool srv_http_sse_end(struct toast_buf *out, const char *id, const char *model, long created,
		      const struct toast_proto_done *d);
bool srv_http_sse_error(struct toast_buf *out, enum toast_proto_code code, const char *msg);
bool srv_http_completion(struct toast_buf *out, const char *id, const char *model, long created, const char *text,
			 size_t len, const struct toast_proto_done *d);
/* The OpenAI finish_reason for ours ("context" is "length" there). */
const char *srv_http_finish(const char *ours);

#endif
