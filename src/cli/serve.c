/*
 * serve.c - `toasted start MODEL`, `toasted stop`, `toasted status`.
 *
 * start: take the socket's lock, then fork (unless --foreground) BEFORE anything creates a
 * thread or a GPU context: neither survives a fork, so the daemon process itself loads the model
 * and opens its sockets, and only then tells the waiting parent through a pipe that it is ready
 * (or why it failed). The parent returns when the daemon serves. The load draws a progress bar
 * on the terminal; Ctrl-C on the parent (forwarded as SIGTERM) cancels a load in progress.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "proto/conn.h"
#include "server/server.h"
#include "util/buf.h"
#include "util/fs.h"
#include "util/timeutil.h"

#define START_USAGE                                                                                         \
	"usage: toasted start MODEL_DIR [--socket PATH] [--foreground] [--log FILE] [--debug]\n"            \
	"         [--http 127.0.0.1:PORT] [--ctx-size N] [--threads N] [--chunk N] [--backend cpu|cuda]\n"  \
	"         [--kv-cache default|q8] [--max-clients N] [--queue-depth N] [--cache-mb N] [--cache-device] [--cache-dir DIR]\n"      \
	"         [--cache-dir-mb N]\n"

/* The socket path: --socket (made absolute), else the default; false (said) when too long. */
static bool serve_socket(const char *opt, char *buf, size_t n)
{
	char cwd[PATH_MAX];
	int len = !opt ? (toast_proto_default_socket(buf, n) ? 1 : -1)
	      : opt[0] == '/' || !getcwd(cwd, sizeof(cwd)) ? snprintf(buf, n, "%s", opt)
							  : snprintf(buf, n, "%s/%s", cwd, opt);
	if (len > 0 && (size_t)len < n)
		return true;
	fprintf(stderr, "toasted: the socket path is longer than %zu bytes\n", n - 1);
	return false;
}

static bool serve_sock_arg(int argc, char **argv, int *i, const char **sock)
{
	const char *v = cli_optval(argc, argv, i, "--socket");
	if (v)
		*sock = v;
	return v != NULL;
}

/* ---- start ---- */

struct start_opts {
	const char *model, *sock, *log, *http, *backend, *cache_dir, *kv_cache;
	bool foreground, debug, cache_device;
	long n_ctx, threads, chunk, max_clients, queue_depth;
	long cache_mb, cache_dir_mb; /* -1: the default (sized from free memory / space); cache_mb 0: off */
};

struct progress {
	bool tty;
	double t_last;
	int shown;
};

/* Draw the load's progress (a terminal only, models of 256 MiB and more); cancel on a pending
 * SIGINT/SIGTERM (they are blocked: the loop will take them through a signalfd). */
static int serve_progress(void *ud, size_t done, size_t total)
{
	struct progress *p = ud;
	sigset_t pend;
	if (sigpending(&pend) == 0 && (sigismember(&pend, SIGINT) || sigismember(&pend, SIGTERM)))
		return 1;
	if (!p->tty || total < (256u << 20))
		return 0;
	double now = toast_now();
	if (done < total && now - p->t_last < 0.1)
		return 0;
	p->t_last = now;
	int pct = (int)(100.0 * (double)done / (double)total), w = pct * 40 / 100;
	fprintf(stderr, "\rtoasted: loading [%.*s%*s] %3d%% %.1f/%.1f GiB", w, "########################################",
		40 - w, "", pct, (double)done / (1 << 30), (double)total / (1 << 30));
	if (done >= total)
		fputc('\n', stderr);
	p->shown = 1;
	return 0;
}

/* Tell the parent (fd >= 0) or the terminal how the start went. */
static void start_report(int fd, int code, const char *msg)
{
	if (fd < 0) {
		if (code)
			fprintf(stderr, "toasted: %s\n", msg);
		return;
	}
	char buf[1024];
	int n = snprintf(buf, sizeof(buf), "%d %s\n", code, msg);
	if (n > 0 && write(fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1) < 0)
		perror("toasted: readiness pipe");
	close(fd);
}

