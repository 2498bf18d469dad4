/*
 * modeldir.c - the completeness marker of a model directory (see modeldir.h).
 *
 * The marker's content is untrusted when read back: it is read with a size limit, and only the
 * printable part of its "source" line goes into the message.
 */
#include "format/modeldir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs.h"

#define MODELDIR_MARKER_MAX 8192

static int modeldir_marker_path(char *buf, size_t n, const char *dir)
{
	return toast_path_join(buf, n, dir, TOAST_MODELDIR_MARKER);
}

static enum toast_status modeldir_sync_dir(const char *dir, struct toast_error *err)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return toast_err_set(err, TOAST_ERR_IO, "%s: sync: %s", dir, strerror(e));
	}
	close(fd);
	return TOAST_OK;
}

/* s as one shell word: unchanged when it needs no quoting, else in single quotes */
static void modeldir_quote(char *buf, size_t n, const char *s)
{
	size_t o = 0;
	bool plain = *s != 0;
	for (const char *p = s; *p; p++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-~", *p))
			plain = false;
	if (plain) {
		snprintf(buf, n, "%s", s);
		return;
	}
	if (n < 3) {
		buf[0] = 0;
		return;
	}
	buf[o++] = '\'';
	for (const char *p = s; *p && o + 5 < n; p++) {
		if (*p == '\'') {
			memcpy(buf + o, "'\\''", 4);
			o += 4;
		} else {
			buf[o++] = *p;
		}
	}
	buf[o++] = '\'';
	buf[o] = 0;
}

void toast_modeldir_resume_hint(char *buf, size_t n, const char *source, const char *dir)
{
	char qs[1024], qd[1024];
	modeldir_quote(qs, sizeof(qs), source);
	modeldir_quote(qd, sizeof(qd), dir);
	snprintf(buf, n, "toasted pull %s %s", qs, qd);
}

enum toast_status toast_modeldir_check(const char *dir, struct toast_error *err)
{
	char path[4096];
	if (!modeldir_marker_path(path, sizeof(path), dir))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	struct stat st;
	if (lstat(path, &st) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return TOAST_OK;
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	}
	/* the directory is refused whatever the marker holds; its source only improves the message */
	char source[1024] = "SOURCE", *text = NULL;
	if (toast_read_file(path, MODELDIR_MARKER_MAX, &text, NULL, NULL) == TOAST_OK) {
		for (const char *line = text; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
			if (strncmp(line, "source ", 7) != 0)
				continue;
			size_t len = 0;
			line += 7;
			while (len + 1 < sizeof(source) && (unsigned char)line[len] >= 0x20 && line[len] != 0x7f)
				len++;
			if (len > 0) {
				memcpy(source, line, len);
				source[len] = 0;
			}
			break;
		}
		free(text);
	}
	char hint[2400];
	toast_modeldir_resume_hint(hint, sizeof(hint), source, dir);
	return toast_err_set(err, TOAST_ERR_INVALID, "%s is an incomplete pull; resume with: %s", dir, hint);
}

enum toast_status toast_modeldir_mark_incomplete(const char *dir, const char *source, struct toast_error *err)
{
	char path[4096];
	if (!modeldir_marker_path(path, sizeof(path), dir))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	for (const char *p = source; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return toast_err_set(err, TOAST_ERR_INVALID, "source contains a control character");
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	FILE *f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	}
	fprintf(f,
		"# toasted pull: this directory is incomplete until every file matches SHA256SUMS;\n"
		"# toasted refuses to load it while this file exists.\n"
		"source %s\n",
		source);
	int bad = fflush(f) != 0 || fsync(fd) != 0;
	int e = errno;
	if (fclose(f) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	if (bad)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	return modeldir_sync_dir(dir, err);
}

enum toast_status toast_modeldir_mark_complete(const char *dir, struct toast_error *err)
{
	char path[4096];
	if (!modeldir_marker_path(path, sizeof(path), dir))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	if (unlink(path) != 0) {
		if (errno == ENOENT)
			return TOAST_OK;
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	}
	return modeldir_sync_dir(dir, err);
}
