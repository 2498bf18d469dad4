/*
 * rsync.h - run rsync as a child process with an argument vector (never a shell) and read what
 * it reports: --info=progress2 progress lines, "file: NAME" lines from --out-format='file: %n',
 * --stats totals (with --no-human-readable), and its error messages.
 */
#ifndef TOAST_PULL_RSYNC_H
#define TOAST_PULL_RSYNC_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/err.h"

struct toast_rsync_progress {
	uint64_t done_bytes; /* bytes of the transfer processed so far (matched data included) */
	int percent;         /* of the whole transfer, 0..100 */
	const char *file;    /* the file being transferred, "" before the first */
};
typedef void (*toast_rsync_progress_fn)(void *ud, const struct toast_rsync_progress *p);

struct toast_rsync_result {
	int exit_code;       /* rsync's exit status; 128 + N when killed by signal N */
	bool cancelled;      /* *cancel was seen and rsync was asked to stop */
	bool disk_full;      /* rsync reported ENOSPC or EDQUOT */
	uint64_t received_bytes, literal_bytes, matched_bytes; /* --stats */
	int n_transferred;   /* --stats "Number of regular files transferred" */
	char message[1024];  /* the most telling line rsync wrote to stderr, "" if none */
};

/* Run argv (argv[0] the program, found in PATH); wait for it. TOAST_OK whenever it ran, whatever
 * its exit status (in res); TOAST_ERR_IO "rsync is not installed" when argv[0] is not found.
 * When *cancel becomes non-zero rsync gets SIGTERM (so it keeps its partial file), then SIGKILL
 * 10 s later. progress (may be NULL) is called from this thread. */
enum toast_status toast_rsync_run(char *const argv[], const volatile sig_atomic_t *cancel,
				  toast_rsync_progress_fn progress, void *ud, struct toast_rsync_result *res,
				  struct toast_error *err);

#endif