/* The parent: wait for the daemon's word; forward Ctrl-C as SIGTERM (it cancels the load). */
static int start_wait(int fd, pid_t pid, const char *sock)
{
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
	struct toast_buf b;
	toast_buf_init(&b);
	for (;;) {
		struct pollfd p[2] = {{fd, POLLIN, 0}, {sfd, POLLIN, 0}};
		if (poll(p, sfd >= 0 ? 2 : 1, -1) < 0 && errno != EINTR)
			break;
		if (sfd >= 0 && p[1].revents) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) > 0)
				kill(pid, SIGTERM);
		}
		if (!p[0].revents)
			continue;
		char tmp[512];
		ssize_t r = read(fd, tmp, sizeof(tmp));
		if (r > 0 && b.len < 4096 && toast_buf_append(&b, tmp, (size_t)r))
			continue;
		if (r < 0 && errno == EINTR)
			continue;
		break;
	}
	close(fd);
	if (sfd >= 0)
		close(sfd);
	int code = 1;
	char *msg = NULL;
	if (b.len && (code = (int)strtol(b.data, &msg, 10)) >= 0 && msg && *msg == ' ') {
		msg++;
		msg[strcspn(msg, "\n")] = 0;
		if (code == 0)
			printf("toasted: %s\n", msg);
		else
			fprintf(stderr, "toasted: %s\n", msg);
	} else {
		int st = 0;
		waitpid(pid, &st, 0);
		if (WIFSIGNALED(st))
			fprintf(stderr, "toasted: the daemon was killed by %s while starting\n", strsignal(WTERMSIG(st)));
		else
			fprintf(stderr, "toasted: the daemon exited with status %d while starting\n", WEXITSTATUS(st));
		code = 1;
	}
	(void)sock;
	toast_buf_deinit(&b);
	return code;
}

static bool start_parse(int argc, char **argv, struct start_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->threads = 0;
	o->cache_mb = o->cache_dir_mb = -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v;
		if (strcmp(a, "--foreground") == 0)
			o->foreground = true;
		else if (strcmp(a, "--cache-device") == 0)
			o->cache_device = true;
		else if (strcmp(a, "--debug") == 0)
			o->debug = true;
		else if (serve_sock_arg(argc, argv, &i, &o->sock))
			;
		else if ((v = cli_optval(argc, argv, &i, "--log")))
			o->log = v;
		else if ((v = cli_optval(argc, argv, &i, "--http")))
			o->http = v;
		else if ((v = cli_optval(argc, argv, &i, "--backend")))
			o->backend = v;
		else if ((v = cli_optval(argc, argv, &i, "--kv-cache")))
			o->kv_cache = v;
		else if ((v = cli_optval(argc, argv, &i, "--ctx-size"))) {
			if (!cli_int(a, v, 0, INT_MAX, &o->n_ctx))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--threads"))) {
			if (!cli_int(a, v, 0, 1024, &o->threads))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--chunk"))) {
			if (!cli_int(a, v, 0, TOAST_MAX_CHUNK, &o->chunk))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--max-clients"))) {
			if (!cli_int(a, v, 1, 4096, &o->max_clients))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--queue-depth"))) {
			if (!cli_int(a, v, 1, 4096, &o->queue_depth))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--cache-mb"))) {
			if (!cli_int(a, v, 0, 1L << 30, &o->cache_mb))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--cache-dir-mb"))) {
			if (!cli_int(a, v, 1, 1L << 30, &o->cache_dir_mb))
				return false;
		} else if ((v = cli_optval(argc, argv, &i, "--cache-dir"))) {
			o->cache_dir = v;
		} else if (a[0] == '-' || o->model) {
			fprintf(stderr, "toasted start: unexpected argument \"%s\"\n", a);
			return false;
		} else {
			o->model = a;
		}
	}
	if (!o->model)
		fprintf(stderr, "toasted start: which model? (a model directory)\n");
	return o->model != NULL;
}

/* An absolute path for a file named on the command line (the daemon runs in /). */
static char *serve_abs(const char *p)
{
	if (p[0] == '/')
		return strdup(p);
	char cwd[PATH_MAX];
	struct toast_buf b;
	toast_buf_init(&b);
	if (getcwd(cwd, sizeof(cwd)))
		toast_buf_printf(&b, "%s/%s", cwd, p);
	return toast_buf_steal(&b);
}

