/*
 * daemon.c - process plumbing of the daemon: the socket's directory, the lock/pid file that
 * keeps two daemons off one socket, stale socket detection, and the listening sockets.
 *
 * The lock is flock() on SOCK.pid, so it dies with the process that holds it: a socket whose
 * lock is free is stale (its daemon is gone) and may be replaced; a socket whose lock is held,
 * or one that still accepts connections, never is. The pid file is emptied, not removed, on
 * exit (removing a lock file races with a process about to lock it).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "server/server.h"
#include "util/err.h"

void toast_daemon_block_signals(sigset_t *mask)
{
	sigset_t m;
	sigemptyset(&m);
	sigaddset(&m, SIGTERM);
	sigaddset(&m, SIGINT);
	sigaddset(&m, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &m, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (mask)
		*mask = m;
}

enum toast_status toast_daemon_prepare_dir(const char *sock_path, struct toast_error *err)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	if (snprintf(dir, sizeof(dir), "%s", sock_path) >= (int)sizeof(dir))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: socket path longer than %zu bytes", sock_path,
				     sizeof(dir) - 1);
	char *d = dirname(dir);
	char def[64];
	snprintf(def, sizeof(def), "/tmp/toasted-%u", (unsigned)getuid());
	if (mkdir(d, 0700) != 0 && errno != EEXIST)
		return toast_err_set(err, TOAST_ERR_IO, "%s: cannot create the socket directory: %s", d, strerror(errno));
	struct stat st;
	if (lstat(d, &st) != 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", d, strerror(errno));
	if (strcmp(d, def) == 0 && (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)))
		return toast_err_set(err, TOAST_ERR_IO, "%s: not a directory of ours with mode 0700; not using it", d);
	return TOAST_OK;
}

static int daemon_lock_path(const char *sock_path, char *buf, size_t n)
{
	return snprintf(buf, n, "%s.pid", sock_path) < (int)n;
}

static pid_t daemon_read_pid(int fd)
{
	char buf[32] = {0};
	ssize_t r = pread(fd, buf, sizeof(buf) - 1, 0);
	return r > 0 ? (pid_t)atol(buf) : 0;
}

enum toast_status toast_daemon_lock(const char *sock_path, int *fd_out, struct toast_error *err)
{
	*fd_out = -1;
	char path[4096];
	if (!daemon_lock_path(sock_path, path, sizeof(path)))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", sock_path);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		pid_t pid = daemon_read_pid(fd);
		close(fd);
		if (e == EWOULDBLOCK && pid > 0)
			return toast_err_set(err, TOAST_ERR_BUSY, "a daemon is already running on %s (pid %ld)", sock_path,
					     (long)pid);
		if (e == EWOULDBLOCK)
			return toast_err_set(err, TOAST_ERR_BUSY, "a daemon is already running on %s (starting or stopping: no pid yet)",
					     sock_path);
		return toast_err_set(err, TOAST_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
	}
	*fd_out = fd;
	return TOAST_OK;
}

void toast_daemon_write_pid(int fd, pid_t pid)
{
	char buf[32];
	int n = pid ? snprintf(buf, sizeof(buf), "%ld\n", (long)pid) : 0;
	if (ftruncate(fd, 0) == 0 && n > 0 && pwrite(fd, buf, (size_t)n, 0) != n)
		(void)ftruncate(fd, 0);
}

pid_t toast_daemon_running(const char *sock_path)
{
	char path[4096];
	if (!daemon_lock_path(sock_path, path, sizeof(path)))
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	pid_t pid = 0;
	if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
		pid = daemon_read_pid(fd);
		pid = pid > 0 ? pid : -1; /* held, its pid not yet (or no longer) written */
	} else
		flock(fd, LOCK_UN);
	close(fd);
	return pid;
}

static enum toast_status daemon_sockaddr(const char *path, struct sockaddr_un *sa, struct toast_error *err)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: socket path longer than %zu bytes", path,
				     sizeof(sa->sun_path) - 1);
	memcpy(sa->sun_path, path, strlen(path) + 1);
	return TOAST_OK;
}

enum toast_status toast_daemon_clear_stale(const char *path, struct toast_error *err)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? TOAST_OK : toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return toast_err_set(err, TOAST_ERR_IO, "%s exists and is not a socket; not touching it", path);
	struct sockaddr_un sa;
	enum toast_status rc = daemon_sockaddr(path, &sa, err);
	if (rc != TOAST_OK)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "socket: %s", strerror(errno));
	int c = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	close(fd);
	if (c == 0)
		return toast_err_set(err, TOAST_ERR_BUSY, "%s: a server answers there (without holding %s.pid); not replacing it",
				     path, path);
	if (e != ECONNREFUSED)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	if (unlink(path) != 0 && errno != ENOENT)
		return toast_err_set(err, TOAST_ERR_IO, "%s: cannot remove the stale socket: %s", path, strerror(errno));
	return TOAST_OK;
}

enum toast_status toast_daemon_listen_unix(const char *path, int *fd_out, struct toast_error *err)
{
	*fd_out = -1;
	struct sockaddr_un sa;
	enum toast_status rc = daemon_sockaddr(path, &sa, err);
	if (rc != TOAST_OK)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "socket: %s", strerror(errno));
	mode_t old = umask(0177); /* the socket is born 0600: no window where others may connect */
	int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	if (b != 0 || chmod(path, 0600) != 0 || listen(fd, 128) != 0) {
		e = b != 0 ? e : errno;
		close(fd);
		if (b == 0)
			unlink(path);
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	}
	*fd_out = fd;
	return TOAST_OK;
}

enum toast_status toast_daemon_listen_tcp(const char *addr, int *fd_out, char *bound, size_t n,
					  struct toast_error *err)
{
	*fd_out = -1;
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr || !colon[1])
		return toast_err_set(err, TOAST_ERR_INVALID, "--http %s: expected HOST:PORT, e.g. 127.0.0.1:8080", addr);
	char host[64], *end;
	size_t hlen = (size_t)(colon - addr);
	if (hlen >= sizeof(host))
		return toast_err_set(err, TOAST_ERR_INVALID, "--http %s: host too long", addr);
	memcpy(host, addr, hlen);
	host[hlen] = 0;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 0 || port > 65535)
		return toast_err_set(err, TOAST_ERR_INVALID, "--http %s: bad port", addr);
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t slen;
	int family;
	if (strcmp(host, "[::1]") == 0) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		s6->sin6_family = family = AF_INET6;
		s6->sin6_addr = in6addr_loopback;
		s6->sin6_port = htons((uint16_t)port);
		slen = sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		s4->sin_family = family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		if (strcmp(host, "localhost") == 0)
			s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		else if (inet_pton(AF_INET, host, &s4->sin_addr) != 1)
			return toast_err_set(err, TOAST_ERR_INVALID, "--http %s: not an IPv4 address, localhost or [::1]", addr);
		if ((ntohl(s4->sin_addr.s_addr) >> 24) != 127)
			return toast_err_set(err, TOAST_ERR_INVALID,
					     "--http %s: the HTTP API is served on loopback only (127.0.0.1, [::1])", addr);
		slen = sizeof(*s4);
	}
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, slen) != 0 || listen(fd, 128) != 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &slen) != 0) {
		int e = errno;
		close(fd);
		return toast_err_set(err, TOAST_ERR_IO, "--http %s: %s", addr, strerror(e));
	}
	uint16_t p = family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port;
	snprintf(bound, n, "%s:%u", family == AF_INET6 ? "[::1]" : host, (unsigned)ntohs(p));
	*fd_out = fd;
	return TOAST_OK;
}
