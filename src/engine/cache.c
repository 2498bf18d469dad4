/*
 * cache.c - the session cache (contract in toasted.h): snapshots of session state keyed by the
 * exact tokens they hold, kept in memory within a budget and, with a directory, in files.
 *
 * Invariants:
 * - an entry's tokens and hashes are always in memory; its state (image + logits) is in memory
 *   ("resident"), or only in its file (indexed at open, or dropped from memory for the budget
 *   while its file stays);
 * - held (state bytes of resident entries, plus their tokens) <= budget; file_bytes <= dir_budget;
 * - a state reaches a session only from memory: a file is first read whole into a new image
 *   and its checksums verified (a truncated, corrupted or foreign file is never loaded);
 * - a snapshot is restored into the session's own buffers, which never move (recorded CUDA
 *   graphs stay valid);
 * - the only session pointer kept between calls is the one mark_prompt and restore record,
 *   which save() compares with the session it is given.
 * The state layout is the model's (toast_model_state_save/load); this file owns the policy.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "engine/engine.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#define CACHE_MAX_ENTRIES 4096
#define CACHE_STAGE_BYTES ((size_t)64 << 20) /* host staging for files of device images */
#define CACHE_MIN_BUDGET ((size_t)256 << 20)  /* default when free memory is unknown */
#define CACHE_MAGIC "TOASTSNP"
#define CACHE_VERSION 1u

struct cache_entry {
	int32_t *tokens;    /* [n] */
	int n, n_mid;       /* the points: the end of the request, the end of its prompt (0: none) */
	uint64_t hash, hash_mid; /* FNV-1a of tokens [0, n) and [0, n_mid) */
	unsigned char *img; /* [kv_bytes(n) | rec at n | rec at n_mid]; NULL when only in the file */
	float *logits;      /* host [n_mid ? 2 : 1][n_vocab]: after token n, after token n_mid */
	uint64_t used;      /* LRU clock */
	bool in_file;
};

struct toast_cache {
	struct toast_backend *be;
	const struct toast_model *m;
	bool device; /* images in backend memory, else host memory */
	size_t budget, held, rec_bytes;
	int n_vocab;
	uint64_t fp, clock;
	char *dir;
	size_t dir_budget, file_bytes;
	struct cache_entry **ents;
	int n_ents;
	/* the request in progress */
	struct toast_session *req_s;  /* the session restore() prepared */
	int req_n;                    /* what it held then */
	struct cache_entry *parent;   /* the entry restore() used, or NULL */
	int mark_n;                   /* mark_prompt(): the end of the prompt, 0: none */
	void *stash_rec;              /* backend [rec_bytes]: the DeltaNet states at mark_n */
	float *stash_logits;          /* host [n_vocab] */
	struct toast_cache_stats st;
};

/* The file header; all fields native-endian (the magic and version catch a foreign layout). */
struct cache_hdr {
	char magic[8];
	uint32_t version, hdr_bytes;
	uint64_t model_fp;
	int32_t n, n_mid;
	uint64_t kv_bytes, rec_bytes;
	uint32_t n_vocab, act_size;
	uint64_t payload_sum; /* checksum of everything after the tokens */
	uint64_t head_sum;    /* checksum of this header (head_sum 0) and the tokens */
};
_Static_assert(sizeof(struct cache_hdr) == 72, "the snapshot header has no padding");

/* ---- sizes and hashes ---- */

static size_t cache_kv_bytes(const struct toast_cache *c, int n)
{
	return toast_model_kv_bytes(c->m, n);
}

static size_t cache_img_bytes(const struct toast_cache *c, int n, int n_mid)
{
	return cache_kv_bytes(c, n) + c->rec_bytes * (n_mid ? 2 : 1);
}

static size_t cache_logit_bytes(const struct toast_cache *c, int n_mid)
{
	return (size_t)c->n_vocab * sizeof(float) * (n_mid ? 2 : 1);
}

/* memory a resident entry holds */
static size_t cache_state_bytes(const struct toast_cache *c, int n, int n_mid)
{
	return cache_img_bytes(c, n, n_mid) + cache_logit_bytes(c, n_mid) + (size_t)n * sizeof(int32_t);
}

