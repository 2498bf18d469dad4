/* log.c - leveled logging. */
#include "util/log.h"

#include <stdarg.h>
#include <time.h>

static enum toast_log_level log_level = TOAST_LOG_WARN;
static FILE *log_file;

void toast_log_set_level(enum toast_log_level lvl)
{
	log_level = lvl;
}

void toast_log_set_file(FILE *f)
{
	log_file = f;
}

void toast_log(enum toast_log_level lvl, const char *fmt, ...)
{
	static const char *names[] = {"debug", "info", "warn", "error"};
	if (lvl < log_level)
		return;
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	FILE *f = log_file ? log_file : stderr;
	if (log_file) {
		char ts[32];
		time_t t = time(NULL);
		struct tm tm;
		gmtime_r(&t, &tm);
		strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
		fprintf(f, "%s %s: %s\n", ts, names[lvl], line);
	} else {
		fprintf(f, "toasted: %s: %s\n", names[lvl], line);
	}
	fflush(f);
}
