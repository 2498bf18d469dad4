/*
 * pull.c - `toasted pull` and `toasted publish` (see pull.h).
 *
 * Order of a pull, each step durable before the next: fetch SOURCE/SHA256SUMS into a hidden
 * temporary file (DEST untouched if that fails), write the incomplete marker, move the manifest
 * into place, let rsync bring the files, hash them all, and only then remove the marker.
 *
 * rsync's own resume keeps an interrupted file in .toasted-partial/ only when rsync can clean up
 * (a signal, a lost connection, a full disk). After a hard kill or a power cut its temporary file
 * (".NAME.XXXXXX" beside NAME) is left instead, which rsync never reuses: a pull moves such a file
 * into .toasted-partial/ first, so it serves as the basis of the delta transfer either way.
 *
 * A file that fails verification gets modification time 0, so that the next pull's rsync sees it
 * as changed and repairs it with the delta algorithm rather than trusting its size and time.
 */
#define _GNU_SOURCE
#include "pull/pull.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "format/modeldir.h"
#include "pull/manifest.h"
#include "pull/rsync.h"
#include "util/fs.h"
#include "util/log.h"

#define PULL_TMP_MANIFEST ".toasted-pull-" TOAST_MANIFEST_NAME
#define PULL_MAX_SOURCE 2048
#define PULL_MAX_DEST 2048
#define PULL_TIMEOUT_S 300
#define PULL_MAX_ARGS 32
#define PULL_MAX_UNLISTED_WARNINGS 10

static bool pull_has_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

enum toast_status toast_pull_source_parse(const char *source, enum toast_pull_kind *kind, char *name,
					  size_t name_size, struct toast_error *err)
{
	name[0] = 0;
	size_t len = strlen(source);
	if (len == 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "empty SOURCE");
	if (len > PULL_MAX_SOURCE)
		return toast_err_set(err, TOAST_ERR_INVALID, "SOURCE longer than %d bytes", PULL_MAX_SOURCE);
	if (pull_has_control(source))
		return toast_err_set(err, TOAST_ERR_INVALID, "SOURCE contains a control character");
	if (source[0] == '-')
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: a SOURCE may not begin with '-'", source);
	const char *path;
	if (strncmp(source, "rsync://", 8) == 0) {
		const char *host = source + 8, *slash = strchr(host, '/');
		if (!slash || slash == host || !slash[1] || slash[1] == '/')
			return toast_err_set(err, TOAST_ERR_INVALID, "%s: expected rsync://HOST[:PORT]/MODULE[/PATH]", source);
		if (host[0] == '-')
			return toast_err_set(err, TOAST_ERR_INVALID, "%s: a host may not begin with '-'", source);
		*kind = TOAST_PULL_DAEMON;
		path = slash + 1;
	} else {
		const char *colon = strchr(source, ':'), *slash = strchr(source, '/');
		if (colon && (!slash || colon < slash)) {
			const char *at = memchr(source, '@', (size_t)(colon - source));
			const char *host = at ? at + 1 : source;
			if (host == colon)
				return toast_err_set(err, TOAST_ERR_INVALID, "%s: no host before ':'", source);
			/* ssh would take such a host for an option */
			if (host[0] == '-')
				return toast_err_set(err, TOAST_ERR_INVALID, "%s: a host may not begin with '-'", source);
			if (colon[1] == ':') {
				if (!colon[2])
					return toast_err_set(err, TOAST_ERR_INVALID, "%s: expected HOST::MODULE[/PATH]", source);
				*kind = TOAST_PULL_DAEMON;
				path = colon + 2;
			} else {
				*kind = TOAST_PULL_SSH;
				path = colon + 1;
			}
		} else {
			*kind = TOAST_PULL_LOCAL;
			path = source;
		}
	}
	/* an rsync older than 3.2.4 hands a remote path to the remote rsync's option parser */
	if (*kind != TOAST_PULL_LOCAL && path[0] == '-')
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: a remote path may not begin with '-'", source);
	size_t e = strlen(path), b;
	while (e > 0 && path[e - 1] == '/')
		e--;
	for (b = e; b > 0 && path[b - 1] != '/';)
		b--;
	/* no default directory for ".", "..", "~" or a hidden name: the model must stay visible */
	if (e > b && e - b < name_size && path[b] != '.' && path[b] != '~') {
		memcpy(name, path + b, e - b);
		name[e - b] = 0;
	}
	return TOAST_OK;
}