static size_t cache_file_size(const struct toast_cache *c, int n, int n_mid)
{
	return sizeof(struct cache_hdr) + (size_t)n * sizeof(int32_t) + cache_logit_bytes(c, n_mid) +
	       cache_img_bytes(c, n, n_mid);
}

/* h[i] = FNV-1a of ids[0, i), for i in [0, n]: one pass, then any prefix is compared in O(1). */
static uint64_t *cache_prefix_hashes(const int32_t *ids, int n)
{
	uint64_t *h = malloc(((size_t)n + 1) * sizeof(*h));
	if (!h)
		return NULL;
	h[0] = TOAST_FNV_OFFSET;
	for (int i = 0; i < n; i++)
		h[i + 1] = toast_fnv1a(&ids[i], sizeof(int32_t), h[i]);
	return h;
}

/* Do tokens[0, p) of e equal ids[0, p)? (h: prefix hashes of ids, p <= n_ids) */
static bool cache_point_matches(const struct cache_entry *e, int p, uint64_t hp, const int32_t *ids, int n_ids,
				const uint64_t *h)
{
	return p > 0 && p <= n_ids && hp == h[p] && memcmp(e->tokens, ids, (size_t)p * sizeof(int32_t)) == 0;
}

/* ---- entries ---- */

static void *cache_img_alloc(struct toast_cache *c, size_t n)
{
	return c->device ? c->be->ops->alloc(c->be, n) : c->be->ops->host_alloc(c->be, n);
}

static void cache_img_release(struct toast_cache *c, void *p)
{
	if (c->device)
		c->be->ops->release(c->be, p);
	else
		c->be->ops->host_release(c->be, p);
}

static void cache_file_path(const struct toast_cache *c, const struct cache_entry *e, char *buf, size_t n)
{
	snprintf(buf, n, "%s/%016" PRIx64 "-%016" PRIx64 ".snap", c->dir, c->fp, e->hash);
}

/* Drop the memory of e's state (its tokens stay). */
static void cache_drop_state(struct toast_cache *c, struct cache_entry *e)
{
	if (!e->img)
		return;
	cache_img_release(c, e->img);
	free(e->logits);
	e->img = NULL;
	e->logits = NULL;
	c->held -= cache_state_bytes(c, e->n, e->n_mid);
}

/* Forget e's file, removing it unless keep (then it stays for another daemon or a later start). */
static void cache_drop_file(struct toast_cache *c, struct cache_entry *e, bool keep)
{
	if (!e->in_file)
		return;
	char path[4096];
	cache_file_path(c, e, path, sizeof(path));
	if (!keep && unlink(path) != 0 && errno != ENOENT)
		TOAST_WARN("session cache: cannot remove %s: %s", path, strerror(errno));
	e->in_file = false;
	c->file_bytes -= cache_file_size(c, e->n, e->n_mid);
	c->st.files--;
}

static void cache_remove(struct toast_cache *c, int i)
{
	struct cache_entry *e = c->ents[i];
	if (c->parent == e)
		c->parent = NULL;
	cache_drop_state(c, e);
	cache_drop_file(c, e, false);
	free(e->tokens);
	free(e);
	c->ents[i] = c->ents[--c->n_ents];
}

static int cache_index_of(const struct toast_cache *c, const struct cache_entry *e)
{
	for (int i = 0; i < c->n_ents; i++)
		if (c->ents[i] == e)
			return i;
	return -1;
}

/* The least recently used entry other than keep with its state in memory (file: with a file), or -1. */
static int cache_lru(const struct toast_cache *c, const struct cache_entry *keep, bool file)
{
	int lru = -1;
	for (int i = 0; i < c->n_ents; i++) {
		const struct cache_entry *e = c->ents[i];
		if (e != keep && (file ? e->in_file : e->img != NULL) && (lru < 0 || e->used < c->ents[lru]->used))
			lru = i;
	}
	return lru;
}

/* Make room in memory: the least recently used state other than keep's goes (its entry too,
 * unless a file keeps it). false when there is none. */
static bool cache_evict_memory(struct toast_cache *c, const struct cache_entry *keep)
{
	int lru = cache_lru(c, keep, false);
	if (lru < 0)
		return false;
	c->st.evictions++;
	if (c->ents[lru]->in_file)
		cache_drop_state(c, c->ents[lru]);
	else
		cache_remove(c, lru);
	return true;
}

