/*
 * manifest.c - SHA-256 of files and the SHA256SUMS manifest (see manifest.h).
 *
 * SHA-256 comes from nettle (Debian's libnettle8, the crypto core of GnuTLS), chosen over code of
 * our own: it is small, well kept and tested, and its "fat" build picks the x86 SHA-NI or ARMv8
 * SHA-2 instructions at run time. Measured on this project's build machine (docs/PERF.md) it
 * hashes 1.6 GB per CPU-second, where coreutils sha256sum (portable C) manages 0.32: verifying a
 * 45 GB model is then bound by the disk, not the hash. OpenSSL's is 8 % faster, not enough to
 * prefer the larger library; a SHA-NI implementation of our own would be code to maintain for
 * nothing.
 *
 * Manifests come from the network: their size, line count and name lengths are bounded, and a
 * name that could leave the model directory (absolute, "..") is refused before any file is
 * touched. Hashing runs one file per thread; a thread reads its file sequentially in 1 MiB
 * blocks, so a model of many shards is read with several streams at once.
 */
#define _GNU_SOURCE
#include "pull/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/fs.h"
#include "util/pool.h"

#define MANIFEST_BLOCK (1u << 20)
#define MANIFEST_MAX_DEPTH 32
#define MANIFEST_MAX_THREADS 8

void toast_sha256_hex(const unsigned char d[32], char out[65])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[d[i] >> 4];
		out[2 * i + 1] = hex[d[i] & 15];
	}
	out[64] = 0;
}

/* Hash fd to its end; adds each block to *done. Returns 0 or an errno (ECANCELED on *stop). */
static int manifest_hash_fd(int fd, unsigned char out[32], unsigned char *buf, uint64_t *n_bytes,
			    _Atomic uint64_t *done, atomic_int *stop)
{
	struct sha256_ctx ctx;
	sha256_init(&ctx);
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	*n_bytes = 0;
	for (;;) {
		if (stop && atomic_load(stop))
			return ECANCELED;
		ssize_t r = read(fd, buf, MANIFEST_BLOCK);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno;
		if (r == 0)
			break;
		sha256_update(&ctx, (size_t)r, buf);
		*n_bytes += (uint64_t)r;
		if (done)
			atomic_fetch_add(done, (uint64_t)r);
	}
	sha256_digest(&ctx, SHA256_DIGEST_SIZE, out);
	return 0;
}

