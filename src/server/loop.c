/*
 * loop.c - the daemon's loop thread: accepts connections on the Unix socket (and the loopback
 * HTTP port), reads requests, answers status and protocol errors itself, hands chat and
 * tokenize requests to the worker, and streams the worker's results back. Socket I/O only.
 *
 * Invariants: every fd is non-blocking and polled; a connection has at most one request in
 * flight (later lines wait in its input buffer, unread past one line); input is bounded by
 * TOAST_PROTO_MAX_LINE (+ SRV_HTTP_MAX_HEAD), output owed to a client by SRV_MAX_OUT (beyond
 * it the client counts as gone), connections by max_clients (beyond it: a `busy` error and a
 * close), queued requests by queue_depth (beyond it: `busy`). A client that closes its socket
 * cancels its request; one that only half-closes (shutdown SHUT_WR) still gets its answers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/srv.h"
#include "util/log.h"
#include "util/timeutil.h"

#define SRV_MAX_OUT (32u << 20)
#define SRV_READ_CHUNK 65536
#define SRV_STOP_GRACE 2.0  /* seconds to deliver what clients are owed when stopping */
#define SRV_LINGER 1.0      /* seconds an HTTP connection may take to close after its reply */

struct srv_conn {
	int fd;
	bool http;
	long uid;
	struct toast_buf in, out;
	size_t scan;            /* line protocol: in[0, scan) holds no newline */
	size_t out_off;         /* out[0, out_off) is written */
	struct srv_job *job;    /* the request in flight */
	bool eof;               /* the peer sends no more */
	bool closing;           /* close once out is written (and job is done) */
	bool dead;
	bool http_sse;          /* the event-stream head is out */
	bool http_continued;    /* "100 Continue" is out */
	bool shut;              /* HTTP: our side is shut down, draining the peer until EOF */
	double linger_until;
};

struct toast_server {
	struct toast_server_opts o;
	struct toast_engine *e;
	struct toast_model_info info;
	struct srv_worker w;
	bool worker_ok;
	char model_name[128];
	int unix_fd, http_fd, sig_fd, wake_fd;
	bool unlinked;
	char http_bound[80];
	struct srv_conn **conns; /* [max_clients], the first n_conns in use */
	int n_conns;
	double t_start;
	long created;
	bool stopping;
	double stop_deadline, accept_pause_until;
	uint64_t n_rejected, n_http_ids;
	int n_ctx;
	FILE *log;
};

static void conn_process(struct toast_server *s, struct srv_conn *c);

/* ---- connections ---- */

static void conn_close(struct toast_server *s, struct srv_conn *c)
{
	(void)s;
	if (c->dead)
		return;
	if (c->job) {
		int run = SRV_RUN;
		atomic_compare_exchange_strong(&c->job->cancel, &run, SRV_CANCEL_GONE);
		srv_job_unref(c->job);
		c->job = NULL;
	}
	close(c->fd);
	c->fd = -1;
	c->dead = true;
	toast_buf_deinit(&c->in);
	toast_buf_deinit(&c->out);
}

