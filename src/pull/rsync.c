/*
 * rsync.c - run rsync and read its reports (see rsync.h).
 *
 * rsync is started with posix_spawnp() and an argument vector, so no string reaches a shell.
 * Its stdout and stderr come back through pipes read with poll(); records end in '\r' (progress
 * redraws) or '\n'. What is kept of them is bounded: one record of RSYNC_MAX_RECORD bytes at a
 * time and one chosen error line.
 */
#define _GNU_SOURCE
#include "pull/rsync.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/timeutil.h"

#define RSYNC_MAX_RECORD 4096
#define RSYNC_KILL_AFTER_S 10.0

extern char **environ;

struct rsync_stream {
	int fd;
	char rec[RSYNC_MAX_RECORD];
	size_t len;
};

struct rsync_reader {
	struct toast_rsync_result *res;
	toast_rsync_progress_fn progress;
	void *ud;
	char file[1024];
	bool have_message;
};

/* digits with optional ',' grouping at s; false if there are none */
static bool rsync_number(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	bool any = false;
	for (; (*s >= '0' && *s <= '9') || (*s == ',' && any); s++) {
		if (*s == ',')
			continue;
		if (v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
		any = true;
	}
	*out = v;
	return any;
}

/* "   1234567  12%  3.91MB/s    0:00:03 ..." -> bytes and percent */
static bool rsync_progress_line(const char *s, uint64_t *bytes, int *percent)
{
	while (*s == ' ')
		s++;
	uint64_t b, p;
	if (!rsync_number(s, &b))
		return false;
	s += strspn(s, "0123456789,");
	if (*s != ' ')
		return false;
	s += strspn(s, " ");
	if (!rsync_number(s, &p) || p > 100)
		return false;
	s += strspn(s, "0123456789");
	if (*s != '%')
		return false;
	*bytes = b;
	*percent = (int)p;
	return true;
}

static void rsync_stdout_record(struct rsync_reader *r, const char *s)
{
	static const struct {
		const char *key;
		size_t off;
	} stats[] = {
		{"Total bytes received: ", offsetof(struct toast_rsync_result, received_bytes)},
		{"Literal data: ", offsetof(struct toast_rsync_result, literal_bytes)},
		{"Matched data: ", offsetof(struct toast_rsync_result, matched_bytes)},
	};
	uint64_t v;
	struct toast_rsync_progress p = {.file = r->file};
	if (rsync_progress_line(s, &p.done_bytes, &p.percent)) {
		if (r->progress)
			r->progress(r->ud, &p);
		return;
	}
	if (strncmp(s, "file: ", 6) == 0) {
		size_t n = strlen(s + 6);
		if (n > 0 && s[6 + n - 1] != '/') /* directories end in '/' */
			snprintf(r->file, sizeof(r->file), "%s", s + 6);
		return;
	}
	for (size_t i = 0; i < sizeof(stats) / sizeof(stats[0]); i++)
		if (strncmp(s, stats[i].key, strlen(stats[i].key)) == 0 && rsync_number(s + strlen(stats[i].key), &v))
			*(uint64_t *)((char *)r->res + stats[i].off) = v;
	if (strncmp(s, "Number of regular files transferred: ", 37) == 0 && rsync_number(s + 37, &v))
		r->res->n_transferred = v > 1000000000 ? 1000000000 : (int)v;
}

/* Keep the first line that says what went wrong; rsync's closing "rsync error: ... (code N)"
 * summary only when nothing better came. */
static void rsync_stderr_record(struct rsync_reader *r, const char *s)
{
	if (!*s)
		return;
	if (strstr(s, "No space left on device") || strstr(s, "Disk quota exceeded"))
		r->res->disk_full = true;
	bool summary = strncmp(s, "rsync error: ", 13) == 0 || strncmp(s, "rsync warning: ", 15) == 0;
	if (r->have_message || (summary && r->res->message[0]))
		return;
	if (strncmp(s, "rsync: ", 7) == 0)
		s += 7;
	if (*s == '[') { /* "[Receiver] ", "[sender] ", "[generator] " */
		const char *e = strchr(s, ']');
		if (e && e[1] == ' ')
			s = e + 2;
	}
	snprintf(r->res->message, sizeof(r->res->message), "%s", s);
	r->have_message = !summary;
}

/* Read what is available on st; false at end of file. */
static bool rsync_drain(struct rsync_stream *st, struct rsync_reader *r, bool is_stderr)
{
	char buf[4096];
	ssize_t n = read(st->fd, buf, sizeof(buf));
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return true;
	if (n <= 0) {
		if (st->len) {
			st->rec[st->len] = 0;
			(is_stderr ? rsync_stderr_record : rsync_stdout_record)(r, st->rec);
			st->len = 0;
		}
		return false;
	}
	for (ssize_t i = 0; i < n; i++) {
		char c = buf[i];
		if (c == '\n' || c == '\r') {
			st->rec[st->len] = 0;
			(is_stderr ? rsync_stderr_record : rsync_stdout_record)(r, st->rec);
			st->len = 0;
		} else if (st->len + 1 < sizeof(st->rec)) {
			st->rec[st->len++] = c;
		}
	}
	return true;
}

enum toast_status toast_rsync_run(char *const argv[], const volatile sig_atomic_t *cancel,
				  toast_rsync_progress_fn progress, void *ud, struct toast_rsync_result *res,
				  struct toast_error *err)
{
	memset(res, 0, sizeof(*res));
	struct rsync_reader r = {.res = res, .progress = progress, .ud = ud};
	struct rsync_stream *st = calloc(2, sizeof(*st));
	int out[2] = {-1, -1}, errp[2] = {-1, -1};
	if (!st)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (pipe2(out, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0) {
		int e = errno;
		for (int i = 0; i < 2; i++) {
			if (out[i] >= 0)
				close(out[i]);
			if (errp[i] >= 0)
				close(errp[i]);
		}
		free(st);
		return toast_err_set(err, TOAST_ERR_IO, "pipe: %s", strerror(e));
	}
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
	posix_spawn_file_actions_adddup2(&fa, errp[1], STDERR_FILENO);
	/* rsync starts with default signal handling and nothing blocked, whatever our caller set */
	sigset_t none, deflt;
	sigemptyset(&none);
	sigemptyset(&deflt);
	sigaddset(&deflt, SIGPIPE);
	sigaddset(&deflt, SIGINT);
	sigaddset(&deflt, SIGTERM);
	sigaddset(&deflt, SIGHUP);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &deflt);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	pid_t pid;
	int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	close(out[1]);
	close(errp[1]);
	st[0].fd = out[0];
	st[1].fd = errp[0];
	if (rc != 0) {
		close(out[0]);
		close(errp[0]);
		free(st);
		if (rc == ENOENT)
			return toast_err_set(err, TOAST_ERR_IO,
					     "%s is not installed (not found in PATH); install it (Debian: apt-get install rsync)",
					     argv[0]);
		return toast_err_set(err, TOAST_ERR_IO, "cannot run %s: %s", argv[0], strerror(rc));
	}
	bool open_fd[2] = {true, true};
	double t_term = 0;
	while (open_fd[0] || open_fd[1]) {
		if (cancel && *cancel && !res->cancelled) {
			res->cancelled = true;
			t_term = toast_now();
			kill(pid, SIGTERM);
		} else if (res->cancelled && t_term > 0 && toast_now() - t_term > RSYNC_KILL_AFTER_S) {
			kill(pid, SIGKILL);
			t_term = 0;
		}
		struct pollfd pfd[2];
		int n = 0, idx[2];
		for (int i = 0; i < 2; i++)
			if (open_fd[i]) {
				pfd[n] = (struct pollfd){.fd = st[i].fd, .events = POLLIN};
				idx[n++] = i;
			}
		int pr = poll(pfd, (nfds_t)n, 250);
		if (pr < 0 && errno != EINTR)
			break;
		for (int k = 0; pr > 0 && k < n; k++)
			if (pfd[k].revents && !rsync_drain(&st[idx[k]], &r, idx[k] == 1))
				open_fd[idx[k]] = false;
	}
	close(out[0]);
	close(errp[0]);
	free(st);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return toast_err_set(err, TOAST_ERR_IO, "waitpid: %s", strerror(errno));
		if (cancel && *cancel && !res->cancelled) {
			res->cancelled = true;
			kill(pid, SIGTERM);
		}
	}
	res->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	return TOAST_OK;
}
