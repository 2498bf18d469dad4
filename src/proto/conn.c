/* conn.c - a blocking client connection to the daemon's Unix socket. */
#include "proto/conn.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum toast_status toast_conn_open(struct toast_conn *c, const char *path, bool *absent, struct toast_error *err)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	if (absent)
		*absent = false;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: socket path too long", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = errno;
		close(fd);
		if (absent)
			*absent = e == ENOENT || e == ECONNREFUSED;
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	}
	c->fd = fd;
	return TOAST_OK;
}

enum toast_status toast_conn_send(struct toast_conn *c, const void *p, size_t n, struct toast_error *err)
{
	const char *b = p;
	while (n) {
		ssize_t r = send(c->fd, b, n, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return toast_err_set(err, TOAST_ERR_IO, "sending to the daemon: %s", strerror(errno));
		b += r;
		n -= (size_t)r;
	}
	return TOAST_OK;
}

enum toast_status toast_conn_event(struct toast_conn *c, struct toast_proto_event *ev, struct toast_error *err)
{
	memset(ev, 0, sizeof(*ev));
	for (;;) {
		size_t len = 0;
		int rc = toast_proto_line(&c->in, &c->scan, TOAST_PROTO_MAX_EVENT, &len);
		if (rc < 0)
			return toast_err_set(err, TOAST_ERR_FORMAT, "an event from the daemon is longer than %u bytes",
					     TOAST_PROTO_MAX_EVENT);
		if (rc > 0) {
			size_t used = c->scan;
			c->scan = 0;
			bool ok = toast_proto_event_parse(c->in.data, len, ev, err);
			toast_buf_consume(&c->in, used);
			return ok ? TOAST_OK : TOAST_ERR_FORMAT;
		}
		char tmp[16384];
		ssize_t r = recv(c->fd, tmp, sizeof(tmp), 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return toast_err_set(err, TOAST_ERR_IO, "reading from the daemon: %s", strerror(errno));
		if (r == 0)
			return toast_err_set(err, TOAST_ERR_IO, "the daemon closed the connection before answering");
		if (!toast_buf_append(&c->in, tmp, (size_t)r))
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
}

void toast_conn_close(struct toast_conn *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	toast_buf_deinit(&c->in);
}