/* source + "/" + tail, without doubling a '/' or following a bare "host:" */
static enum toast_status pull_source_join(char *buf, size_t n, const char *source, const char *tail,
					  struct toast_error *err)
{
	size_t len = strlen(source);
	bool sep = source[len - 1] != '/' && source[len - 1] != ':';
	if ((size_t)snprintf(buf, n, "%s%s%s", source, sep ? "/" : "", tail) >= n)
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: too long", source);
	return TOAST_OK;
}

/* the absolute destination: o->dest, or $HOME/models/NAME */
static enum toast_status pull_dest_path(const struct toast_pull_opts *o, const char *name, char *out, size_t n,
					struct toast_error *err)
{
	char rel[PULL_MAX_DEST + 256];
	if (o->dest && *o->dest) {
		if (strlen(o->dest) > PULL_MAX_DEST)
			return toast_err_set(err, TOAST_ERR_INVALID, "DEST longer than %d bytes", PULL_MAX_DEST);
		snprintf(rel, sizeof(rel), "%s", o->dest);
	} else {
		const char *home = getenv("HOME");
		if (!*name)
			return toast_err_set(err, TOAST_ERR_INVALID, "%s: cannot tell the model's name from SOURCE; give DEST",
					     o->source);
		if (!home || !*home)
			return toast_err_set(err, TOAST_ERR_INVALID, "HOME is not set; give DEST");
		if ((size_t)snprintf(rel, sizeof(rel), "%s/models/%s", home, name) > PULL_MAX_DEST)
			return toast_err_set(err, TOAST_ERR_INVALID, "%s/models/%s: too long", home, name);
	}
	if (pull_has_control(rel))
		return toast_err_set(err, TOAST_ERR_INVALID, "DEST contains a control character");
	/* absolute, so that rsync never reads a ':' in it as a remote host */
	char cwd[PULL_MAX_DEST];
	if (rel[0] != '/' && !getcwd(cwd, sizeof(cwd)))
		return toast_err_set(err, TOAST_ERR_IO, "current directory: %s", strerror(errno));
	if ((size_t)snprintf(out, n, "%s%s%s", rel[0] == '/' ? "" : cwd, rel[0] == '/' ? "" : "/", rel) >= n ||
	    strlen(out) > PULL_MAX_DEST)
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: too long", rel);
	size_t len = strlen(out);
	while (len > 1 && out[len - 1] == '/')
		out[--len] = 0;
	return TOAST_OK;
}

/* mkdir -p path; *created when path itself was made */
static enum toast_status pull_mkdirs(char *path, bool *created, struct toast_error *err)
{
	*created = false;
	struct stat st;
	if (stat(path, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			return toast_err_set(err, TOAST_ERR_INVALID, "%s exists and is not a directory", path);
		return TOAST_OK;
	}
	if (errno != ENOENT && errno != ENOTDIR)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
		*p = '/';
		if (bad)
			break; /* the final mkdir reports it */
	}
	if (mkdir(path, 0755) != 0)
		return toast_err_set(err, TOAST_ERR_IO, "cannot create %s: %s", path, strerror(errno));
	*created = true;
	return TOAST_OK;
}

/* An existing DEST must be empty or hold a model a pull wrote: never scatter files into an
 * unrelated directory (a home directory, say). */