/* Make room for a file: the least recently used file other than keep's goes (its entry too,
 * unless its state is in memory). */
static bool cache_evict_file(struct toast_cache *c, const struct cache_entry *keep)
{
	int lru = cache_lru(c, keep, true);
	if (lru < 0)
		return false;
	c->st.evictions++;
	if (c->ents[lru]->img)
		cache_drop_file(c, c->ents[lru], false);
	else
		cache_remove(c, lru);
	return true;
}

/* Allocate e's state (img, logits) within the budget, evicting others; false when it cannot. */
static bool cache_alloc_state(struct toast_cache *c, struct cache_entry *e)
{
	size_t bytes = cache_state_bytes(c, e->n, e->n_mid);
	if (bytes > c->budget)
		return false;
	while (c->held + bytes > c->budget)
		if (!cache_evict_memory(c, e))
			return false;
	for (;;) {
		e->img = cache_img_alloc(c, cache_img_bytes(c, e->n, e->n_mid));
		e->logits = malloc(cache_logit_bytes(c, e->n_mid));
		if (e->img && e->logits)
			break;
		/* the budget is not all free memory: give back what others hold, then give up */
		if (e->img)
			cache_img_release(c, e->img);
		free(e->logits);
		e->img = NULL;
		e->logits = NULL;
		if (!cache_evict_memory(c, e))
			return false;
	}
	c->held += bytes;
	return true;
}

static struct cache_entry *cache_entry_new(struct toast_cache *c, const int32_t *tokens, int n, int n_mid,
					   const uint64_t *h)
{
	if (c->n_ents == CACHE_MAX_ENTRIES) { /* the table is full: the least recently used goes */
		int lru = 0;
		for (int i = 1; i < c->n_ents; i++)
			lru = c->ents[i]->used < c->ents[lru]->used ? i : lru;
		c->st.evictions++;
		cache_remove(c, lru);
	}
	struct cache_entry *e = calloc(1, sizeof(*e));
	if (e && (e->tokens = malloc((size_t)n * sizeof(int32_t)))) {
		memcpy(e->tokens, tokens, (size_t)n * sizeof(int32_t));
		e->n = n;
		e->n_mid = n_mid;
		e->hash = h[n];
		e->hash_mid = h[n_mid];
		return e;
	}
	free(e);
	return NULL;
}

/* ---- files ---- */

static bool cache_write_all(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		b += w;
		n -= (size_t)w;
	}
	return true;
}