static void conn_flush(struct toast_server *s, struct srv_conn *c)
{
	while (c->out_off < c->out.len) {
		ssize_t r = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
		if (r > 0) {
			c->out_off += (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		conn_close(s, c); /* EPIPE, ECONNRESET: the client left */
		return;
	}
	if (c->out_off == c->out.len) {
		c->out.len = c->out_off = 0;
	} else if (c->out_off > c->out.len / 2) {
		toast_buf_consume(&c->out, c->out_off);
		c->out_off = 0;
	}
}

/* After any change: write what is owed, and close when the connection is finished. */
static void conn_settle(struct toast_server *s, struct srv_conn *c)
{
	if (c->dead)
		return;
	conn_flush(s, c);
	if (c->dead)
		return;
	if (c->out.len - c->out_off > SRV_MAX_OUT) {
		TOAST_WARN("a client does not read its answer (%zu bytes owed): dropping it", c->out.len - c->out_off);
		conn_close(s, c);
		return;
	}
	if (!c->closing || c->job || c->out.len > c->out_off)
		return;
	if (c->http && !c->shut) {
		/* closing with unread input would reset the connection and could lose the reply */
		shutdown(c->fd, SHUT_WR);
		c->shut = true;
		c->linger_until = toast_now() + SRV_LINGER;
	} else if (!c->http) {
		conn_close(s, c);
	}
}

static void conn_audit_reject(struct srv_conn *c, const char *id, const char *type, enum toast_proto_code code)
{
	struct srv_audit a = {.id = id, .type = type, .via = c->http ? "http" : "unix", .uid = c->uid,
			      .outcome = "error", .error = toast_proto_code_name(code)};
	srv_audit_write(&a);
}

/* Answer a request the worker never sees with an error event. */
static void conn_reject(struct toast_server *s, struct srv_conn *c, const char *id, const char *type,
			enum toast_proto_code code, const char *msg)
{
	s->n_rejected++;
	conn_audit_reject(c, id, type, code);
	if (c->http) {
		srv_http_error(&c->out, srv_http_status_of(code), code, msg);
		c->closing = true;
	} else if (!toast_proto_error_write(&c->out, id, code, msg)) {
		c->closing = true;
	}
}

static const char *req_type_name(enum toast_proto_type t)
{
	return t == TOAST_REQ_STATUS ? "status" : t == TOAST_REQ_TOKENIZE ? "tokenize" : "chat";
}

/* Hand req (moved into a job) to the worker. */
static void conn_submit(struct toast_server *s, struct srv_conn *c, struct toast_proto_req *req)
{
	struct srv_job *j = srv_job_new(c->http ? "http" : "unix", c->uid);
	if (!j) {
		conn_reject(s, c, req->id, req_type_name(req->type), TOAST_PROTO_INTERNAL, "out of memory");
		toast_proto_req_deinit(req);
		return;
	}
	j->req = *req;
	memset(req, 0, sizeof(*req));
	if (s->stopping) {
		conn_reject(s, c, j->req.id, req_type_name(j->req.type), TOAST_PROTO_SHUTDOWN, "the daemon is stopping");
	} else if (srv_worker_submit(&s->w, j) != TOAST_OK) {
		char msg[128];
		snprintf(msg, sizeof(msg), "busy: %d requests are already waiting (--queue-depth)", s->w.q_cap);
		conn_reject(s, c, j->req.id, req_type_name(j->req.type), TOAST_PROTO_BUSY, msg);
	} else {
		c->job = j;
		return;
	}
	srv_job_unref(j);
}

/* ---- status ---- */

static size_t srv_rss_bytes(void)
{
	long pages = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "re");
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static bool srv_status_json(struct toast_server *s, struct toast_buf *b)
{
	struct srv_stats st = srv_worker_stats(&s->w);
	size_t session_bytes = s->info.state_bytes_fixed + s->info.kv_bytes_per_tok * (size_t)s->n_ctx;
	bool ok = toast_buf_printf(b, "{\"protocol\":%d,\"version\":\"%s\",\"pid\":%ld,\"model\":\"", TOAST_PROTO_VERSION,
				   TOAST_VERSION, (long)getpid()) &&
		  toast_buf_json_escape(b, s->o.model_dir, strlen(s->o.model_dir)) &&
		  toast_buf_puts(b, "\",\"model_name\":\"") &&
		  toast_buf_json_escape(b, s->model_name, strlen(s->model_name)) && toast_buf_puts(b, "\",\"socket\":\"") &&
		  toast_buf_json_escape(b, s->o.socket_path, strlen(s->o.socket_path)) &&
		  toast_buf_printf(b, "\",\"http\":%s%s%s", s->http_fd >= 0 ? "\"" : "", s->http_fd >= 0 ? s->http_bound : "null",
				   s->http_fd >= 0 ? "\"" : "");
	ok = ok && toast_buf_printf(b,
				    ",\"arch\":\"%s\",\"backend\":\"%s\",\"kv_cache\":\"%s\",\"n_ctx\":%d,\"uptime_s\":%.1f,\"started\":%ld,"
				    "\"requests\":{\"ok\":%llu,\"error\":%llu,\"cancelled\":%llu,\"rejected\":%llu,"
				    "\"running\":%d,\"queued\":%d},\"tokens\":{\"prompt\":%llu,\"generated\":%llu},"
				    "\"connections\":{\"open\":%d,\"max\":%d},\"queue_depth\":%d,\"max_line_bytes\":%u,"
				    "\"memory\":{\"rss_bytes\":%zu,\"weight_bytes\":%zu,\"session_bytes\":%zu},"
				    "\"cache\":{\"enabled\":%s,\"where\":\"%s\",\"hits\":%llu,\"misses\":%llu,"
				    "\"tokens_reused\":%llu,\"bytes_held\":%zu,\"budget_bytes\":%zu,\"snapshots\":%d,"
				    "\"evictions\":%llu,\"replaced\":%llu,\"rejected\":%llu,\"files\":%d,\"file_bytes\":%zu,"
				    "\"dir_budget_bytes\":%zu,\"dir\":",
				    s->info.arch, s->info.backend, s->info.kv_cache, s->n_ctx, toast_now() - s->t_start, s->created,
				    (unsigned long long)st.n_ok, (unsigned long long)st.n_error,
				    (unsigned long long)st.n_cancelled, (unsigned long long)s->n_rejected, st.busy ? 1 : 0,
				    st.queued, (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens,
				    s->n_conns, s->o.max_clients, s->o.queue_depth, TOAST_PROTO_MAX_LINE, srv_rss_bytes(),
				    s->info.weight_bytes, session_bytes, s->o.cache_off ? "false" : "true",
				    st.cache.device ? "device" : "host", (unsigned long long)st.cache_hits,
				    (unsigned long long)st.cache_misses, (unsigned long long)st.cache_tokens_reused,
				    st.cache.bytes_held, st.cache.budget_bytes, st.cache.entries,
				    (unsigned long long)st.cache.evictions, (unsigned long long)st.cache.replaced,
				    (unsigned long long)st.cache.rejected, st.cache.files, st.cache.file_bytes,
				    st.cache.dir_budget_bytes);
	const char *dir = s->o.cache_off ? NULL : s->o.cache.dir;
	ok = ok && (dir ? toast_buf_puts(b, "\"") && toast_buf_json_escape(b, dir, strlen(dir)) && toast_buf_puts(b, "\"}}")
			: toast_buf_puts(b, "null}}"));
	return ok;
}

/* ---- the line protocol ---- */

static void line_handle(struct toast_server *s, struct srv_conn *c, const char *line, size_t len)
{
	struct toast_proto_req req;
	struct toast_proto_fail f = {0};
	if (!toast_proto_req_parse(line, len, &req, &f)) {
		conn_reject(s, c, req.id, NULL, f.code, f.msg);
	} else if (req.type == TOAST_REQ_STATUS) {
		struct toast_buf b;
		toast_buf_init(&b);
		if (srv_status_json(s, &b))
			toast_proto_done_raw_write(&c->out, req.id, "status", b.data);
		else
			toast_proto_error_write(&c->out, req.id, TOAST_PROTO_INTERNAL, "out of memory");
		toast_buf_deinit(&b);
		struct srv_audit a = {.id = req.id, .type = "status", .via = "unix", .uid = c->uid, .outcome = "ok"};
		srv_audit_write(&a);
	} else {
		conn_submit(s, c, &req);
	}
	toast_proto_req_deinit(&req);
}

static bool line_blank(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != ' ' && p[i] != '\t')
			return false;
	return true;
}

static void line_process(struct toast_server *s, struct srv_conn *c)
{
	if (s->stopping && !c->job)
		c->closing = true;
	while (!c->job && !c->closing) {
		size_t len = 0;
		int rc = toast_proto_line(&c->in, &c->scan, TOAST_PROTO_MAX_LINE, &len);
		if (rc == 0)
			break;
		if (rc < 0) {
			char msg[96];
			snprintf(msg, sizeof(msg), "a request line is longer than %u bytes", TOAST_PROTO_MAX_LINE);
			conn_reject(s, c, NULL, NULL, TOAST_PROTO_TOO_LARGE, msg);
			c->closing = true;
			break;
		}
		size_t used = c->scan;
		c->scan = 0;
		if (!line_blank(c->in.data, len))
			line_handle(s, c, c->in.data, len);
		toast_buf_consume(&c->in, used);
	}
	if (c->eof && !c->job && !c->closing) {
		if (c->in.len && !line_blank(c->in.data, c->in.len))
			conn_reject(s, c, NULL, NULL, TOAST_PROTO_BAD_REQUEST,
				    "incomplete request: the input ended before a newline");
		c->closing = true;
	}
}

static void line_emit(struct srv_conn *c, struct srv_job *j, struct toast_buf *text, bool fin)
{
	bool ok = true;
	if (text->len && j->req.p.stream)
		ok = toast_proto_delta_write(&c->out, j->req.id, text->data, text->len);
	if (!fin)
		;
	else if (j->code != TOAST_PROTO_OK)
		ok = toast_proto_error_write(&c->out, j->req.id, j->code, j->msg);
	else if (j->raw)
		ok = toast_proto_done_raw_write(&c->out, j->req.id, "tokens", j->raw);
	else {
		struct toast_proto_done d = j->done;
		if (!j->req.p.stream) {
			d.text = text->data ? text->data : "";
			d.text_len = text->len;
		}
		ok = toast_proto_done_write(&c->out, j->req.id, &d);
	}
	if (!ok)
		c->closing = true; /* out of memory: the client sees the stream end without `done` */
}

/* ---- HTTP ---- */

static void http_reject(struct toast_server *s, struct srv_conn *c, int status, enum toast_proto_code code,
			const char *msg)
{
	s->n_rejected++;
	conn_audit_reject(c, NULL, "http", code ? code : TOAST_PROTO_BAD_REQUEST);
	srv_http_error(&c->out, status, code, msg);
	c->closing = true;
}

static void http_process(struct toast_server *s, struct srv_conn *c)
{
	if (c->job || c->closing)
		return;
	if (s->stopping) {
		http_reject(s, c, 503, TOAST_PROTO_SHUTDOWN, "the daemon is stopping");
		return;
	}
	struct srv_http_head h;
	int status = 400;
	const char *why = "";
	int rc = srv_http_parse_head(c->in.data ? c->in.data : "", c->in.len, &h, &status, &why);
	if (rc == 0) {
		c->closing = c->eof;
		return;
	}
	if (rc < 0)
		return http_reject(s, c, status, status == 413 ? TOAST_PROTO_TOO_LARGE : TOAST_PROTO_BAD_REQUEST, why);
	if (!h.host_ok)
		return http_reject(s, c, 403, TOAST_PROTO_BAD_REQUEST, "the Host header is not a loopback name");
	bool is_get = strcmp(h.method, "GET") == 0, is_post = strcmp(h.method, "POST") == 0;
	if (strcmp(h.path, "/v1/models") == 0) {
		if (!is_get)
			return http_reject(s, c, 405, TOAST_PROTO_BAD_REQUEST, "GET /v1/models");
		srv_http_models(&c->out, s->model_name, s->created);
		c->closing = true;
		return;
	}
	if (strcmp(h.path, "/v1/chat/completions") != 0)
		return http_reject(s, c, 404, TOAST_PROTO_OK, "no such path (POST /v1/chat/completions, GET /v1/models)");
	if (!is_post)
		return http_reject(s, c, 405, TOAST_PROTO_BAD_REQUEST, "POST /v1/chat/completions");
	if (!h.has_length)
		return http_reject(s, c, 411, TOAST_PROTO_BAD_REQUEST, "Content-Length is required");
	if (h.content_length > TOAST_PROTO_MAX_LINE)
		return http_reject(s, c, 413, TOAST_PROTO_TOO_LARGE, "the request body is too large");
	if (!h.json)
		return http_reject(s, c, 415, TOAST_PROTO_BAD_REQUEST, "Content-Type must be application/json");
	if (c->in.len < h.head_bytes + h.content_length) {
		if (h.expect_continue && !c->http_continued) {
			srv_http_continue(&c->out);
			c->http_continued = true;
		}
		c->closing = c->eof;
		return;
	}
	struct toast_proto_req req;
	memset(&req, 0, sizeof(req));
	toast_proto_params_init(&req.p);
	req.p.stream = false; /* OpenAI's default */
	req.type = TOAST_REQ_CHAT;
	snprintf(req.id, sizeof(req.id), "chatcmpl-%llu", (unsigned long long)++s->n_http_ids);
	json_error_t je;
	struct toast_proto_fail f = {0};
	req.root = json_loadb(c->in.data + h.head_bytes, h.content_length, JSON_REJECT_DUPLICATES, &je);
	json_t *n = json_object_get(req.root, "n");
	if (!json_is_object(req.root)) {
		snprintf(f.msg, sizeof(f.msg), "the body is not a JSON object: %s", req.root ? "" : je.text);
		http_reject(s, c, 400, TOAST_PROTO_BAD_REQUEST, f.msg);
	} else if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1)) {
		http_reject(s, c, 400, TOAST_PROTO_UNSUPPORTED, "only n = 1 is supported");
	} else if (!toast_proto_chat_parse(req.root, &req, &f)) {
		http_reject(s, c, srv_http_status_of(f.code), f.code, f.msg);
	} else {
		conn_submit(s, c, &req);
	}
	toast_proto_req_deinit(&req);
	if (!c->job)
		c->closing = true;
}