static enum toast_status pull_dest_usable(const char *dest, struct toast_error *err)
{
	DIR *d = opendir(dest);
	if (!d)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", dest, strerror(errno));
	bool empty = true, ours = false;
	struct dirent *de;
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		if (strcmp(n, TOAST_MODELDIR_MARKER) == 0 || strcmp(n, TOAST_MANIFEST_NAME) == 0)
			ours = true;
		else if (strcmp(n, ".") != 0 && strcmp(n, "..") != 0 && strncmp(n, ".toasted-", 9) != 0)
			empty = false;
	}
	closedir(d);
	if (!empty && !ours)
		return toast_err_set(err, TOAST_ERR_INVALID,
				     "%s is not empty and holds no model pulled by toasted (no %s); pull into a new or "
				     "empty directory",
				     dest, TOAST_MANIFEST_NAME);
	return TOAST_OK;
}

static enum toast_status pull_local_source(const char *source, struct toast_error *err)
{
	struct stat st;
	char path[PULL_MAX_SOURCE + 64];
	if (stat(source, &st) != 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", source, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s is not a directory", source);
	enum toast_status rc = pull_source_join(path, sizeof(path), source, TOAST_MANIFEST_NAME, err);
	if (rc == TOAST_OK && stat(path, &st) != 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "%s has no %s; write it with: toasted publish %s", source,
				     TOAST_MANIFEST_NAME, source);
	return rc;
}

/* A local DEST must be neither SOURCE nor inside it (rsync would copy the copy). */
static enum toast_status pull_local_overlap(const char *source, const char *dest, struct toast_error *err)
{
	char *s = realpath(source, NULL), *d = realpath(dest, NULL);
	enum toast_status rc = TOAST_OK;
	if (!s || !d) {
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", s ? dest : source, strerror(errno));
	} else {
		size_t sl = strlen(s);
		if (strcmp(s, d) == 0 || (strncmp(s, d, sl) == 0 && (d[sl] == '/' || sl == 1)))
			rc = toast_err_set(err, TOAST_ERR_INVALID, "%s is %s %s", dest,
					   strcmp(s, d) == 0 ? "the same directory as" : "inside", source);
	}
	free(s);
	free(d);
	return rc;
}

struct pull_args {
	char *v[PULL_MAX_ARGS + 1];
	int n;
	char timeout[32], bwlimit[48];
};

static void pull_arg(struct pull_args *a, const char *s)
{
	if (a->n < PULL_MAX_ARGS) /* the vectors below are far shorter */
		a->v[a->n++] = (char *)s;
	a->v[a->n] = NULL;
}

static void pull_args_common(struct pull_args *a, const struct toast_pull_opts *o, enum toast_pull_kind kind)
{
	a->n = 0;
	pull_arg(a, "rsync");
	pull_arg(a, "--times");
	pull_arg(a, "--copy-links");
	pull_arg(a, "--stats");
	pull_arg(a, "--no-human-readable");
	snprintf(a->timeout, sizeof(a->timeout), "--timeout=%d", PULL_TIMEOUT_S);
	pull_arg(a, a->timeout);
	if (kind == TOAST_PULL_DAEMON)
		pull_arg(a, "--contimeout=30");
	if (o->bwlimit_kbps > 0) {
		snprintf(a->bwlimit, sizeof(a->bwlimit), "--bwlimit=%ld", o->bwlimit_kbps);
		pull_arg(a, a->bwlimit);
	}
}

void toast_pull_format_bytes(char *buf, size_t n, double bytes)
{
	const char *u[] = {"B", "kB", "MB", "GB", "TB"};
	int i = 0;
	while (bytes >= 1000 && i < 4) {
		bytes /= 1000;
		i++;
	}
	snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
}

