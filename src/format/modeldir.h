/*
 * modeldir.h - the completeness marker of a model directory.
 *
 * `toasted pull` writes DIR/.toasted-pull-incomplete before it changes anything in DIR and
 * removes it only after every file has been verified against DIR/SHA256SUMS. While the marker
 * exists, the directory is not a model: toast_engine_open() refuses it. The marker is a short
 * text file; its line "source SOURCE" records where the pull came from, so the refusal can say
 * how to resume.
 */
#ifndef TOAST_FORMAT_MODELDIR_H
#define TOAST_FORMAT_MODELDIR_H

#include <stddef.h>

#include "util/err.h"

#define TOAST_MODELDIR_MARKER ".toasted-pull-incomplete"

/* TOAST_OK when dir holds no marker; TOAST_ERR_INVALID "DIR is an incomplete pull; resume with:
 * toasted pull SOURCE DIR" when it does. Does not check that dir is a model otherwise. */
enum toast_status toast_modeldir_check(const char *dir, struct toast_error *err);

/* Create (or replace) the marker naming source, durably (file and directory synced) before the
 * caller touches the directory's other files. source must not contain control characters. */
enum toast_status toast_modeldir_mark_incomplete(const char *dir, const char *source, struct toast_error *err);

/* "toasted pull SOURCE DIR" into buf, each word shell-quoted when it needs it (to paste). */
void toast_modeldir_resume_hint(char *buf, size_t n, const char *source, const char *dir);

/* Remove the marker durably; TOAST_OK when there was none. */
enum toast_status toast_modeldir_mark_complete(const char *dir, struct toast_error *err);

#endif