static void http_emit(struct toast_server *s, struct srv_conn *c, struct srv_job *j, struct toast_buf *text, bool fin)
{
	const char *id = j->req.id, *model = s->model_name;
	if (!j->req.p.stream) {
		if (fin && j->code == TOAST_PROTO_OK)
			srv_http_completion(&c->out, id, model, s->created, text->data ? text->data : "", text->len, &j->done);
		else if (fin)
			srv_http_error(&c->out, srv_http_status_of(j->code), j->code, j->msg);
		return;
	}
	if (!c->http_sse && (text->len || (fin && j->code == TOAST_PROTO_OK))) {
		srv_http_sse_start(&c->out, id, model, s->created);
		c->http_sse = true;
	}
	if (text->len)
		srv_http_sse_delta(&c->out, id, model, s->created, text->data, text->len);
	if (fin && j->code == TOAST_PROTO_OK)
		srv_http_sse_end(&c->out, id, model, s->created, &j->done);
	else if (fin && c->http_sse)
		srv_http_sse_error(&c->out, j->code, j->msg);
	else if (fin)
		srv_http_error(&c->out, srv_http_status_of(j->code), j->code, j->msg);
}

/* ---- the loop ---- */

static void conn_process(struct toast_server *s, struct srv_conn *c)
{
	if (c->http)
		http_process(s, c);
	else
		line_process(s, c);
	conn_settle(s, c);
}