/* The error for a failed rsync run; manifest: it was fetching SHA256SUMS. */
static enum toast_status pull_rsync_error(const struct toast_rsync_result *r, const char *source, const char *dest,
					  bool manifest, struct toast_error *err)
{
	const char *msg = r->message[0] ? r->message : "rsync said nothing";
	if (r->cancelled || r->exit_code == 20)
		return toast_err_set(err, TOAST_ERR_CANCELLED, "interrupted");
	if (r->disk_full) {
		struct statvfs vfs;
		char avail[32] = "?";
		if (statvfs(dest, &vfs) == 0)
			toast_pull_format_bytes(avail, sizeof(avail), (double)vfs.f_bavail * (double)vfs.f_frsize);
		return toast_err_set(err, TOAST_ERR_IO, "%s: disk full (%s available): %s", dest, avail, msg);
	}
	switch (r->exit_code) {
	case 1:
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "rsync refused its options (toasted needs rsync 3.1 or later): %s",
				     msg);
	case 5:  /* error starting the client-server protocol */
	case 10: /* socket I/O */
	case 12: /* protocol data stream: the remote shell or rsync went away */
	case 14: /* IPC (the remote shell could not be started) */
	case 35: /* timeout waiting for the daemon */
	case 255: /* ssh */
		return toast_err_set(err, TOAST_ERR_IO, "%s %s: %s", manifest ? "cannot reach" : "lost the connection to",
				     source, msg);
	case 30:
		return toast_err_set(err, TOAST_ERR_IO, "%s sent nothing for %d s: %s", source, PULL_TIMEOUT_S, msg);
	case 23:
	case 24:
		if (manifest && strstr(msg, "No such file"))
			return toast_err_set(err, TOAST_ERR_IO,
					     "%s does not exist or has no %s (%s); on the source, write it with: toasted "
					     "publish DIR",
					     source, TOAST_MANIFEST_NAME, msg);
		break;
	}
	return toast_err_set(err, TOAST_ERR_IO, "rsync failed (exit %d) pulling %s: %s", r->exit_code, source, msg);
}

/* fetch SOURCE/SHA256SUMS into DEST/PULL_TMP_MANIFEST and parse it */
static enum toast_status pull_fetch_manifest(const struct toast_pull_opts *o, enum toast_pull_kind kind,
					     const char *dest, struct toast_manifest *m, struct toast_pull_result *res,
					     struct toast_error *err)
{
	char src[PULL_MAX_SOURCE + 64], tmp[PULL_MAX_DEST + 64];
	enum toast_status rc = pull_source_join(src, sizeof(src), o->source, TOAST_MANIFEST_NAME, err);
	if (rc != TOAST_OK)
		return rc;
	toast_path_join(tmp, sizeof(tmp), dest, PULL_TMP_MANIFEST);
	struct pull_args a;
	pull_args_common(&a, o, kind);
	pull_arg(&a, "--");
	pull_arg(&a, src);
	pull_arg(&a, tmp);
	struct toast_rsync_result r;
	rc = toast_rsync_run(a.v, o->cancel, NULL, NULL, &r, err);
	if (rc != TOAST_OK)
		return rc;
	res->received_bytes += r.received_bytes;
	if (r.exit_code != 0 || r.cancelled) {
		unlink(tmp);
		return pull_rsync_error(&r, o->source, dest, true, err);
	}
	char *text = NULL;
	size_t len;
	rc = toast_read_file(tmp, TOAST_MANIFEST_MAX_BYTES, &text, &len, err);
	if (rc == TOAST_OK)
		rc = toast_manifest_parse(m, text, len, src, err);
	free(text);
	if (rc != TOAST_OK)
		unlink(tmp);
	return rc;
}

/* Move rsync temporaries of manifest files (".NAME.XXXXXX") into .toasted-partial/NAME. */
static enum toast_status pull_adopt_visit(void *ud, const char *path, const char *rel, const struct stat *st,
					  struct toast_error *err)
{
	const struct toast_manifest *m = ud;
	const char *base = strrchr(rel, '/');
	size_t dir_len = base ? (size_t)(base + 1 - rel) : 0;
	base = base ? base + 1 : rel;
	size_t bl = strlen(base);
	if (!S_ISREG(st->st_mode) || base[0] != '.' || bl < 9 || base[bl - 7] != '.')
		return TOAST_OK;
	char name[TOAST_MANIFEST_MAX_NAME + 1], part[PULL_MAX_DEST + TOAST_MANIFEST_MAX_NAME + 64];
	size_t nl = bl - 8; /* without the leading '.' and the ".XXXXXX" suffix */
	memcpy(name, rel, dir_len);
	memcpy(name + dir_len, base + 1, nl);
	name[dir_len + nl] = 0;
	if (toast_manifest_find(m, name) < 0)
		return TOAST_OK;
	int pdl = (int)(strlen(path) - bl);
	snprintf(part, sizeof(part), "%.*s" TOAST_PULL_PARTIAL_DIR, pdl, path);
	if (mkdir(part, 0700) != 0 && errno != EEXIST)
		return TOAST_OK; /* rsync will start that file over */
	snprintf(part + strlen(part), sizeof(part) - strlen(part), "/%.*s", (int)nl, base + 1);
	struct stat ps;
	if (stat(part, &ps) == 0 && ps.st_size >= st->st_size)
		unlink(path);
	else if (rename(path, part) == 0)
		TOAST_INFO("%s: kept %lld bytes of an interrupted transfer to resume from", name, (long long)st->st_size);
	return TOAST_OK;
}