/* The daemon's default log: $XDG_STATE_HOME/toasted/toasted.log (~/.local/state/...). */
static char *serve_default_log(void)
{
	char *p = toast_state_path("toasted/toasted.log");
	if (p)
		toast_mkdirs_for(p, 0700);
	return p;
}

int cli_start(int argc, char **argv)
{
	struct start_opts o;
	if (!start_parse(argc, argv, &o)) {
		fputs(START_USAGE, stderr);
		return 2;
	}
	char sock[108];
	if (!serve_socket(o.sock, sock, sizeof(sock)))
		return 2;
	char *log = o.log ? serve_abs(o.log) : o.foreground ? NULL : serve_default_log();
	char *model = realpath(o.model, NULL);
	char *cache_dir = o.cache_dir ? serve_abs(o.cache_dir) : NULL; /* the daemon runs in / */
	struct toast_error err = {0};
	int lock_fd = -1, ready_fd = -1, rc = 1;
	struct toast_engine *e = NULL;
	struct toast_server *srv = NULL;
	enum toast_status st = toast_daemon_prepare_dir(sock, &err);
	if (st == TOAST_OK)
		st = toast_daemon_lock(sock, &lock_fd, &err);
	if (st == TOAST_OK)
		st = toast_daemon_clear_stale(sock, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted: %s\n", err.msg);
		goto out;
	}
	toast_daemon_block_signals(NULL); /* in every thread from here on */
	if (!o.foreground) {
		int p[2];
		if (pipe2(p, O_CLOEXEC) != 0) {
			perror("toasted: pipe");
			goto out;
		}
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			perror("toasted: fork");
			close(p[0]);
			close(p[1]);
			goto out;
		}
		if (pid > 0) {
			close(p[1]);
			close(lock_fd); /* the child holds the lock now */
			lock_fd = -1;
			rc = start_wait(p[0], pid, sock);
			goto out;
		}
		close(p[0]);
		ready_fd = p[1];
		setsid();
	}
	struct progress prog = {.tty = isatty(2)};
	struct toast_engine_opts eo;
	toast_engine_opts_init(&eo);
	eo.backend = o.backend;
	eo.n_threads = (int)o.threads;
	eo.chunk = (int)o.chunk;
	eo.kv_cache = o.kv_cache;
	eo.progress = serve_progress;
	eo.progress_ud = &prog;
	st = toast_engine_open(model ? model : o.model, &eo, &e, &err);
	if (st == TOAST_OK) {
		struct toast_server_opts so = {
			.model_dir = model ? model : o.model,
			.socket_path = sock,
			.http_addr = o.http,
			.log_path = log,
			.n_ctx = (int)o.n_ctx,
			.max_clients = (int)o.max_clients,
			.queue_depth = (int)o.queue_depth,
			.debug = o.debug,
			.cache_off = o.cache_mb == 0,
			.cache = {
				.budget_bytes = o.cache_mb > 0 ? (size_t)o.cache_mb << 20 : 0,
				.device = o.cache_device,
				.dir = cache_dir,
				.dir_budget_bytes = o.cache_dir_mb > 0 ? (size_t)o.cache_dir_mb << 20 : 0,
			},
		};
		st = toast_server_new(&so, e, &srv, &err);
		e = NULL; /* the server owns it, also on failure */
	}
	if (st != TOAST_OK) {
		start_report(ready_fd, cli_status_exit(st) ? cli_status_exit(st) : 1, err.msg);
		ready_fd = -1;
		rc = cli_status_exit(st);
		goto out;
	}
	toast_daemon_write_pid(lock_fd, getpid());
	char msg[512];
	const char *http = toast_server_http_addr(srv);
	snprintf(msg, sizeof(msg), "serving %s on %s%s%s (pid %ld)", model ? model : o.model, sock,
		 http ? " and http://" : "", http ? http : "", (long)getpid());
	if (ready_fd >= 0) {
		if (chdir("/") != 0)
			perror("toasted: chdir /");
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
			if (null > 2)
				close(null);
		}
		start_report(ready_fd, 0, msg);
		ready_fd = -1;
	} else {
		fprintf(stderr, "toasted: %s; Ctrl-C stops it\n", msg);
	}
	rc = toast_server_run(srv);