/* Take what the worker produced for c's request. */
static void conn_drain(struct toast_server *s, struct srv_conn *c)
{
	struct srv_job *j = c->job;
	struct toast_buf text;
	toast_buf_init(&text);
	pthread_mutex_lock(&s->w.out_mu);
	bool fin = j->finished;
	if (j->req.p.stream || fin) {
		text = j->text;
		toast_buf_init(&j->text);
	}
	pthread_mutex_unlock(&s->w.out_mu);
	if (text.len || fin) {
		if (c->http)
			http_emit(s, c, j, &text, fin);
		else
			line_emit(c, j, &text, fin);
	}
	toast_buf_deinit(&text);
	if (fin) {
		srv_job_unref(j);
		c->job = NULL;
		if (c->http)
			c->closing = true;
		conn_process(s, c); /* the next request on this connection, if any */
	} else {
		conn_settle(s, c);
	}
}

static void conn_read(struct toast_server *s, struct srv_conn *c)
{
	size_t limit = c->http ? SRV_HTTP_MAX_HEAD + TOAST_PROTO_MAX_LINE : TOAST_PROTO_MAX_LINE + 2;
	char tmp[SRV_READ_CHUNK];
	while (!c->eof && (c->shut || c->in.len <= limit)) {
		ssize_t r = recv(c->fd, tmp, sizeof(tmp), 0);
		if (r > 0) {
			if (!c->shut && !toast_buf_append(&c->in, tmp, (size_t)r)) {
				conn_close(s, c);
				return;
			}
			continue;
		}
		if (r == 0) {
			c->eof = true;
		} else if (errno == EINTR) {
			continue;
		} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
			conn_close(s, c);
			return;
		}
		break;
	}
	if (c->shut && c->eof)
		conn_close(s, c);
}

