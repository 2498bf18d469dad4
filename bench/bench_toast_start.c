/*
 * bench_toast_start.c - what `toast` adds to a request: the time from starting the client
 * (fork + exec) to the first byte of its request arriving at the daemon's socket.
 *
 * The bench listens on its own socket in front of a running daemon: for each run it starts
 * `toast PROMPT --max-tokens 1` with TOASTED_SOCKET pointing at itself, timestamps the first
 * byte, then relays the conversation to the real daemon so that every run is a complete request.
 * For scale it also times fork + exec + exit of /bin/true. Prints the median and the 90th
 * percentile of both.
 *
 * usage: bench_toast_start TOAST_BIN DAEMON_SOCKET [RUNS]
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/timeutil.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static pid_t spawn(char *const argv[], const char *sock)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (sock)
			setenv("TOASTED_SOCKET", sock, 1);
		freopen("/dev/null", "r", stdin);
		freopen("/dev/null", "w", stdout);
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Relay bytes both ways until the client closes. */
static void relay(int a, int b)
{
	char buf[65536];
	for (;;) {
		struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
		if (poll(p, 2, 30000) <= 0)
			return;
		for (int i = 0; i < 2; i++) {
			if (!p[i].revents)
				continue;
			ssize_t r = read(p[i].fd, buf, sizeof(buf));
			if (r <= 0)
				return;
			if (write(p[i ^ 1].fd, buf, (size_t)r) != r)
				return;
		}
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: bench_toast_start TOAST_BIN DAEMON_SOCKET [RUNS]\n");
		return 2;
	}
	int runs = argc > 3 ? atoi(argv[3]) : 200;
	if (runs < 1 || runs > 100000)
		runs = 200;
	char dir[] = "/tmp/bench-toast-XXXXXX", path[64];
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/front.sock", dir);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 8) != 0) {
		perror("bench: listen");
		return 1;
	}
	double *first = calloc((size_t)runs, sizeof(double)), *base = calloc((size_t)runs, sizeof(double));
	char *targv[] = {argv[1], "hello", "--max-tokens", "1", "--temperature", "0", NULL};
	char *tru[] = {"/bin/true", NULL};
	int ok = 0;
	for (int i = 0; i < runs; i++) {
		double t0 = toast_now();
		pid_t pid = spawn(targv, path);
		int c = accept(lfd, NULL, NULL);
		char byte;
		if (c < 0 || read(c, &byte, 1) != 1) {
			fprintf(stderr, "bench: toast sent nothing\n");
			break;
		}
		first[i] = toast_now() - t0;
		int d = unix_connect(argv[2]);
		if (d < 0 || write(d, &byte, 1) != 1) {
			fprintf(stderr, "bench: no daemon on %s\n", argv[2]);
			break;
		}
		relay(c, d);
		close(c);
		close(d);
		int st;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "bench: toast failed (status %d)\n", st);
			break;
		}
		t0 = toast_now();
		waitpid(spawn(tru, NULL), &st, 0);
		base[i] = toast_now() - t0;
		ok++;
	}
	unlink(path);
	rmdir(dir);
	if (ok < runs)
		return 1;
	qsort(first, (size_t)runs, sizeof(double), cmp_double);
	qsort(base, (size_t)runs, sizeof(double), cmp_double);
	printf("toast start to first request byte: median %.2f ms, p90 %.2f ms (%d runs)\n", first[runs / 2] * 1e3,
	       first[runs * 9 / 10] * 1e3, runs);
	printf("fork + exec + exit of /bin/true:   median %.2f ms, p90 %.2f ms\n", base[runs / 2] * 1e3,
	       base[runs * 9 / 10] * 1e3);
	free(first);
	free(base);
	return 0;
}
