/* err.c - error message formatting. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *toast_status_name(enum toast_status st)
{
	switch (st) {
	case TOAST_OK: return "ok";
	case TOAST_ERR_IO: return "io";
	case TOAST_ERR_FORMAT: return "format";
	case TOAST_ERR_INVALID: return "invalid";
	case TOAST_ERR_NOMEM: return "nomem";
	case TOAST_ERR_BACKEND: return "backend";
	case TOAST_ERR_CTX_FULL: return "ctx_full";
	case TOAST_ERR_UNSUPPORTED: return "unsupported";
	case TOAST_ERR_CANCELLED: return "cancelled";
	case TOAST_ERR_BUSY: return "busy";
	}
	return "unknown";
}

enum toast_status toast_err_set(struct toast_error *err, enum toast_status code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return code;
}

enum toast_status toast_err_prefix(struct toast_error *err, const char *fmt, ...)
{
	if (!err)
		return TOAST_ERR_INVALID;
	char old[sizeof(err->msg)];
	memcpy(old, err->msg, sizeof(old));
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(err->msg)) {
		size_t room = sizeof(err->msg) - (size_t)n - 1, len = strnlen(old, sizeof(old) - 1);
		len = len < room ? len : room;
		memcpy(err->msg + n, old, len);
		err->msg[n + len] = 0;
	}
	return err->code;
}

void toast_err_clear(struct toast_error *err)
{
	if (err) {
		err->code = TOAST_OK;
		err->msg[0] = 0;
	}
}