static short conn_events(const struct srv_conn *c)
{
	short ev = c->out.len > c->out_off ? POLLOUT : 0;
	if (c->shut)
		return ev | POLLIN;
	if (!c->closing && !c->eof && !c->job)
		ev |= POLLIN;
	if (c->job && c->http)
		ev |= POLLRDHUP; /* a TCP peer that closes shows only as the end of its input */
	return ev;
}

static void conn_io(struct toast_server *s, struct srv_conn *c, short re)
{
	if (c->dead)
		return;
	if (re & (POLLERR | POLLNVAL | POLLHUP)) {
		conn_close(s, c); /* the peer closed: cancel what it asked for */
		return;
	}
	if ((re & POLLRDHUP) && c->job && c->http) {
		conn_close(s, c);
		return;
	}
	if (re & POLLIN) {
		conn_read(s, c);
		if (c->dead)
			return;
		if (!c->shut) {
			conn_process(s, c);
			return;
		}
	}
	conn_settle(s, c);
}

static void srv_accept(struct toast_server *s, int lfd, bool http)
{
	for (int k = 0; k < 64; k++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				TOAST_WARN("accept: %s: pausing for 100 ms", strerror(errno));
				s->accept_pause_until = toast_now() + 0.1;
			}
			return;
		}
		if (s->n_conns >= s->o.max_clients) {
			struct toast_buf b;
			toast_buf_init(&b);
			if (http)
				srv_http_error(&b, 503, TOAST_PROTO_BUSY, "busy: too many connections");
			else
				toast_proto_error_write(&b, NULL, TOAST_PROTO_BUSY, "busy: too many connections (--max-clients)");
			if (b.len && send(fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
				TOAST_DEBUG("busy reply: %s", strerror(errno));
			toast_buf_deinit(&b);
			close(fd);
			s->n_rejected++;
			continue;
		}
		struct srv_conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->http = http;
		c->uid = -1;
		struct ucred cr;
		socklen_t len = sizeof(cr);
		if (!http && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0)
			c->uid = (long)cr.uid;
		s->conns[s->n_conns++] = c;
	}
}