/* open path as a regular file for hashing; -1 with errno set otherwise */
static int manifest_open(const char *path)
{
	/* O_NONBLOCK: opening a FIFO that stands where a file should be must not hang */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -1;
	struct stat st;
	int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : !S_ISREG(st.st_mode) ? EINVAL : 0;
	if (e) {
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

enum toast_status toast_sha256_file(const char *path, unsigned char out[32], struct toast_error *err)
{
	unsigned char *buf = malloc(MANIFEST_BLOCK);
	if (!buf)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	int fd = manifest_open(path), e = fd < 0 ? errno : 0;
	uint64_t n;
	if (fd >= 0) {
		e = manifest_hash_fd(fd, out, buf, &n, NULL, NULL);
		close(fd);
	}
	free(buf);
	if (e)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	return TOAST_OK;
}

void toast_manifest_free(struct toast_manifest *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_files; i++)
		free(m->files[i].name);
	free(m->files);
	m->files = NULL;
	m->n_files = 0;
}

static int manifest_cmp(const void *a, const void *b)
{
	return strcmp(((const struct toast_manifest_file *)a)->name, ((const struct toast_manifest_file *)b)->name);
}

int toast_manifest_find(const struct toast_manifest *m, const char *name)
{
	int lo = 0, hi = m->n_files - 1;
	while (lo <= hi) {
		int mid = lo + (hi - lo) / 2, c = strcmp(m->files[mid].name, name);
		if (c == 0)
			return mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

/* Append a file named name (copied); the array grows geometrically. */
static enum toast_status manifest_add(struct toast_manifest *m, int *cap, const char *name, size_t len,
				      struct toast_error *err)
{
	if (m->n_files >= TOAST_MANIFEST_MAX_FILES)
		return toast_err_set(err, TOAST_ERR_FORMAT, "more than %d files", TOAST_MANIFEST_MAX_FILES);
	if (m->n_files == *cap) {
		int ncap = *cap ? *cap * 2 : 64;
		void *p = realloc(m->files, (size_t)ncap * sizeof(*m->files));
		if (!p)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		m->files = p;
		*cap = ncap;
	}
	struct toast_manifest_file *f = &m->files[m->n_files];
	memset(f, 0, sizeof(*f));
	f->name = malloc(len + 1);
	if (!f->name)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	memcpy(f->name, name, len);
	f->name[len] = 0;
	m->n_files++;
	return TOAST_OK;
}

/* NULL when name is an acceptable model file path, else why not */
static const char *manifest_name_problem(const char *name, size_t len)
{
	if (len == 0)
		return "empty name";
	if (len > TOAST_MANIFEST_MAX_NAME)
		return "name too long";
	if (memchr(name, 0, len))
		return "NUL in name";
	if (name[0] == '/')
		return "absolute path";
	for (size_t i = 0; i < len;) {
		size_t j = i;
		while (j < len && name[j] != '/')
			j++;
		if (j == i)
			return "empty path component";
		if (name[i] == '.')
			return "\".\", \"..\" or hidden path component (a model has no hidden files)";
		i = j + 1;
		if (j + 1 == len)
			return "trailing '/'";
	}
	return NULL;
}

static int manifest_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* One manifest line (without its newline) into m; unescapes into name (TOAST_MANIFEST_MAX_NAME+1) */
static enum toast_status manifest_parse_line(struct toast_manifest *m, int *cap, const char *line, size_t len,
					     char *name, const char *what, int lineno, struct toast_error *err)
{
	bool escaped = len > 0 && line[0] == '\\';
	if (escaped) {
		line++;
		len--;
	}
	unsigned char d[32];
	if (len < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*'))
		return toast_err_set(err, TOAST_ERR_FORMAT,
				     "%s: line %d: expected 64 hex digits, two spaces (or \" *\") and a file name", what,
				     lineno);
	for (int i = 0; i < 32; i++) {
		int hi = manifest_hexval(line[2 * i]), lo = manifest_hexval(line[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: line %d: the digest is not 64 hex digits", what,
					     lineno);
		d[i] = (unsigned char)(hi << 4 | lo);
	}
	const char *raw = line + 66;
	size_t rlen = len - 66, n = 0;
	for (size_t i = 0; i < rlen; i++) {
		char c = raw[i];
		if (escaped && c == '\\') {
			char e = i + 1 < rlen ? raw[++i] : 0;
			c = e == '\\' ? '\\' : e == 'n' ? '\n' : e == 'r' ? '\r' : 0;
			if (!c)
				return toast_err_set(err, TOAST_ERR_FORMAT, "%s: line %d: bad escape in the file name", what,
						     lineno);
		}
		if (n >= TOAST_MANIFEST_MAX_NAME)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: line %d: file name longer than %d bytes", what,
					     lineno, TOAST_MANIFEST_MAX_NAME);
		name[n++] = c;
	}
	name[n] = 0;
	const char *nm = name;
	if (n >= 2 && nm[0] == '.' && nm[1] == '/') {
		nm += 2;
		n -= 2;
	}
	if (strcmp(nm, TOAST_MANIFEST_NAME) == 0)
		return TOAST_OK; /* a manifest cannot hold its own digest */
	const char *why = manifest_name_problem(nm, n);
	if (why)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: line %d: %.200s: %s", what, lineno, nm, why);
	enum toast_status rc = manifest_add(m, cap, nm, n, err);
	if (rc != TOAST_OK)
		return toast_err_prefix(err, "%s: ", what);
	memcpy(m->files[m->n_files - 1].sha256, d, 32);
	return TOAST_OK;
}

enum toast_status toast_manifest_parse(struct toast_manifest *m, const char *text, size_t len, const char *what,
				       struct toast_error *err)
{
	memset(m, 0, sizeof(*m));
	if (len > TOAST_MANIFEST_MAX_BYTES)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: larger than %u bytes", what, TOAST_MANIFEST_MAX_BYTES);
	char *name = malloc(TOAST_MANIFEST_MAX_NAME + 1);
	if (!name)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	int cap = 0, lineno = 0;
	enum toast_status rc = TOAST_OK;
	for (size_t i = 0; i < len && rc == TOAST_OK;) {
		const char *nl = memchr(text + i, '\n', len - i);
		size_t end = nl ? (size_t)(nl - text) : len, l = end - i;
		lineno++;
		if (l > 0 && text[i + l - 1] == '\r')
			l--;
		if (l > 0)
			rc = manifest_parse_line(m, &cap, text + i, l, name, what, lineno, err);
		i = end + 1;
	}
	free(name);
	if (rc == TOAST_OK && m->n_files == 0)
		rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: lists no files", what);
	if (rc == TOAST_OK) {
		qsort(m->files, (size_t)m->n_files, sizeof(*m->files), manifest_cmp);
		for (int i = 1; i < m->n_files && rc == TOAST_OK; i++)
			if (strcmp(m->files[i - 1].name, m->files[i].name) == 0)
				rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: %.200s is listed twice", what,
						   m->files[i].name);
	}
	if (rc != TOAST_OK)
		toast_manifest_free(m);
	return rc;
}

enum toast_status toast_manifest_load(struct toast_manifest *m, const char *path, struct toast_error *err)
{
	memset(m, 0, sizeof(*m));
	char *text;
	size_t len;
	enum toast_status rc = toast_read_file(path, TOAST_MANIFEST_MAX_BYTES, &text, &len, err);
	if (rc != TOAST_OK)
		return rc;
	rc = toast_manifest_parse(m, text, len, path, err);
	free(text);
	return rc;
}

/* Visit the entries of the directory path (path_len bytes, with room up to rel_off +
 * TOAST_MANIFEST_MAX_NAME + 1), descending into non-hidden subdirectories. */
static enum toast_status manifest_walk_dir(char *path, size_t path_len, size_t rel_off, int depth,
					   toast_walk_fn fn, void *ud, struct toast_error *err)
{
	if (depth > MANIFEST_MAX_DEPTH)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: directories nested deeper than %d (a link loop?)", path,
				     MANIFEST_MAX_DEPTH);
	DIR *d = opendir(path);
	if (!d)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	enum toast_status rc = TOAST_OK;
	struct dirent *de;
	while (rc == TOAST_OK && (de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		bool hidden = de->d_name[0] == '.';
		size_t nl = strlen(de->d_name), len = path_len + 1 + nl;
		if (len > rel_off + TOAST_MANIFEST_MAX_NAME) {
			if (!hidden)
				rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s/%s: path too long", path, de->d_name);
			continue;
		}
		path[path_len] = '/';
		memcpy(path + path_len + 1, de->d_name, nl + 1);
		struct stat st;
		if (stat(path, &st) != 0) {
			if (!hidden)
				rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
		} else {
			rc = fn(ud, path, path + rel_off, &st, err);
			if (rc == TOAST_OK && S_ISDIR(st.st_mode) && !hidden)
				rc = manifest_walk_dir(path, len, rel_off, depth + 1, fn, ud, err);
		}
		path[path_len] = 0;
	}
	closedir(d);
	return rc;
}

enum toast_status toast_manifest_walk(const char *dir, toast_walk_fn fn, void *ud, struct toast_error *err)
{
	size_t dl = strlen(dir);
	while (dl > 1 && dir[dl - 1] == '/')
		dl--;
	char *path = malloc(dl + TOAST_MANIFEST_MAX_NAME + 2);
	if (!path)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	memcpy(path, dir, dl);
	path[dl] = 0;
	enum toast_status rc = manifest_walk_dir(path, dl, dl + 1, 0, fn, ud, err);
	free(path);
	return rc;
}

struct manifest_scan {
	struct toast_manifest *m;
	int cap;
};

static enum toast_status manifest_scan_visit(void *ud, const char *path, const char *rel, const struct stat *st,
					     struct toast_error *err)
{
	struct manifest_scan *s = ud;
	const char *base = strrchr(rel, '/');
	base = base ? base + 1 : rel;
	if (!S_ISREG(st->st_mode) || base[0] == '.' || strcmp(rel, TOAST_MANIFEST_NAME) == 0)
		return TOAST_OK;
	return manifest_add(s->m, &s->cap, rel, strlen(rel), err);
}

enum toast_status toast_manifest_scan(struct toast_manifest *m, const char *dir, struct toast_error *err)
{
	memset(m, 0, sizeof(*m));
	struct manifest_scan s = {m, 0};
	enum toast_status rc = toast_manifest_walk(dir, manifest_scan_visit, &s, err);
	if (rc == TOAST_OK)
		qsort(m->files, (size_t)m->n_files, sizeof(*m->files), manifest_cmp);
	else
		toast_manifest_free(m);
	return rc;
}

struct manifest_job {
	struct toast_manifest *m;
	const char *dir;
	atomic_int next, stop;
	_Atomic uint64_t done;
	pthread_mutex_t lock;
	pthread_cond_t finished; /* signalled when n_running drops to 0 */
	int n_running;
};

static void *manifest_worker(void *arg)
{
	struct manifest_job *j = arg;
	unsigned char *buf = malloc(MANIFEST_BLOCK);
	char path[8192];
	for (;;) {
		int i = atomic_fetch_add(&j->next, 1);
		if (i >= j->m->n_files)
			break;
		struct toast_manifest_file *f = &j->m->files[i];
		if (!buf) {
			f->hash_errno = ENOMEM;
			continue;
		}
		if (!toast_path_join(path, sizeof(path), j->dir, f->name)) {
			f->hash_errno = ENAMETOOLONG;
			continue;
		}
		int fd = manifest_open(path);
		f->hash_errno = fd < 0 ? errno : manifest_hash_fd(fd, f->got, buf, &f->size_bytes, &j->done, &j->stop);
		if (fd >= 0)
			close(fd);
	}
	free(buf);
	pthread_mutex_lock(&j->lock);
	if (--j->n_running == 0)
		pthread_cond_signal(&j->finished);
	pthread_mutex_unlock(&j->lock);
	return NULL;
}

enum toast_status toast_manifest_hash(struct toast_manifest *m, const char *dir, int n_threads,
				      const volatile sig_atomic_t *cancel, toast_hash_progress_fn fn, void *ud,
				      struct toast_error *err)
{
	struct toast_hash_progress p = {0};
	char path[8192];
	for (int i = 0; i < m->n_files; i++) {
		struct stat st;
		if (toast_path_join(path, sizeof(path), dir, m->files[i].name) && stat(path, &st) == 0)
			p.total_bytes += (uint64_t)st.st_size;
	}
	if (n_threads <= 0)
		n_threads = toast_cpu_count() < MANIFEST_MAX_THREADS ? toast_cpu_count() : MANIFEST_MAX_THREADS;
	if (n_threads > m->n_files)
		n_threads = m->n_files > 0 ? m->n_files : 1;
	struct manifest_job j = {.m = m, .dir = dir, .n_running = n_threads};
	atomic_init(&j.next, 0);
	atomic_init(&j.stop, 0);
	atomic_init(&j.done, 0);
	pthread_mutex_init(&j.lock, NULL);
	pthread_cond_init(&j.finished, NULL);
	pthread_t *th = calloc((size_t)n_threads, sizeof(*th));
	int started = 0;
	pthread_mutex_lock(&j.lock);
	for (; th && started < n_threads; started++)
		if (pthread_create(&th[started], NULL, manifest_worker, &j) != 0)
			break;
	j.n_running -= n_threads - started; /* those that did not start leave their files to the others */
	pthread_mutex_unlock(&j.lock);
	if (started == 0) {
		j.n_running = 1;
		manifest_worker(&j);
	}
	pthread_mutex_lock(&j.lock);
	while (j.n_running > 0) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 100 * 1000 * 1000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&j.finished, &j.lock, &until);
		if (cancel && *cancel)
			atomic_store(&j.stop, 1);
		p.done_bytes = atomic_load(&j.done);
		if (fn && j.n_running > 0) {
			pthread_mutex_unlock(&j.lock);
			fn(ud, &p);
			pthread_mutex_lock(&j.lock);
		}
	}
	pthread_mutex_unlock(&j.lock);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	free(th);
	pthread_cond_destroy(&j.finished);
	pthread_mutex_destroy(&j.lock);
	p.done_bytes = atomic_load(&j.done);
	if (fn)
		fn(ud, &p);
	if (atomic_load(&j.stop))
		return toast_err_set(err, TOAST_ERR_CANCELLED, "%s: hashing interrupted", dir);
	for (int i = 0; i < m->n_files; i++)
		if (m->files[i].hash_errno == ENOMEM)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	return TOAST_OK;
}

enum toast_status toast_manifest_write(const struct toast_manifest *m, const char *dir, struct toast_error *err)
{
	char tmp[4096], path[4096];
	if (!toast_path_join(tmp, sizeof(tmp), dir, ".toasted-publish-" TOAST_MANIFEST_NAME) ||
	    !toast_path_join(path, sizeof(path), dir, TOAST_MANIFEST_NAME))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	FILE *f = fopen(tmp, "we");
	if (!f)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	for (int i = 0; i < m->n_files; i++) {
		const char *name = m->files[i].name;
		char hex[65];
		toast_sha256_hex(m->files[i].sha256, hex);
		bool esc = strpbrk(name, "\\\n\r") != NULL;
		fprintf(f, "%s%s  ", esc ? "\\" : "", hex);
		for (const char *c = name; *c; c++) {
			if (esc && (*c == '\\' || *c == '\n' || *c == '\r'))
				fprintf(f, "\\%c", *c == '\\' ? '\\' : *c == '\n' ? 'n' : 'r');
			else
				fputc(*c, f);
		}
		fputc('\n', f);
	}
	int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
	int e = errno;
	if (fclose(f) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	if (!bad && rename(tmp, path) != 0) {
		bad = 1;
		e = errno;
	}
	if (bad) {
		unlink(tmp);
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(e));
	}
	return TOAST_OK;
}