static void pull_fetch_progress(void *ud, const struct toast_rsync_progress *rp)
{
	const struct toast_pull_opts *o = ud;
	struct toast_pull_progress p = {
		.phase = TOAST_PULL_FETCH,
		.done_bytes = rp->done_bytes,
		.total_bytes = rp->percent > 0 ? rp->done_bytes * 100 / (uint64_t)rp->percent : 0,
		.percent = rp->percent,
		.file = rp->file,
	};
	o->progress(o->progress_ud, &p);
}

static enum toast_status pull_fetch_files(const struct toast_pull_opts *o, enum toast_pull_kind kind,
					  const char *dest, struct toast_pull_result *res, struct toast_error *err)
{
	char src[PULL_MAX_SOURCE + 8], dst[sizeof(res->dest) + 2];
	enum toast_status rc = pull_source_join(src, sizeof(src), o->source, "", err);
	if (rc != TOAST_OK)
		return rc;
	snprintf(dst, sizeof(dst), "%s/", dest);
	struct pull_args a;
	pull_args_common(&a, o, kind);
	pull_arg(&a, "--recursive");
	pull_arg(&a, "--partial-dir=" TOAST_PULL_PARTIAL_DIR);
	pull_arg(&a, "--no-inc-recursive"); /* the whole file list first: the percentage is of everything */
	pull_arg(&a, "--exclude=.*");
	pull_arg(&a, "--exclude=/" TOAST_MANIFEST_NAME); /* the one fetched first is the one verified */
	pull_arg(&a, "--info=progress2");
	pull_arg(&a, "--out-format=file: %n");
	pull_arg(&a, "--");
	pull_arg(&a, src);
	pull_arg(&a, dst);
	struct toast_rsync_result r;
	rc = toast_rsync_run(a.v, o->cancel, o->progress ? pull_fetch_progress : NULL, (void *)o, &r, err);
	if (rc != TOAST_OK)
		return rc;
	res->received_bytes += r.received_bytes;
	res->literal_bytes += r.literal_bytes;
	res->matched_bytes += r.matched_bytes;
	res->n_transferred = r.n_transferred;
	/* 24: a file vanished on the source while it was copied; verification decides */
	if ((r.exit_code != 0 && r.exit_code != 24) || r.cancelled)
		return pull_rsync_error(&r, o->source, dest, false, err);
	return TOAST_OK;
}

struct pull_hash_ctx {
	toast_pull_progress_fn fn;
	void *ud;
};

static void pull_hash_progress(void *ud, const struct toast_hash_progress *hp)
{
	const struct pull_hash_ctx *c = ud;
	struct toast_pull_progress p = {
		.phase = TOAST_PULL_VERIFY,
		.done_bytes = hp->done_bytes,
		.total_bytes = hp->total_bytes,
		.percent = hp->total_bytes ? (int)(hp->done_bytes * 100 / hp->total_bytes) : 100,
		.file = "",
	};
	c->fn(c->ud, &p);
}

static enum toast_status pull_hash(struct toast_manifest *m, const char *dir, int n_threads,
				   const volatile sig_atomic_t *cancel, toast_pull_progress_fn fn, void *ud,
				   struct toast_error *err)
{
	struct pull_hash_ctx c = {fn, ud};
	return toast_manifest_hash(m, dir, n_threads, cancel, fn ? pull_hash_progress : NULL, &c, err);
}

