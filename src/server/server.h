/*
 * server.h - the daemon: serve a loaded engine on a Unix socket (and optionally OpenAI-compatible
 * HTTP on loopback), and the process plumbing around it (socket directory, lock/pid file, stale
 * socket detection, listening sockets). The `toasted start/stop/status` commands use this.
 *
 * Threads: toast_server_run() is the loop thread (socket I/O only); it starts one worker thread
 * that owns the engine. SIGTERM, SIGINT and SIGHUP must be blocked in every thread (block them
 * before toast_engine_open creates any thread): the loop takes them through a signalfd.
 */
#ifndef TOAST_SERVER_SERVER_H
#define TOAST_SERVER_SERVER_H

#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "toasted.h"

#define TOAST_SERVER_MAX_CLIENTS 64  /* default open connections (Unix + HTTP) */
#define TOAST_SERVER_QUEUE_DEPTH 16  /* default requests waiting for the worker */
#define TOAST_SERVER_CTX 32768       /* default context: min(this, the model's) */

struct toast_server_opts {
	const char *model_dir;   /* reported by status; its last component names the model over HTTP */
	const char *socket_path; /* absolute path of the Unix socket */
	const char *http_addr;   /* "127.0.0.1:PORT" (loopback only; port 0: any free port) or NULL */
	const char *log_path;    /* the log file, reopened on SIGHUP; NULL: stderr */
	int n_ctx;               /* context of the worker's session; 0: min(TOAST_SERVER_CTX, the model's) */
	int max_clients;         /* 0: TOAST_SERVER_MAX_CLIENTS */
	int queue_depth;         /* 0: TOAST_SERVER_QUEUE_DEPTH */
	bool debug;              /* the audit log also records prompts and answers */
	bool cache_off;          /* no session cache: every request prefills its whole prompt */
	struct toast_cache_opts cache;
};

struct toast_server;

/* Make the worker's session and open the listening sockets: everything that can fail before the
 * daemon reports ready. Takes ownership of e (closed by toast_server_free, also on failure). */
enum toast_status toast_server_new(const struct toast_server_opts *o, struct toast_engine *e,
				   struct toast_server **out, struct toast_error *err);
/* "127.0.0.1:PORT" the HTTP listener is bound to, or NULL. */
const char *toast_server_http_addr(const struct toast_server *s);
/* Serve until SIGTERM or SIGINT: then stop accepting, cancel the request being generated and the
 * queued ones (their clients get a `shutdown` error), flush what clients are owed (at most 2 s),
 * remove the socket and return 0. SIGHUP reopens the log file. */
int toast_server_run(struct toast_server *s);
void toast_server_free(struct toast_server *s);

/* ---- process plumbing (daemon.c) ------------------------------------------------------------ */

/* Block SIGTERM, SIGINT and SIGHUP in the calling thread (and the threads it creates later) and
 * ignore SIGPIPE; mask (may be NULL) receives the blocked set, for a signalfd. */
void toast_daemon_block_signals(sigset_t *mask);

/* Create the socket's directory (0700) when it is missing; refuse a default /tmp/toasted-UID
 * directory that is not ours or not 0700. */
enum toast_status toast_daemon_prepare_dir(const char *sock_path, struct toast_error *err);
/* Lock SOCK.pid (flock, held as long as *fd is open in this process or a child). A live daemon
 * holding it gives TOAST_ERR_BUSY naming its pid. */
enum toast_status toast_daemon_lock(const char *sock_path, int *fd, struct toast_error *err);
/* Record pid in the locked file (0: empty it). */
void toast_daemon_write_pid(int lock_fd, pid_t pid);
/* The pid of the daemon holding SOCK.pid's lock, -1 when one holds it without its pid written
 * (starting: loading its model; stopping: the pid emptied before the lock goes), or 0 when
 * none does. */
pid_t toast_daemon_running(const char *sock_path);
/* With the lock held: remove a stale socket at path (a socket nothing listens on). A path that
 * is not a socket, or one that answers, is never removed (error). */
enum toast_status toast_daemon_clear_stale(const char *path, struct toast_error *err);
enum toast_status toast_daemon_listen_unix(const char *path, int *fd, struct toast_error *err);
/* addr "HOST:PORT" with a loopback HOST (127.x.x.x, localhost, [::1]); bound gets the address
 * actually bound (the port chosen when PORT is 0). */
enum toast_status toast_daemon_listen_tcp(const char *addr, int *fd, char *bound, size_t n,
					  struct toast_error *err);

#endif
