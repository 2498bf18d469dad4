/* log.c - leveled logging. */
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "util/buf.h"

static enum toast_log_level log_level = TOAST_LOG_WARN;
static FILE *log_file;
static bool log_json;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void toast_log_set_level(enum toast_log_level lvl)
{
	log_level = lvl;
}

FILE *toast_log_set_file(FILE *f)
{
	pthread_mutex_lock(&log_mu);
	FILE *old = log_file;
	log_file = f;
	pthread_mutex_unlock(&log_mu);
	return old;
}

void toast_log_set_json(bool on)
{
	log_json = on;
}

void toast_log_time(char buf[32])
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	struct tm tm;
	gmtime_r(&tv.tv_sec, &tm);
	size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, 32 - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

void toast_log_line(const char *line)
{
	pthread_mutex_lock(&log_mu);
	FILE *f = log_file ? log_file : stderr;
	fputs(line, f);
	fputc('\n', f);
	fflush(f);
	pthread_mutex_unlock(&log_mu);
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
	char ts[32];
	toast_log_time(ts);
	if (log_json) {
		struct toast_buf b;
		toast_buf_init(&b);
		if (toast_buf_printf(&b, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts, names[lvl]) &&
		    toast_buf_json_escape(&b, line, strlen(line)) && toast_buf_puts(&b, "\"}"))
			toast_log_line(b.data);
		toast_buf_deinit(&b);
		return;
	}
	pthread_mutex_lock(&log_mu);
	if (log_file)
		fprintf(log_file, "%s %s: %s\n", ts, names[lvl], line);
	else
		fprintf(stderr, "toasted: %s: %s\n", names[lvl], line);
	fflush(log_file ? log_file : stderr);
	pthread_mutex_unlock(&log_mu);
}