static enum toast_status pull_verify(struct toast_manifest *m, const char *dest, const struct toast_pull_opts *o,
				     struct toast_pull_result *res, struct toast_error *err)
{
	enum toast_status rc = pull_hash(m, dest, o->n_threads, o->cancel, o->progress, o->progress_ud, err);
	if (rc != TOAST_OK)
		return rc;
	/* the first bad files by name, short enough that the resume hint still fits the message */
	char list[200] = "", path[PULL_MAX_DEST + TOAST_MANIFEST_MAX_NAME + 8];
	size_t used = 0;
	int n_bad = 0;
	bool cut = false;
	for (int i = 0; i < m->n_files; i++) {
		struct toast_manifest_file *f = &m->files[i];
		const char *why = f->hash_errno == ENOENT ? "missing"
				  : f->hash_errno		 ? strerror(f->hash_errno)
				  : memcmp(f->got, f->sha256, 32) ? "wrong SHA-256"
								   : NULL;
		if (!why) {
			res->n_files++;
			res->total_bytes += f->size_bytes;
			continue;
		}
		n_bad++;
		size_t need = strlen(f->name) + strlen(why) + 5; /* ", NAME (WHY)" */
		if (!cut && used + need + 6 < sizeof(list)) {
			used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s (%s)", used ? ", " : "", f->name, why);
		} else if (!cut) {
			cut = true;
			snprintf(list + used, sizeof(list) - used, "%s...", used ? ", " : "");
		}
		const struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, {0, 0}};
		if (f->hash_errno == 0 && toast_path_join(path, sizeof(path), dest, f->name))
			utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW);
	}
	if (n_bad)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%d of %d files do not match %s: %s", n_bad, m->n_files,
				     TOAST_MANIFEST_NAME, list);
	return TOAST_OK;
}

/* warn about files in dest that the manifest does not list */
static void pull_report_unlisted(const struct toast_manifest *m, const char *dest, struct toast_pull_result *res)
{
	struct toast_manifest have;
	if (toast_manifest_scan(&have, dest, NULL) != TOAST_OK)
		return;
	for (int i = 0; i < have.n_files; i++) {
		if (toast_manifest_find(m, have.files[i].name) >= 0)
			continue;
		if (res->n_unlisted++ < PULL_MAX_UNLISTED_WARNINGS)
			TOAST_WARN("%s/%s: not listed in %s (left alone, not verified)", dest, have.files[i].name,
				   TOAST_MANIFEST_NAME);
	}
	toast_manifest_free(&have);
}