out:
	toast_server_free(srv);
	toast_engine_close(e);
	if (ready_fd >= 0)
		start_report(ready_fd, 1, "the daemon failed to start");
	if (lock_fd >= 0) {
		toast_daemon_write_pid(lock_fd, 0);
		close(lock_fd);
	}
	free(model);
	free(log);
	free(cache_dir);
	return rc;
}

/* ---- stop ---- */

int cli_stop(int argc, char **argv)
{
	const char *sock_opt = NULL;
	long timeout = 30;
	for (int i = 1; i < argc; i++) {
		const char *v;
		if (serve_sock_arg(argc, argv, &i, &sock_opt))
			continue;
		if ((v = cli_optval(argc, argv, &i, "--timeout"))) {
			if (!cli_int("--timeout", v, 1, 3600, &timeout))
				return 2;
			continue;
		}
		fprintf(stderr, "usage: toasted stop [--socket PATH] [--timeout SECONDS]\n");
		return 2;
	}
	char sock[108];
	if (!serve_socket(sock_opt, sock, sizeof(sock)))
		return 2;
	pid_t pid = toast_daemon_running(sock);
	if (pid == 0) {
		fprintf(stderr, "toasted: no daemon is running on %s\n", sock);
		return 1;
	}
	if (pid < 0) {
		fprintf(stderr, "toasted: the daemon on %s is starting or stopping (no pid to signal yet)\n", sock);
		return 1;
	}
	if (kill(pid, SIGTERM) != 0) {
		fprintf(stderr, "toasted: cannot signal pid %ld: %s\n", (long)pid, strerror(errno));
		return 1;
	}
	for (double t0 = toast_now(); toast_now() - t0 < (double)timeout;) {
		if (toast_daemon_running(sock) == 0) { /* the lock released, not only the pid emptied */
			printf("toasted: stopped the daemon on %s (pid %ld)\n", sock, (long)pid);
			return 0;
		}
		usleep(20000);
	}
	fprintf(stderr, "toasted: pid %ld did not stop within %ld s\n", (long)pid, timeout);
	return 1;
}

/* ---- status ---- */

static const char *serve_bytes(double b, char *buf, size_t n)
{
	const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int i = 0;
	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
	return buf;
}

static long long serve_jint(json_t *o, const char *path)
{
	char key[64];
	snprintf(key, sizeof(key), "%s", path);
	char *dot = strchr(key, '.');
	if (dot) {
		*dot = 0;
		o = json_object_get(o, key);
		return serve_jint(o, dot + 1);
	}
	json_t *v = json_object_get(o, key);
	return json_is_number(v) ? (long long)json_number_value(v) : 0;
}

