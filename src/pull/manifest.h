/*
 * manifest.h - SHA-256 of files, and the SHA256SUMS manifest of a model directory.
 *
 * The manifest is the usual `sha256sum` output: one line per file, 64 hex digits, two spaces
 * (or " *"), the path relative to the model directory; a line starting with '\' carries a name
 * with "\\", "\n" or "\r" escapes. A model is its non-hidden regular files: names with an empty,
 * ".", ".." or hidden (".x") component are refused, a leading "./" is dropped, and an entry for
 * SHA256SUMS itself is ignored.
 */
#ifndef TOAST_PULL_MANIFEST_H
#define TOAST_PULL_MANIFEST_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "util/err.h"

#define TOAST_MANIFEST_NAME "SHA256SUMS"
#define TOAST_MANIFEST_MAX_BYTES (64u << 20)
#define TOAST_MANIFEST_MAX_FILES 100000
#define TOAST_MANIFEST_MAX_NAME 4095

struct toast_manifest_file {
	char *name;                /* relative path, validated as above */
	unsigned char sha256[32];  /* the manifest's digest (or, for a scan, the computed one) */
	unsigned char got[32];     /* computed by toast_manifest_hash() */
	uint64_t size_bytes;       /* bytes hashed */
	int hash_errno;            /* 0, or why toast_manifest_hash() could not read the file */
};

/* files sorted by name (strcmp), no duplicates */
struct toast_manifest {
	struct toast_manifest_file *files;
	int n_files;
};

/* hashing progress, reported about ten times a second from the calling thread */
struct toast_hash_progress {
	uint64_t done_bytes, total_bytes;
};
typedef void (*toast_hash_progress_fn)(void *ud, const struct toast_hash_progress *p);

void toast_sha256_hex(const unsigned char d[32], char out[65]);
/* SHA-256 of a whole file. */
enum toast_status toast_sha256_file(const char *path, unsigned char out[32], struct toast_error *err);

/* Parse manifest text (what names it in messages: a path). */
enum toast_status toast_manifest_parse(struct toast_manifest *m, const char *text, size_t len, const char *what,
				       struct toast_error *err);
enum toast_status toast_manifest_load(struct toast_manifest *m, const char *path, struct toast_error *err);
void toast_manifest_free(struct toast_manifest *m);
/* index of name in m, or -1 */
int toast_manifest_find(const struct toast_manifest *m, const char *name);

/* Call fn for every entry under dir (its stat, symbolic links followed; rel relative to dir),
 * hidden ones included, descending into non-hidden subdirectories only; a non-OK return stops
 * the walk. A non-hidden entry that cannot be stat'ed is an error. */
typedef enum toast_status (*toast_walk_fn)(void *ud, const char *path, const char *rel, const struct stat *st,
					   struct toast_error *err);
enum toast_status toast_manifest_walk(const char *dir, toast_walk_fn fn, void *ud, struct toast_error *err);

/* The model files of dir: regular files (symbolic links followed) in dir and its subdirectories,
 * hidden entries and the top-level SHA256SUMS skipped. Digests are left zero. */
enum toast_status toast_manifest_scan(struct toast_manifest *m, const char *dir, struct toast_error *err);

/* Hash every file of m under dir into files[i].got, on n_threads threads (<= 0: up to 8, one per
 * core). A file that cannot be read gets hash_errno (ENOENT when missing) and does not stop the
 * others. TOAST_ERR_CANCELLED when *cancel becomes non-zero (cancel may be NULL). */
enum toast_status toast_manifest_hash(struct toast_manifest *m, const char *dir, int n_threads,
				      const volatile sig_atomic_t *cancel, toast_hash_progress_fn fn, void *ud,
				      struct toast_error *err);

/* Write m's names and sha256 digests to dir/SHA256SUMS atomically (a temporary file renamed). */
enum toast_status toast_manifest_write(const struct toast_manifest *m, const char *dir, struct toast_error *err);

#endif