/* 1: all n bytes read, 0: the file ended first, -1: an error */
static int cache_read_all(int fd, void *p, size_t n)
{
	char *b = p;
	while (n) {
		ssize_t r = read(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			return 0;
		b += r;
		n -= (size_t)r;
	}
	return 1;
}

/* Write an image (backend memory when device: staged through host memory) and sum it. */
static enum toast_status cache_img_write(struct toast_cache *c, int fd, const unsigned char *img, size_t n,
					 struct toast_sum *sum, struct toast_error *err)
{
	if (!c->device) {
		toast_sum_add(sum, img, n);
		return cache_write_all(fd, img, n) ? TOAST_OK : toast_err_set(err, TOAST_ERR_IO, "write: %s", strerror(errno));
	}
	size_t chunk = n < CACHE_STAGE_BYTES ? n : CACHE_STAGE_BYTES;
	unsigned char *stage = c->be->ops->host_alloc(c->be, chunk);
	enum toast_status rc = stage ? TOAST_OK : toast_err_set(err, TOAST_ERR_NOMEM, "no memory to stage a snapshot");
	for (size_t off = 0; rc == TOAST_OK && off < n; off += chunk) {
		size_t k = n - off < chunk ? n - off : chunk;
		rc = c->be->ops->read(c->be, stage, img + off, k, err);
		if (rc == TOAST_OK) {
			toast_sum_add(sum, stage, k);
			if (!cache_write_all(fd, stage, k))
				rc = toast_err_set(err, TOAST_ERR_IO, "write: %s", strerror(errno));
		}
	}
	c->be->ops->host_release(c->be, stage);
	return rc;
}

/* Read an image of n bytes from fd into img (backend memory when device) and sum it. */
static enum toast_status cache_img_read(struct toast_cache *c, int fd, unsigned char *img, size_t n,
					struct toast_sum *sum, struct toast_error *err)
{
	size_t chunk = n < CACHE_STAGE_BYTES ? n : CACHE_STAGE_BYTES;
	unsigned char *stage = c->device ? c->be->ops->host_alloc(c->be, chunk) : NULL;
	if (c->device && !stage)
		return toast_err_set(err, TOAST_ERR_NOMEM, "no memory to stage a snapshot");
	enum toast_status rc = TOAST_OK;
	for (size_t off = 0; rc == TOAST_OK && off < n; off += chunk) {
		size_t k = n - off < chunk ? n - off : chunk;
		unsigned char *dst = c->device ? stage : img + off;
		int r = cache_read_all(fd, dst, k);
		if (r <= 0) {
			rc = r ? toast_err_set(err, TOAST_ERR_IO, "read: %s", strerror(errno))
			       : toast_err_set(err, TOAST_ERR_FORMAT, "truncated");
			break;
		}
		toast_sum_add(sum, dst, k);
		if (c->device)
			c->be->ops->write(c->be, img + off, stage, k);
	}
	c->be->ops->host_release(c->be, stage);
	return rc;
}

static void cache_hdr_fill(const struct toast_cache *c, const struct cache_entry *e, struct cache_hdr *h)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, CACHE_MAGIC, 8);
	h->version = CACHE_VERSION;
	h->hdr_bytes = sizeof(*h);
	h->model_fp = c->fp;
	h->n = e->n;
	h->n_mid = e->n_mid;
	h->kv_bytes = cache_kv_bytes(c, e->n);
	h->rec_bytes = c->rec_bytes;
	h->n_vocab = (uint32_t)c->n_vocab;
	h->act_size = (uint32_t)c->be->act_size;
}

static uint64_t cache_head_sum(struct cache_hdr h, const int32_t *tokens)
{
	struct toast_sum s;
	toast_sum_init(&s);
	h.head_sum = 0;
	toast_sum_add(&s, &h, sizeof(h));
	toast_sum_add(&s, tokens, (size_t)h.n * sizeof(int32_t));
	return toast_sum_final(&s);
}

/* Write e (resident) to its file: a temporary file renamed into place, so that a reader sees a
 * whole file or none (a crash mid-write leaves only the temporary, which is never read). */