static void serve_print_status(json_t *s)
{
	char a[32], b[32], c[32];
	long up = (long)serve_jint(s, "uptime_s");
	const char *http = json_string_value(json_object_get(s, "http"));
	printf("toasted %s, pid %lld, up %ldh%02ldm%02lds, protocol %lld\n",
	       json_string_value(json_object_get(s, "version")), serve_jint(s, "pid"), up / 3600, up / 60 % 60, up % 60,
	       serve_jint(s, "protocol"));
	printf("model     %s (%s on %s), context %lld tokens\n", json_string_value(json_object_get(s, "model")),
	       json_string_value(json_object_get(s, "arch")), json_string_value(json_object_get(s, "backend")),
	       serve_jint(s, "n_ctx"));
	printf("socket    %s%s%s\n", json_string_value(json_object_get(s, "socket")), http ? ", http://" : "",
	       http ? http : "");
	printf("requests  %lld ok, %lld failed, %lld cancelled, %lld rejected; %lld running, %lld queued\n",
	       serve_jint(s, "requests.ok"), serve_jint(s, "requests.error"), serve_jint(s, "requests.cancelled"),
	       serve_jint(s, "requests.rejected"), serve_jint(s, "requests.running"), serve_jint(s, "requests.queued"));
	printf("tokens    %lld prompt, %lld generated\n", serve_jint(s, "tokens.prompt"), serve_jint(s, "tokens.generated"));
	printf("memory    %s resident; weights %s, session %s\n",
	       serve_bytes((double)serve_jint(s, "memory.rss_bytes"), a, sizeof(a)),
	       serve_bytes((double)serve_jint(s, "memory.weight_bytes"), b, sizeof(b)),
	       serve_bytes((double)serve_jint(s, "memory.session_bytes"), c, sizeof(c)));
	json_t *cache = json_object_get(s, "cache");
	const char *dir = json_string_value(json_object_get(cache, "dir"));
	printf("cache     %s: %lld hits, %lld misses, %lld tokens reused\n", json_is_true(json_object_get(cache, "enabled")) ? "on" : "off",
	       serve_jint(s, "cache.hits"), serve_jint(s, "cache.misses"), serve_jint(s, "cache.tokens_reused"));
	if (!json_is_true(json_object_get(cache, "enabled")))
		return;
	printf("          %lld snapshots, %s held of %s (%s memory), %lld evictions, %lld replaced by their next turn\n",
	       serve_jint(s, "cache.snapshots"), serve_bytes((double)serve_jint(s, "cache.bytes_held"), a, sizeof(a)),
	       serve_bytes((double)serve_jint(s, "cache.budget_bytes"), b, sizeof(b)),
	       json_string_value(json_object_get(cache, "where")), serve_jint(s, "cache.evictions"),
	       serve_jint(s, "cache.replaced"));
	if (dir)
		printf("          %s: %lld files, %s of %s; %lld rejected\n", dir, serve_jint(s, "cache.files"),
		       serve_bytes((double)serve_jint(s, "cache.file_bytes"), a, sizeof(a)),
		       serve_bytes((double)serve_jint(s, "cache.dir_budget_bytes"), b, sizeof(b)), serve_jint(s, "cache.rejected"));
}

int cli_status(int argc, char **argv)
{
	const char *sock_opt = NULL;
	bool as_json = false;
	for (int i = 1; i < argc; i++) {
		if (serve_sock_arg(argc, argv, &i, &sock_opt))
			continue;
		if (strcmp(argv[i], "--json") == 0) {
			as_json = true;
			continue;
		}
		fprintf(stderr, "usage: toasted status [--socket PATH] [--json]\n");
		return 2;
	}
	char sock[108];
	if (!serve_socket(sock_opt, sock, sizeof(sock)))
		return 2;
	struct toast_conn c;
	struct toast_error err = {0};
	struct toast_proto_event ev = {0};
	struct toast_buf req;
	toast_buf_init(&req);
	bool absent = false;
	int rc = 1;
	if (toast_conn_open(&c, sock, &absent, &err) != TOAST_OK) {
		if (absent)
			fprintf(stderr, "toasted: no daemon is running on %s (start one: toasted start MODEL_DIR)\n", sock);
		else
			fprintf(stderr, "toasted: %s\n", err.msg);
		return 1;
	}
	if (!toast_proto_simple_write(&req, "status", TOAST_REQ_STATUS, NULL))
		toast_err_set(&err, TOAST_ERR_NOMEM, "out of memory");
	else if (toast_conn_send(&c, req.data, req.len, &err) == TOAST_OK &&
		 toast_conn_event(&c, &ev, &err) == TOAST_OK) {
		json_t *s = ev.kind == TOAST_EV_DONE ? json_object_get(ev.done, "status") : NULL;
		if (ev.kind == TOAST_EV_ERROR)
			toast_err_set(&err, TOAST_ERR_IO, "%s: %s", ev.code, ev.text);
		else if (!json_is_object(s))
			toast_err_set(&err, TOAST_ERR_FORMAT, "the daemon's status reply has no status");
		else if (as_json) {
			char *txt = json_dumps(s, JSON_COMPACT);
			if (txt)
				puts(txt);
			free(txt);
			rc = 0;
		} else {
			serve_print_status(s);
			rc = 0;
		}
	}
	if (rc)
		fprintf(stderr, "toasted: %s\n", err.msg);
	toast_proto_event_deinit(&ev);
	toast_buf_deinit(&req);
	toast_conn_close(&c);
	return rc;
}