static void srv_reopen_log(struct toast_server *s)
{
	if (!s->o.log_path)
		return;
	int fd = open(s->o.log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;
	if (!f) {
		if (fd >= 0)
			close(fd);
		TOAST_WARN("SIGHUP: cannot reopen %s: %s", s->o.log_path, strerror(errno));
		return;
	}
	FILE *old = toast_log_set_file(f);
	if (old)
		fclose(old);
	s->log = f;
	TOAST_INFO("log reopened");
}

static void srv_begin_stop(struct toast_server *s, int sig)
{
	if (s->stopping)
		return;
	TOAST_INFO("%s: stopping: cancelling the running request, refusing new ones", strsignal(sig));
	s->stopping = true;
	s->stop_deadline = toast_now() + SRV_STOP_GRACE;
	if (s->unix_fd >= 0)
		close(s->unix_fd);
	if (s->http_fd >= 0)
		close(s->http_fd);
	s->unix_fd = s->http_fd = -1;
	if (unlink(s->o.socket_path) == 0)
		s->unlinked = true;
	srv_worker_stop(&s->w);
	for (int i = 0; i < s->n_conns; i++) {
		struct srv_conn *c = s->conns[i];
		if (c->job)
			atomic_store(&c->job->cancel, SRV_CANCEL_SHUTDOWN);
		else
			c->closing = true;
		conn_settle(s, c);
	}
}

static void srv_signals(struct toast_server *s)
{
	struct signalfd_siginfo si;
	while (read(s->sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGHUP)
			srv_reopen_log(s);
		else
			srv_begin_stop(s, (int)si.ssi_signo);
	}
}

static void srv_compact(struct toast_server *s)
{
	int k = 0;
	double now = toast_now();
	for (int i = 0; i < s->n_conns; i++) {
		struct srv_conn *c = s->conns[i];
		if (!c->dead && c->shut && (now > c->linger_until || s->stopping))
			conn_close(s, c);
		if (!c->dead && s->stopping && now > s->stop_deadline)
			conn_close(s, c);
		if (c->dead)
			free(c);
		else
			s->conns[k++] = c;
	}
	s->n_conns = k;
}

int toast_server_run(struct toast_server *s)
{
	struct toast_error err = {0};
	if (srv_worker_start(&s->w, &err) != TOAST_OK) {
		TOAST_ERROR("%s", err.msg);
		return 1;
	}
	TOAST_INFO("serving %s on %s%s%s (pid %ld)", s->o.model_dir, s->o.socket_path, s->http_fd >= 0 ? " and http://" : "",
		   s->http_fd >= 0 ? s->http_bound : "", (long)getpid());
	size_t cap = 4 + (size_t)s->o.max_clients;
	struct pollfd *pfd = calloc(cap, sizeof(*pfd));
	struct srv_conn **snap = calloc(cap, sizeof(*snap));
	if (!pfd || !snap) {
		TOAST_ERROR("out of memory");
		srv_begin_stop(s, SIGTERM);
	}
	while (pfd && snap) {
		srv_compact(s);
		double now = toast_now();
		if (s->stopping && (s->n_conns == 0 || now > s->stop_deadline))
			break;
		int n = 0, i_unix = -1, i_http = -1;
		pfd[n++] = (struct pollfd){s->sig_fd, POLLIN, 0};
		pfd[n++] = (struct pollfd){s->wake_fd, POLLIN, 0};
		bool accepting = !s->stopping && now >= s->accept_pause_until;
		if (accepting && s->unix_fd >= 0) {
			i_unix = n;
			pfd[n++] = (struct pollfd){s->unix_fd, POLLIN, 0};
		}
		if (accepting && s->http_fd >= 0) {
			i_http = n;
			pfd[n++] = (struct pollfd){s->http_fd, POLLIN, 0};
		}
		int base = n, nc = s->n_conns;
		bool timed = s->stopping || !accepting;
		for (int i = 0; i < nc; i++) {
			snap[i] = s->conns[i];
			pfd[n++] = (struct pollfd){snap[i]->fd, conn_events(snap[i]), 0};
			timed |= snap[i]->shut;
		}
		if (poll(pfd, (nfds_t)n, timed ? 100 : -1) < 0) {
			if (errno == EINTR)
				continue;
			TOAST_ERROR("poll: %s", strerror(errno));
			srv_begin_stop(s, SIGTERM);
			continue;
		}
		if (pfd[0].revents)
			srv_signals(s);
		if (pfd[1].revents) {
			/* read, then clear: a wake-up between the two then leaves the eventfd
			 * readable; the other order could leave wake_pending set with nothing
			 * to read, and no wake-up would ever come again */
			uint64_t v;
			while (read(s->wake_fd, &v, sizeof(v)) < 0 && errno == EINTR)
				;
			atomic_store(&s->w.wake_pending, false);
			for (int i = 0; i < s->n_conns; i++)
				if (!s->conns[i]->dead && s->conns[i]->job)
					conn_drain(s, s->conns[i]);
		}
		for (int i = 0; i < nc; i++)
			if (pfd[base + i].revents)
				conn_io(s, snap[i], pfd[base + i].revents);
		if (i_unix >= 0 && pfd[i_unix].revents && s->unix_fd >= 0)
			srv_accept(s, s->unix_fd, false);
		if (i_http >= 0 && pfd[i_http].revents && s->http_fd >= 0)
			srv_accept(s, s->http_fd, true);
	}
	if (!s->stopping)
		srv_begin_stop(s, SIGTERM);
	for (int i = 0; i < s->n_conns; i++)
		conn_close(s, s->conns[i]);
	srv_compact(s);
	srv_worker_join(&s->w);
	free(pfd);
	free(snap);
	TOAST_INFO("stopped");
	return 0;
}

/* ---- lifecycle ---- */

const char *toast_server_http_addr(const struct toast_server *s)
{
	return s->http_fd >= 0 ? s->http_bound : NULL;
}

enum toast_status toast_server_new(const struct toast_server_opts *o, struct toast_engine *e,
				   struct toast_server **out, struct toast_error *err)
{
	*out = NULL;
	struct toast_server *s = calloc(1, sizeof(*s));
	if (!s) {
		toast_engine_close(e);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	s->o = *o;
	if (s->o.max_clients <= 0)
		s->o.max_clients = TOAST_SERVER_MAX_CLIENTS;
	if (s->o.queue_depth <= 0)
		s->o.queue_depth = TOAST_SERVER_QUEUE_DEPTH;
	s->e = e;
	s->info = *toast_engine_info(e);
	s->unix_fd = s->http_fd = s->sig_fd = s->wake_fd = -1;
	s->t_start = toast_now();
	s->created = (long)time(NULL);
	const char *dir = o->model_dir;
	size_t dl = strlen(dir);
	while (dl > 1 && dir[dl - 1] == '/')
		dl--;
	const char *base = dir + dl;
	while (base > dir && base[-1] != '/')
		base--;
	snprintf(s->model_name, sizeof(s->model_name), "%.*s", (int)(dir + dl - base), base);

	sigset_t mask;
	toast_daemon_block_signals(&mask);

	int n_ctx = o->n_ctx ? o->n_ctx : s->info.n_ctx_train < TOAST_SERVER_CTX ? s->info.n_ctx_train : TOAST_SERVER_CTX;
	enum toast_status rc = srv_worker_init(&s->w, e, n_ctx, s->o.queue_depth, o->debug, err);
	if (rc == TOAST_OK) {
		s->worker_ok = true;
		s->n_ctx = toast_session_n_ctx(s->w.sess);
		s->conns = calloc((size_t)s->o.max_clients, sizeof(*s->conns));
		s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		s->sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
		s->w.wake_fd = s->wake_fd;
		if (!s->conns || s->wake_fd < 0 || s->sig_fd < 0)
			rc = toast_err_set(err, TOAST_ERR_IO, "cannot set up the loop: %s", strerror(errno));
	}
	if (rc == TOAST_OK && o->log_path) {
		s->o.log_path = NULL;
		int fd = open(o->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		s->log = fd >= 0 ? fdopen(fd, "a") : NULL;
		if (!s->log) {
			rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", o->log_path, strerror(errno));
			if (fd >= 0)
				close(fd);
		} else {
			s->o.log_path = o->log_path;
		}
	}
	if (rc == TOAST_OK && o->http_addr)
		rc = toast_daemon_listen_tcp(o->http_addr, &s->http_fd, s->http_bound, sizeof(s->http_bound), err);
	if (rc == TOAST_OK)
		rc = toast_daemon_listen_unix(o->socket_path, &s->unix_fd, err);
	if (rc != TOAST_OK) {
		toast_server_free(s);
		return rc;
	}
	toast_log_set_json(true);
	toast_log_set_level(o->debug ? TOAST_LOG_DEBUG : TOAST_LOG_INFO);
	if (s->log)
		toast_log_set_file(s->log);
	/* after the log is set: the cache reports the snapshot files it ignores there */
	rc = o->cache_off ? TOAST_OK : srv_worker_cache(&s->w, &o->cache, err);
	if (rc != TOAST_OK) {
		toast_server_free(s);
		return rc;
	}
	*out = s;
	return TOAST_OK;
}

void toast_server_free(struct toast_server *s)
{
	if (!s)
		return;
	for (int i = 0; s->conns && i < s->n_conns; i++) {
		conn_close(s, s->conns[i]);
		free(s->conns[i]);
	}
	srv_worker_join(&s->w);
	if (s->worker_ok)
		srv_worker_deinit(&s->w);
	if (s->unix_fd >= 0) {
		close(s->unix_fd);
		unlink(s->o.socket_path);
	}
	if (s->http_fd >= 0)
		close(s->http_fd);
	if (s->sig_fd >= 0)
		close(s->sig_fd);
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	if (s->log) {
		toast_log_set_file(NULL);
		fclose(s->log);
	}
	free(s->conns);
	toast_engine_close(s->e);
	free(s);
}