static enum toast_status cache_file_write(struct toast_cache *c, struct cache_entry *e, struct toast_error *err)
{
	size_t size = cache_file_size(c, e->n, e->n_mid);
	if (size > c->dir_budget)
		return toast_err_set(err, TOAST_ERR_NOMEM, "a snapshot of %zu bytes exceeds the directory budget", size);
	while (c->file_bytes + size > c->dir_budget)
		if (!cache_evict_file(c, e))
			break;
	char path[4096], tmp[4200];
	cache_file_path(c, e, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	struct cache_hdr h;
	cache_hdr_fill(c, e, &h);
	struct toast_sum sum;
	toast_sum_init(&sum);
	enum toast_status rc = TOAST_OK;
	if (lseek(fd, (off_t)sizeof(h), SEEK_SET) < 0 || !cache_write_all(fd, e->tokens, (size_t)e->n * sizeof(int32_t)))
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	if (rc == TOAST_OK) {
		toast_sum_add(&sum, e->logits, cache_logit_bytes(c, e->n_mid));
		if (!cache_write_all(fd, e->logits, cache_logit_bytes(c, e->n_mid)))
			rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	}
	if (rc == TOAST_OK)
		rc = cache_img_write(c, fd, e->img, cache_img_bytes(c, e->n, e->n_mid), &sum, err);
	if (rc == TOAST_OK) {
		h.payload_sum = toast_sum_final(&sum);
		h.head_sum = cache_head_sum(h, e->tokens);
		if (pwrite(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
			rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	}
	if (close(fd) != 0 && rc == TOAST_OK)
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", tmp, strerror(errno));
	if (rc == TOAST_OK && rename(tmp, path) != 0)
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	if (rc != TOAST_OK) {
		unlink(tmp);
		return rc;
	}
	e->in_file = true;
	c->file_bytes += size;
	c->st.files++;
	return TOAST_OK;
}

/*
 * Read and check the header and tokens of an open snapshot file. TOAST_ERR_UNSUPPORTED: another
 * model's (or layout's) file, to leave alone; TOAST_ERR_FORMAT: a broken one of ours.
 */
static enum toast_status cache_file_head(const struct toast_cache *c, int fd, const char *path, struct cache_hdr *h,
					 int32_t **tokens, struct toast_error *err)
{
	*tokens = NULL;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: not a regular file", path);
	int r = cache_read_all(fd, h, sizeof(*h));
	if (r < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	if (r == 0 || memcmp(h->magic, CACHE_MAGIC, 8) != 0 || h->version != CACHE_VERSION || h->hdr_bytes != sizeof(*h))
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: not a snapshot of this version", path);
	if (h->model_fp != c->fp || h->n_vocab != (uint32_t)c->n_vocab || h->act_size != c->be->act_size ||
	    h->rec_bytes != c->rec_bytes)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: made by another model or backend", path);
	if (h->n <= 0 || h->n > c->m->hp.n_ctx_train || h->n_mid < 0 || h->n_mid >= h->n ||
	    h->kv_bytes != cache_kv_bytes(c, h->n))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: inconsistent header", path);
	if ((uint64_t)st.st_size != cache_file_size(c, h->n, h->n_mid))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: %lld bytes, %zu expected (truncated?)", path,
				     (long long)st.st_size, cache_file_size(c, h->n, h->n_mid));
	*tokens = malloc((size_t)h->n * sizeof(int32_t));
	if (!*tokens)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	r = cache_read_all(fd, *tokens, (size_t)h->n * sizeof(int32_t));
	if (r <= 0 || cache_head_sum(*h, *tokens) != h->head_sum) {
		free(*tokens);
		*tokens = NULL;
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: header checksum mismatch", path);
	}
	return TOAST_OK;
}

/* Read e's state from its file into memory, all checksums verified before it can be used. */
static enum toast_status cache_file_load(struct toast_cache *c, struct cache_entry *e, struct toast_error *err)
{
	char path[4096];
	cache_file_path(c, e, path, sizeof(path));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: %s", path, strerror(errno));
	struct cache_hdr h;
	int32_t *tokens = NULL;
	enum toast_status rc = cache_file_head(c, fd, path, &h, &tokens, err);
	if (rc == TOAST_OK && (h.n != e->n || h.n_mid != e->n_mid || memcmp(tokens, e->tokens, (size_t)e->n * 4) != 0))
		rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: changed since it was indexed", path);
	free(tokens);
	if (rc == TOAST_OK && !cache_alloc_state(c, e))
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "%s: no room in the cache budget", path);
	if (rc == TOAST_OK) {
		struct toast_sum sum;
		toast_sum_init(&sum);
		size_t lb = cache_logit_bytes(c, e->n_mid);
		int r = cache_read_all(fd, e->logits, lb);
		if (r <= 0)
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: truncated", path);
		toast_sum_add(&sum, e->logits, lb);
		if (rc == TOAST_OK)
			rc = cache_img_read(c, fd, e->img, cache_img_bytes(c, e->n, e->n_mid), &sum, err);
		if (rc == TOAST_OK)
			rc = c->be->ops->sync(c->be, err);
		if (rc == TOAST_OK && toast_sum_final(&sum) != h.payload_sum)
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: checksum mismatch (corrupted)", path);
		if (rc != TOAST_OK)
			cache_drop_state(c, e);
	}
	close(fd);
	return rc;
}

static int cache_cmp_used(const void *a, const void *b)
{
	const struct cache_entry *x = *(struct cache_entry *const *)a, *y = *(struct cache_entry *const *)b;
	return x->used < y->used ? -1 : x->used > y->used;
}

/* Index the snapshot files in c->dir: headers and tokens only; states are read when used. */
static void cache_dir_index(struct toast_cache *c)
{
	DIR *d = opendir(c->dir);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d)) && c->n_ents < CACHE_MAX_ENTRIES) {
		size_t len = strlen(de->d_name);
		if (de->d_name[0] == '.' || len < 6 || strcmp(de->d_name + len - 5, ".snap") != 0)
			continue;
		char path[4096];
		if (!toast_path_join(path, sizeof(path), c->dir, de->d_name))
			continue;
		int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		struct toast_error err = {0};
		struct cache_hdr h;
		int32_t *tokens = NULL;
		struct stat st;
		enum toast_status rc = fd < 0 ? toast_err_set(&err, TOAST_ERR_IO, "%s: %s", path, strerror(errno))
					      : cache_file_head(c, fd, path, &h, &tokens, &err);
		if (rc == TOAST_OK && fstat(fd, &st) != 0)
			rc = toast_err_set(&err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		if (rc != TOAST_OK) {
			c->st.rejected++;
			TOAST_WARN("session cache: ignoring %s", err.msg);
			free(tokens);
			continue;
		}
		uint64_t *hs = cache_prefix_hashes(tokens, h.n);
		struct cache_entry *e = hs ? cache_entry_new(c, tokens, h.n, h.n_mid, hs) : NULL;
		free(hs);
		free(tokens);
		if (!e)
			break;
		char want[4096];
		cache_file_path(c, e, want, sizeof(want));
		if (strcmp(want, path) != 0) { /* a renamed copy: its tokens are not what its name says */
			c->st.rejected++;
			TOAST_WARN("session cache: ignoring %s: its name does not match its tokens", path);
			free(e->tokens);
			free(e);
			continue;
		}
		e->in_file = true;
		e->used = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
		c->ents[c->n_ents++] = e;
		c->file_bytes += cache_file_size(c, e->n, e->n_mid);
		c->st.files++;
	}
	closedir(d);
	/* the newest file was used last: order the LRU clock by modification time */
	qsort(c->ents, (size_t)c->n_ents, sizeof(*c->ents), cache_cmp_used);
	for (int i = 0; i < c->n_ents; i++)
		c->ents[i]->used = ++c->clock;
	while (c->file_bytes > c->dir_budget && cache_evict_file(c, NULL))
		;
	if (c->n_ents)
		TOAST_INFO("session cache: %d snapshots in %s (%zu bytes)", c->n_ents, c->dir, c->file_bytes);
}

