/*
 * conn.h - the client side of a connection to the daemon: connect to its Unix socket, send a
 * request, read events one line at a time (bounded by TOAST_PROTO_MAX_EVENT). Blocking I/O.
 */
#ifndef TOAST_PROTO_CONN_H
#define TOAST_PROTO_CONN_H

#include <stdbool.h>

#include "proto/proto.h"

struct toast_conn {
	int fd;
	struct toast_buf in;
	size_t scan;
};

/* Connect to the daemon at path. *absent (may be NULL) is set when nothing listens there (no
 * socket, or a stale one), as opposed to any other failure. */
enum toast_status toast_conn_open(struct toast_conn *c, const char *path, bool *absent, struct toast_error *err);
enum toast_status toast_conn_send(struct toast_conn *c, const void *p, size_t n, struct toast_error *err);
/* The next event (ev is deinit'ed by the caller); TOAST_ERR_IO when the daemon closes first. */
enum toast_status toast_conn_event(struct toast_conn *c, struct toast_proto_event *ev, struct toast_error *err);
void toast_conn_close(struct toast_conn *c);

#endif
