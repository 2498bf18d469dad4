/*
 * pull.h - `toasted pull`: copy a model directory from an rsync source and verify it; and
 * `toasted publish`: write the SHA256SUMS manifest a source serves.
 *
 * A pull runs rsync twice: the first fetches SOURCE/SHA256SUMS (so a wrong or unreachable source
 * fails before anything in DEST changes), the second the model's files. rsync keeps an interrupted
 * file in DEST/.toasted-partial/ and resumes from it with its delta algorithm; an update moves only
 * changed files and, within them, changed blocks. Between the two, DEST is marked incomplete
 * (format/modeldir.h); the marker goes only once every file in the manifest matches its SHA-256.
 * DEST holds the model's files under the source's names, nothing else but SHA256SUMS; hidden
 * files are not part of a model and are not pulled. Files in DEST that the manifest does not list
 * are left alone (and reported).
 */
#ifndef TOAST_PULL_PULL_H
#define TOAST_PULL_PULL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define TOAST_PULL_PARTIAL_DIR ".toasted-partial"

enum toast_pull_kind {
	TOAST_PULL_LOCAL,  /* a directory on this machine */
	TOAST_PULL_DAEMON, /* rsync://host[:port]/module/path or host::module/path */
	TOAST_PULL_SSH,    /* [user@]host:path, rsync over ssh */
};

/* Classify source the way rsync does (rsync:// or a ':' before the first '/' means remote) and
 * put its last path component, the model's name, into name ("" when it has none). Refuses what
 * could be taken for an option or a remote shell argument, and control characters. */
enum toast_status toast_pull_source_parse(const char *source, enum toast_pull_kind *kind, char *name,
					  size_t name_size, struct toast_error *err);

enum toast_pull_phase { TOAST_PULL_FETCH, TOAST_PULL_VERIFY };

struct toast_pull_progress {
	enum toast_pull_phase phase;
	uint64_t done_bytes;
	uint64_t total_bytes; /* exact when verifying; estimated from rsync's percentage when fetching (0: unknown) */
	int percent;
	const char *file;     /* fetching: the file rsync is transferring, "" before the first */
};
typedef void (*toast_pull_progress_fn)(void *ud, const struct toast_pull_progress *p);

struct toast_pull_opts {
	const char *source;
	const char *dest;      /* NULL: $HOME/models/NAME */
	long bwlimit_kbps;     /* 0: no limit */
	int n_threads;         /* hashing threads, <= 0: automatic */
	toast_pull_progress_fn progress; /* NULL: none */
	void *progress_ud;
	const volatile sig_atomic_t *cancel; /* non-zero stops the pull, resumable (NULL: never) */
};

struct toast_pull_result {
	char dest[4096];         /* the absolute destination, set as soon as it is known */
	int n_files;             /* files verified */
	uint64_t total_bytes;    /* their size */
	uint64_t received_bytes; /* bytes rsync received over the wire, both runs */
	uint64_t literal_bytes, matched_bytes; /* rsync's new data, and data it reused from DEST */
	int n_transferred;       /* model files rsync (re)wrote */
	int n_unlisted;          /* files in DEST that SHA256SUMS does not list (left alone, not verified) */
};

/* Pull o->source into o->dest. Errors name the source or destination and, once DEST is marked
 * incomplete, say how to resume; TOAST_ERR_CANCELLED when o->cancel stopped it. */
enum toast_status toast_pull(const struct toast_pull_opts *o, struct toast_pull_result *res, struct toast_error *err);

/* "1.2 GB": decimal units, one decimal */
void toast_pull_format_bytes(char *buf, size_t n, double bytes);

struct toast_publish_result {
	int n_files;
	uint64_t total_bytes;
};

/* Hash every model file of dir and write dir/SHA256SUMS (toast_manifest_write). */
enum toast_status toast_publish(const char *dir, int n_threads, const volatile sig_atomic_t *cancel,
				toast_pull_progress_fn progress, void *progress_ud, struct toast_publish_result *res,
				struct toast_error *err);

#endif