/* The steps after DEST is marked incomplete; every failure leaves the marker. */
static enum toast_status pull_into(const struct toast_pull_opts *o, enum toast_pull_kind kind, const char *dest,
				   int lock, struct toast_manifest *m, struct toast_pull_result *res,
				   struct toast_error *err)
{
	char tmp[PULL_MAX_DEST + 64], final[PULL_MAX_DEST + 64];
	toast_path_join(tmp, sizeof(tmp), dest, PULL_TMP_MANIFEST);
	toast_path_join(final, sizeof(final), dest, TOAST_MANIFEST_NAME);
	enum toast_status rc = toast_modeldir_mark_incomplete(dest, o->source, err);
	if (rc != TOAST_OK) {
		unlink(tmp);
		return rc;
	}
	if (rename(tmp, final) != 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", final, strerror(errno));
	rc = toast_manifest_walk(dest, pull_adopt_visit, m, err);
	if (rc == TOAST_OK)
		rc = pull_fetch_files(o, kind, dest, res, err);
	if (rc == TOAST_OK)
		rc = pull_verify(m, dest, o, res, err);
	/* rsync does not flush what it wrote: the files must be on disk before the marker goes */
	if (rc == TOAST_OK && syncfs(lock) != 0)
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: sync: %s", dest, strerror(errno));
	if (rc == TOAST_OK) {
		pull_report_unlisted(m, dest, res);
		toast_path_join(tmp, sizeof(tmp), dest, TOAST_PULL_PARTIAL_DIR);
		rmdir(tmp); /* rsync leaves it empty; anything still in it is not ours to delete */
		rc = toast_modeldir_mark_complete(dest, err);
	}
	return rc;
}

enum toast_status toast_pull(const struct toast_pull_opts *o, struct toast_pull_result *res, struct toast_error *err)
{
	memset(res, 0, sizeof(*res));
	enum toast_pull_kind kind;
	char name[256];
	enum toast_status rc = toast_pull_source_parse(o->source, &kind, name, sizeof(name), err);
	if (rc == TOAST_OK && o->bwlimit_kbps < 0)
		rc = toast_err_set(err, TOAST_ERR_INVALID, "negative bandwidth limit");
	if (rc == TOAST_OK && kind == TOAST_PULL_LOCAL)
		rc = pull_local_source(o->source, err);
	if (rc == TOAST_OK)
		rc = pull_dest_path(o, name, res->dest, sizeof(res->dest), err);
	if (rc != TOAST_OK)
		return rc;
	char *dest = res->dest;
	bool created;
	rc = pull_mkdirs(dest, &created, err);
	if (rc == TOAST_OK && !created)
		rc = pull_dest_usable(dest, err);
	if (rc == TOAST_OK && kind == TOAST_PULL_LOCAL)
		rc = pull_local_overlap(o->source, dest, err);
	if (rc != TOAST_OK) {
		if (created)
			rmdir(dest);
		return rc;
	}
	/* one pull at a time per directory; the lock goes with the descriptor */
	int lock = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		if (lock >= 0)
			close(lock);
		if (created)
			rmdir(dest);
		if (e == EWOULDBLOCK)
			return toast_err_set(err, TOAST_ERR_BUSY, "%s: another toasted pull is writing to it", dest);
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", dest, strerror(e));
	}
	struct toast_manifest m = {0};
	rc = pull_fetch_manifest(o, kind, dest, &m, res, err);
	if (rc != TOAST_OK) {
		if (created)
			rmdir(dest);
	} else {
		rc = pull_into(o, kind, dest, lock, &m, res, err);
		if (rc != TOAST_OK && err) {
			char hint[1200];
			size_t len = strlen(err->msg);
			toast_modeldir_resume_hint(hint, sizeof(hint), o->source, dest);
			snprintf(err->msg + len, sizeof(err->msg) - len, "; resume with: %s", hint);
		}
	}
	toast_manifest_free(&m);
	close(lock);
	return rc;
}

enum toast_status toast_publish(const char *dir, int n_threads, const volatile sig_atomic_t *cancel,
				toast_pull_progress_fn progress, void *progress_ud, struct toast_publish_result *res,
				struct toast_error *err)
{
	memset(res, 0, sizeof(*res));
	struct stat st;
	if (stat(dir, &st) != 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s is not a directory", dir);
	enum toast_status rc = toast_modeldir_check(dir, err);
	if (rc != TOAST_OK)
		return rc;
	struct toast_manifest m;
	rc = toast_manifest_scan(&m, dir, err);
	if (rc != TOAST_OK)
		return rc;
	if (m.n_files == 0)
		rc = toast_err_set(err, TOAST_ERR_INVALID, "%s holds no files to publish (hidden files do not count)", dir);
	if (rc == TOAST_OK)
		rc = pull_hash(&m, dir, n_threads, cancel, progress, progress_ud, err);
	for (int i = 0; rc == TOAST_OK && i < m.n_files; i++) {
		struct toast_manifest_file *f = &m.files[i];
		if (f->hash_errno)
			rc = toast_err_set(err, TOAST_ERR_IO, "%s/%s: %s", dir, f->name, strerror(f->hash_errno));
		memcpy(f->sha256, f->got, 32);
		res->total_bytes += f->size_bytes;
	}
	if (rc == TOAST_OK)
		rc = toast_manifest_write(&m, dir, err);
	if (rc == TOAST_OK)
		res->n_files = m.n_files;
	toast_manifest_free(&m);
	return rc;
}