/* ---- the API ---- */

static size_t cache_dir_free(const char *dir)
{
	struct statvfs v;
	return statvfs(dir, &v) == 0 ? (size_t)v.f_bavail * v.f_frsize : 0;
}

enum toast_status toast_cache_new(struct toast_engine *e, const struct toast_cache_opts *o, struct toast_cache **out,
				  struct toast_error *err)
{
	*out = NULL;
	struct toast_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	c->be = e->be;
	c->m = &e->model;
	c->device = o->device;
	c->rec_bytes = toast_model_rec_bytes(c->m);
	c->n_vocab = c->m->hp.n_vocab;
	c->fp = toast_model_fingerprint(c->m);
	c->budget = o->budget_bytes;
	if (!c->budget) {
		size_t fr = c->device ? c->be->ops->mem_free(c->be) : toast_mem_available();
		c->budget = fr ? fr / 4 : CACHE_MIN_BUDGET;
	}
	c->ents = calloc(CACHE_MAX_ENTRIES, sizeof(*c->ents));
	c->stash_logits = malloc((size_t)c->n_vocab * sizeof(float));
	if (!c->ents || !c->stash_logits) {
		toast_cache_free(c);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	if (o->dir) {
		char probe[4096];
		struct stat st;
		if (!toast_path_join(probe, sizeof(probe), o->dir, "x") || !toast_mkdirs_for(probe, 0700) ||
		    stat(o->dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(o->dir, W_OK | X_OK) != 0 ||
		    !(c->dir = toast_strdup(o->dir))) {
			toast_cache_free(c);
			return toast_err_set(err, TOAST_ERR_IO, "cache directory %s: cannot create or write it", o->dir);
		}
		c->dir_budget = o->dir_budget_bytes ? o->dir_budget_bytes : cache_dir_free(o->dir) / 4;
		cache_dir_index(c);
	}
	*out = c;
	return TOAST_OK;
}

void toast_cache_free(struct toast_cache *c)
{
	if (!c)
		return;
	while (c->n_ents) { /* the files stay: that is what the directory is for */
		cache_drop_file(c, c->ents[c->n_ents - 1], true);
		cache_remove(c, c->n_ents - 1);
	}
	if (c->stash_rec)
		c->be->ops->release(c->be, c->stash_rec);
	free(c->stash_logits);
	free(c->ents);
	free(c->dir);
	free(c);
}

enum toast_status toast_cache_restore(struct toast_cache *c, struct toast_session *s, const int32_t *ids, int n,
				      int *n_keep, struct toast_error *err)
{
	*n_keep = 0;
	c->req_s = s;
	c->req_n = 0;
	c->parent = NULL;
	c->mark_n = 0;
	if (n > s->state.n_ctx)
		n = s->state.n_ctx;
	uint64_t *h = cache_prefix_hashes(ids, n);
	if (!h) {
		toast_session_reset(s);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	enum toast_status rc = TOAST_OK;
	for (;;) {
		/* the session itself is a snapshot that costs nothing to restore: it wins ties */
		int best = s->n_past > 0 && s->n_past <= n && s->have_logits &&
				   memcmp(s->tokens, ids, (size_t)s->n_past * sizeof(int32_t)) == 0
			       ? s->n_past
			       : 0;
		struct cache_entry *pick = NULL;
		for (int i = 0; i < c->n_ents; i++) {
			struct cache_entry *e = c->ents[i];
			if (e->n > best && cache_point_matches(e, e->n, e->hash, ids, n, h))
				best = e->n, pick = e;
			else if (e->n_mid > best && cache_point_matches(e, e->n_mid, e->hash_mid, ids, n, h))
				best = e->n_mid, pick = e;
		}
		if (!pick) {
			if (!best)
				toast_session_reset(s);
			*n_keep = best;
			break;
		}
		if (!pick->img) {
			struct toast_error ferr = {0};
			enum toast_status frc = cache_file_load(c, pick, &ferr);
			if (frc != TOAST_OK) { /* never loaded: it goes, its file too, and the search goes on */
				TOAST_WARN("session cache: not using %s", ferr.msg);
				c->st.rejected += frc == TOAST_ERR_FORMAT;
				cache_remove(c, cache_index_of(c, pick));
				continue;
			}
		}
		bool at_mid = best != pick->n;
		size_t kv = cache_kv_bytes(c, pick->n);
		rc = toast_model_state_load(c->m, &s->state, best, pick->img, pick->n,
					    pick->img + kv + (at_mid ? c->rec_bytes : 0), !c->device, err);
		if (rc != TOAST_OK) {
			toast_session_reset(s);
			break;
		}
		memcpy(s->tokens, pick->tokens, (size_t)best * sizeof(int32_t));
		memcpy(s->logits, pick->logits + (at_mid ? c->n_vocab : 0), (size_t)c->n_vocab * sizeof(float));
		s->n_past = best;
		s->have_logits = true;
		pick->used = ++c->clock;
		c->parent = pick;
		*n_keep = best;
		break;
	}
	c->req_n = *n_keep;
	free(h);
	return rc;
}

void toast_cache_mark_prompt(struct toast_cache *c, struct toast_session *s)
{
	c->mark_n = 0;
	if (s != c->req_s || s->n_past <= 0 || !s->have_logits)
		return;
	if (c->rec_bytes && !c->stash_rec && !(c->stash_rec = c->be->ops->alloc(c->be, c->rec_bytes)))
		return; /* no room for the point: the snapshot will have only its end */
	struct toast_error err;
	if (c->rec_bytes && toast_model_state_save(c->m, &s->state, s->n_past, NULL, c->stash_rec, false, &err) != TOAST_OK)
		return;
	memcpy(c->stash_logits, s->logits, (size_t)c->n_vocab * sizeof(float));
	c->mark_n = s->n_past;
}

/* A new entry holding what s holds (n tokens, its prompt point n_mid), in memory and in its
 * file; none (TOAST_OK) when there is no room for it. */
static enum toast_status cache_snapshot(struct toast_cache *c, struct toast_session *s, int n, int n_mid,
					const uint64_t *h, struct toast_error *err)
{
	struct cache_entry *e = cache_entry_new(c, s->tokens, n, n_mid, h);
	if (!e || !cache_alloc_state(c, e)) {
		if (e) {
			free(e->tokens);
			free(e);
		}
		TOAST_DEBUG("session cache: no memory for a snapshot of %d tokens", n);
		return TOAST_OK;
	}
	size_t kv = cache_kv_bytes(c, n);
	enum toast_status rc = toast_model_state_save(c->m, &s->state, n, e->img, e->img + kv, !c->device, err);
	if (rc == TOAST_OK && n_mid && c->rec_bytes)
		rc = toast_backend_move(c->be, e->img + kv + c->rec_bytes, !c->device, c->stash_rec, false, c->rec_bytes, err);
	if (rc == TOAST_OK)
		rc = c->be->ops->sync(c->be, err);
	if (rc != TOAST_OK) {
		cache_drop_state(c, e);
		free(e->tokens);
		free(e);
		return rc;
	}
	memcpy(e->logits, s->logits, (size_t)c->n_vocab * sizeof(float));
	if (n_mid)
		memcpy(e->logits + c->n_vocab, c->stash_logits, (size_t)c->n_vocab * sizeof(float));
	e->used = ++c->clock;
	c->ents[c->n_ents++] = e;
	struct toast_error ferr = {0};
	if (c->dir && cache_file_write(c, e, &ferr) != TOAST_OK)
		TOAST_WARN("session cache: snapshot kept in memory only: %s", ferr.msg);
	return TOAST_OK;
}

enum toast_status toast_cache_save(struct toast_cache *c, struct toast_session *s, struct toast_error *err)
{
	int n = s->n_past;
	bool same = s == c->req_s;
	int n_mid = same && c->mark_n > 0 && c->mark_n < n ? c->mark_n : 0;
	c->mark_n = 0;
	c->req_s = NULL;
	/* nothing new since restore(): the state is already where it came from */
	if (n <= 0 || !s->have_logits || (same && n == c->req_n))
		return TOAST_OK;
	if (cache_state_bytes(c, n, n_mid) > c->budget) {
		TOAST_DEBUG("session cache: a snapshot of %d tokens (%zu bytes) exceeds the budget", n,
			    cache_state_bytes(c, n, n_mid));
		return TOAST_OK;
	}
	uint64_t *h = cache_prefix_hashes(s->tokens, n);
	uint64_t *gone = malloc((size_t)(c->n_ents + 1) * sizeof(*gone));
	if (!h || !gone) {
		free(h);
		free(gone);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	/* replace what this snapshot extends: the entry restored, and any that is a prefix of it.
	 * Their files go once the new one is written: a crash in between leaves the older one. */
	struct cache_entry *parent = same ? c->parent : NULL;
	int n_gone = 0;
	for (int i = c->n_ents - 1; i >= 0; i--) {
		struct cache_entry *e = c->ents[i];
		if (e == parent || cache_point_matches(e, e->n, e->hash, s->tokens, n, h)) {
			c->st.replaced++;
			if (e->in_file)
				gone[n_gone++] = e->hash;
			cache_drop_file(c, e, true);
			cache_remove(c, i);
		}
	}
	c->parent = NULL;
	enum toast_status rc = cache_snapshot(c, s, n, n_mid, h, err);
	for (int i = 0; i < n_gone; i++) {
		if (gone[i] == h[n]) /* the same name: the new file took its place */
			continue;
		char path[4096];
		struct cache_entry tmp = {.hash = gone[i]};
		cache_file_path(c, &tmp, path, sizeof(path));
		if (unlink(path) != 0 && errno != ENOENT)
			TOAST_WARN("session cache: cannot remove %s: %s", path, strerror(errno));
	}
	free(gone);
	free(h);
	return rc;
}

void toast_cache_get_stats(const struct toast_cache *c, struct toast_cache_stats *st)
{
	*st = c->st;
	st->budget_bytes = c->budget;
	st->bytes_held = c->held;
	st->entries = c->n_ents;
	st->dir_budget_bytes = c->dir_budget;
	st->file_bytes = c->file_bytes;
	st->device = c->device;
}
