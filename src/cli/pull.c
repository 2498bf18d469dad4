/*
 * pull.c - `toasted pull SOURCE [DEST]` and `toasted publish DIR` (the work is in src/pull/).
 *
 * A progress line (bytes, percentage, rate, time left, current file) is drawn on stderr only
 * when stderr is a terminal; the one-line summary goes to stdout. SIGINT, SIGTERM and SIGHUP
 * stop a pull so that it can be resumed (rsync keeps its partial file).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli/cli.h"
#include "pull/pull.h"
#include "util/timeutil.h"

static volatile sig_atomic_t pull_cancel;

static void pull_on_signal(int sig)
{
	(void)sig;
	pull_cancel = 1;
}

static void pull_catch_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = pull_on_signal; /* no SA_RESTART: a blocking wait returns at once */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

struct pull_meter {
	double t_draw, t_rate, rate;
	uint64_t rate_bytes;
	enum toast_pull_phase phase;
	bool drawn, started;
};

static void pull_draw(void *ud, const struct toast_pull_progress *p)
{
	struct pull_meter *m = ud;
	double now = toast_now();
	if (!m->started || p->phase != m->phase) {
		*m = (struct pull_meter){.t_rate = now, .rate_bytes = p->done_bytes, .phase = p->phase, .started = true,
					 .drawn = m->drawn};
	} else if (now - m->t_rate >= 0.5) {
		/* bytes per second over the last half second or more, smoothed */
		double inst = (double)(p->done_bytes - m->rate_bytes) / (now - m->t_rate);
		m->rate = m->rate > 0 ? 0.7 * m->rate + 0.3 * inst : inst;
		m->t_rate = now;
		m->rate_bytes = p->done_bytes;
	}
	if (now - m->t_draw < 0.1 && p->percent < 100)
		return;
	m->t_draw = now;
	char bar[21], done[16], total[16], rate[24] = "", eta[48] = "";
	int fill = p->percent * 20 / 100;
	for (int i = 0; i < 20; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[20] = 0;
	toast_pull_format_bytes(done, sizeof(done), (double)p->done_bytes);
	toast_pull_format_bytes(total, sizeof(total), (double)p->total_bytes);
	if (m->rate > 0) {
		toast_pull_format_bytes(rate, sizeof(rate) - 4, m->rate);
		strcat(rate, "/s");
	}
	if (m->rate > 0 && p->total_bytes > p->done_bytes) {
		long s = (long)((double)(p->total_bytes - p->done_bytes) / m->rate);
		snprintf(eta, sizeof(eta), "  ETA %ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
	}
	char line[512];
	int n = snprintf(line, sizeof(line), "%s [%s] %3d%%  %s / %s%s  %s%s  ",
			 p->phase == TOAST_PULL_FETCH ? "pulling  " : "verifying", bar, p->percent, done,
			 p->phase == TOAST_PULL_FETCH && p->total_bytes ? "~" : "", p->total_bytes ? total : "?", rate, eta);
	struct winsize ws;
	int width = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20 ? ws.ws_col : 80;
	if (n > 0 && n < width - 1 && p->file)
		snprintf(line + n, sizeof(line) - (size_t)n, "%.*s", width - 1 - n, p->file);
	fprintf(stderr, "\r%.*s\033[K", width - 1, line);
	m->drawn = true;
}

static void pull_clear(struct pull_meter *m)
{
	if (m->drawn)
		fputs("\r\033[K", stderr);
}

/* A bare NAME (no '/' or ':') means TOASTED_PULL_SOURCE/NAME when that is set. */
static const char *pull_resolve_source(const char *arg, char *buf, size_t n)
{
	const char *base = getenv("TOASTED_PULL_SOURCE");
	if (!base || !*base || strpbrk(arg, "/:"))
		return arg;
	size_t bl = strlen(base);
	if ((size_t)snprintf(buf, n, "%s%s%s", base, base[bl - 1] == '/' ? "" : "/", arg) >= n)
		return arg;
	return buf;
}

int cli_pull(int argc, char **argv)
{
	struct toast_pull_opts o = {0};
	const char *pos[2] = {NULL, NULL};
	int n_pos = 0;
	bool quiet = false;
	for (int i = 1; i < argc; i++) {
		const char *v;
		long n;
		if ((v = cli_optval(argc, argv, &i, "--bwlimit"))) {
			if (!cli_int("--bwlimit", v, 1, 1L << 40, &n))
				return 2;
			o.bwlimit_kbps = n;
		} else if ((v = cli_optval(argc, argv, &i, "--threads"))) {
			if (!cli_int("--threads", v, 1, 256, &n))
				return 2;
			o.n_threads = (int)n;
		} else if (strcmp(argv[i], "--quiet") == 0) {
			quiet = true;
		} else if (argv[i][0] == '-' || n_pos == 2) {
			fprintf(stderr, "toasted pull: unexpected argument %s\n", argv[i]);
			return 2;
		} else {
			pos[n_pos++] = argv[i];
		}
	}
	if (n_pos == 0) {
		fprintf(stderr, "usage: toasted pull [--bwlimit KBPS] [--threads N] [--quiet] SOURCE [DEST]\n"
				"  SOURCE: rsync://HOST/MODULE/PATH, HOST::MODULE/PATH, [USER@]HOST:PATH, a directory,\n"
				"          or a NAME under $TOASTED_PULL_SOURCE; DEST defaults to ~/models/NAME\n");
		return 2;
	}
	char srcbuf[4096];
	o.source = pull_resolve_source(pos[0], srcbuf, sizeof(srcbuf));
	o.dest = pos[1];
	o.cancel = &pull_cancel;
	struct pull_meter meter = {0};
	if (!quiet && isatty(STDERR_FILENO)) {
		o.progress = pull_draw;
		o.progress_ud = &meter;
	}
	pull_catch_signals();
	struct toast_pull_result res;
	struct toast_error err = {0};
	enum toast_status st = toast_pull(&o, &res, &err);
	pull_clear(&meter);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted pull: %s\n", err.msg);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	printf("%s: %d files (%llu bytes) verified against SHA256SUMS; received %llu bytes, transferred %d file%s "
	       "(%llu bytes new, %llu bytes reused)\n",
	       res.dest, res.n_files, (unsigned long long)res.total_bytes, (unsigned long long)res.received_bytes,
	       res.n_transferred, res.n_transferred == 1 ? "" : "s", (unsigned long long)res.literal_bytes,
	       (unsigned long long)res.matched_bytes);
	return 0;
}

int cli_publish(int argc, char **argv)
{
	const char *dir = NULL;
	int n_threads = 0;
	for (int i = 1; i < argc; i++) {
		const char *v;
		long n;
		if ((v = cli_optval(argc, argv, &i, "--threads"))) {
			if (!cli_int("--threads", v, 1, 256, &n))
				return 2;
			n_threads = (int)n;
		} else if (argv[i][0] == '-' || dir) {
			fprintf(stderr, "toasted publish: unexpected argument %s\n", argv[i]);
			return 2;
		} else {
			dir = argv[i];
		}
	}
	if (!dir) {
		fprintf(stderr, "usage: toasted publish [--threads N] DIR\n");
		return 2;
	}
	struct pull_meter meter = {0};
	pull_catch_signals();
	struct toast_publish_result res;
	struct toast_error err = {0};
	double t0 = toast_now();
	enum toast_status st = toast_publish(dir, n_threads, &pull_cancel, isatty(STDERR_FILENO) ? pull_draw : NULL,
					     &meter, &res, &err);
	double dt = toast_now() - t0;
	pull_clear(&meter);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted publish: %s\n", err.msg);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	printf("%s/SHA256SUMS: %d files, %llu bytes hashed in %.2f s (%.0f MB/s)\n", dir, res.n_files,
	       (unsigned long long)res.total_bytes, dt, dt > 0 ? (double)res.total_bytes / dt / 1e6 : 0.0);
	return 0;
}
