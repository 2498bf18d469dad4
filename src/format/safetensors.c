/*
 * safetensors.c - safetensors parsing: 8-byte little-endian header length, a JSON header mapping
 * names to {dtype, shape, data_offsets}, then the data. Offsets are relative to the end of the
 * header. The header is untrusted: sizes are bounded and every entry is checked.
 */
#include "format/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

#define ST_MAX_HEADER (256u << 20) /* 256 MiB of JSON is far beyond any real checkpoint */
#define ST_MAX_INDEX (64u << 20)

static const struct {
	const char *name;
	enum toast_dtype dt;
	int size;
} st_types[] = {
	{"F32", TOAST_DT_F32, 4},     {"F16", TOAST_DT_F16, 2},     {"BF16", TOAST_DT_BF16, 2},
	{"I32", TOAST_DT_I32, 4},     {"I64", TOAST_DT_I64, 8},     {"U8", TOAST_DT_U8, 1},
	{"F64", TOAST_DT_UNKNOWN, 8}, {"I8", TOAST_DT_UNKNOWN, 1},  {"BOOL", TOAST_DT_UNKNOWN, 1},
	{"I16", TOAST_DT_UNKNOWN, 2}, {"U16", TOAST_DT_UNKNOWN, 2}, {"U32", TOAST_DT_U32, 4},
	{"U64", TOAST_DT_UNKNOWN, 8}, {"F8_E4M3", TOAST_DT_UNKNOWN, 1}, {"F8_E5M2", TOAST_DT_UNKNOWN, 1},
};

static enum toast_status st_parse_header(struct toast_tensordir *st, int file, json_t **out_root,
					 size_t *out_count, struct toast_error *err)
{
	const char *path = st->paths[file];
	const struct toast_map *m = &st->maps[file];
	if (m->size < 8)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: truncated (%zu bytes, no header)", path, m->size);
	uint64_t hlen = 0;
	const unsigned char *b = m->data;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | b[i];
	if (hlen > ST_MAX_HEADER || hlen > m->size - 8)
		return toast_err_set(err, TOAST_ERR_FORMAT,
				     "%s: header length %llu exceeds the file (%zu bytes): truncated or not safetensors",
				     path, (unsigned long long)hlen, m->size);
	json_error_t je;
	json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: header is not valid JSON: %s (offset %d)", path,
				     je.text, je.position);
	if (!json_is_object(root)) {
		json_decref(root);
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: header is not a JSON object", path);
	}
	*out_root = root;
	*out_count = json_object_size(root) - (json_object_get(root, "__metadata__") ? 1 : 0);
	return TOAST_OK;
}

static enum toast_status st_add_tensor(struct toast_tensordir *st, int file, size_t data_start,
				       const char *name, json_t *v, char **name_pos, struct toast_error *err)
{
	const char *path = st->paths[file];
	const struct toast_map *m = &st->maps[file];
	struct toast_tensor *t = &st->tensors[st->n_tensors];
	memset(t, 0, sizeof(*t));
	json_t *jdt = json_object_get(v, "dtype"), *jsh = json_object_get(v, "shape");
	json_t *joff = json_object_get(v, "data_offsets");
	if (!json_is_object(v) || !json_is_string(jdt) || !json_is_array(jsh) || !json_is_array(joff) ||
	    json_array_size(joff) != 2)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: entry needs dtype, shape, data_offsets",
				     path, name);
	int elsize = 0;
	for (size_t i = 0; i < sizeof(st_types) / sizeof(st_types[0]); i++)
		if (strcmp(st_types[i].name, json_string_value(jdt)) == 0) {
			t->dtype = st_types[i].dt;
			t->dtype_name = st_types[i].name;
			elsize = st_types[i].size;
		}
	if (!elsize)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: unknown dtype %s", path, name,
				     json_string_value(jdt));
	size_t nd = json_array_size(jsh);
	if (nd > TOAST_MAX_DIMS)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: %zu dimensions", path, name, nd);
	size_t numel = 1;
	for (size_t i = 0; i < nd; i++) {
		json_t *d = json_array_get(jsh, i);
		if (!json_is_integer(d) || json_integer_value(d) < 0 ||
		    !toast_mul_ok(numel, (size_t)json_integer_value(d), &numel))
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: bad shape", path, name);
		t->shape[i] = json_integer_value(d);
	}
	t->n_dims = (int)nd;
	t->n_elems = (int64_t)numel;
	json_t *jb = json_array_get(joff, 0), *je = json_array_get(joff, 1);
	if (!json_is_integer(jb) || !json_is_integer(je))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: bad data_offsets", path, name);
	json_int_t ob = json_integer_value(jb), oe = json_integer_value(je);
	size_t data_size = m->size - data_start;
	size_t want = 0;
	if (ob < 0 || oe < ob || (uint64_t)oe > data_size)
		return toast_err_set(err, TOAST_ERR_FORMAT,
				     "%s: tensor %s: data_offsets [%lld, %lld] outside the %zu data bytes (truncated file?)",
				     path, name, (long long)ob, (long long)oe, data_size);
	if (!toast_mul_ok(numel, (size_t)elsize, &want) || want != (size_t)(oe - ob))
		return toast_err_set(err, TOAST_ERR_FORMAT,
				     "%s: tensor %s: %lld data bytes for %zu elements of %s (want %zu)", path, name,
				     (long long)(oe - ob), numel, t->dtype_name, want);
	/* writers pad the header so that every tensor is aligned to its elements; kernels rely on it */
	if ((data_start + (size_t)ob) % (size_t)elsize)
		return toast_err_set(err, TOAST_ERR_FORMAT,
				     "%s: tensor %s: data at file offset %zu is not aligned to its %d-byte elements", path,
				     name, data_start + (size_t)ob, elsize);
	size_t nlen = strlen(name);
	memcpy(*name_pos, name, nlen + 1);
	t->name = *name_pos;
	*name_pos += nlen + 1;
	t->data = (const char *)m->data + data_start + ob;
	t->offset = (size_t)ob;
	t->n_bytes = want;
	t->file = file;
	st->n_tensors++;
	return TOAST_OK;
}

static int st_cmp_offset(const void *a, const void *b)
{
	const struct toast_tensor *x = *(const struct toast_tensor *const *)a;
	const struct toast_tensor *y = *(const struct toast_tensor *const *)b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A header whose tensors share bytes lies about at least one of them. */
static enum toast_status st_check_overlap(struct toast_tensordir *st, struct toast_error *err)
{
	const struct toast_tensor **by = malloc((st->n_tensors ? (size_t)st->n_tensors : 1) * sizeof(*by));
	if (!by)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	int n = 0;
	for (int i = 0; i < st->n_tensors; i++)
		if (st->tensors[i].n_bytes)
			by[n++] = &st->tensors[i];
	qsort(by, (size_t)n, sizeof(*by), st_cmp_offset);
	enum toast_status rc = TOAST_OK;
	for (int i = 1; i < n && rc == TOAST_OK; i++)
		if (by[i]->file == by[i - 1]->file && by[i]->offset < by[i - 1]->offset + by[i - 1]->n_bytes)
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensors %s and %s overlap", st->paths[by[i]->file],
					   by[i - 1]->name, by[i]->name);
	free(by);
	return rc;
}

/* Map files paths[0..n), parse all headers, build the directory. */
static enum toast_status st_load(struct toast_tensordir *st, struct toast_error *err)
{
	enum toast_status rc = TOAST_OK;
	json_t **roots = calloc((size_t)st->n_files, sizeof(*roots));
	size_t total = 0, name_bytes = 0;
	if (!roots)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	for (int f = 0; f < st->n_files && rc == TOAST_OK; f++) {
		rc = toast_map_open(&st->maps[f], st->paths[f], err);
		size_t cnt = 0;
		if (rc == TOAST_OK)
			rc = st_parse_header(st, f, &roots[f], &cnt, err);
		if (rc == TOAST_OK) {
			total += cnt;
			const char *k;
			json_t *v;
			json_object_foreach(roots[f], k, v) name_bytes += strlen(k) + 1;
		}
	}
	if (rc != TOAST_OK)
		goto done;
	st->tensors = calloc(total ? total : 1, sizeof(*st->tensors));
	st->names = malloc(name_bytes + 1);
	if (!st->tensors || !st->names) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory for %zu tensors", total);
		goto done;
	}
	char *pos = st->names;
	for (int f = 0; f < st->n_files && rc == TOAST_OK; f++) {
		const unsigned char *b = st->maps[f].data;
		uint64_t hlen = 0;
		for (int i = 7; i >= 0; i--)
			hlen = hlen << 8 | b[i];
		const char *k;
		json_t *v;
		json_object_foreach(roots[f], k, v)
		{
			if (strcmp(k, "__metadata__") == 0)
				continue;
			rc = st_add_tensor(st, f, 8 + (size_t)hlen, k, v, &pos, err);
			if (rc != TOAST_OK)
				break;
		}
	}
	if (rc == TOAST_OK)
		rc = toast_tensordir_index(st, st->paths[0], err);
	if (rc == TOAST_OK)
		rc = st_check_overlap(st, err);
done:
	for (int f = 0; f < st->n_files; f++)
		json_decref(roots[f]);
	free(roots);
	return rc;
}

static enum toast_status st_alloc_files(struct toast_tensordir *st, int n, struct toast_error *err)
{
	memset(st, 0, sizeof(*st));
	st->maps = calloc((size_t)n, sizeof(*st->maps));
	st->paths = calloc((size_t)n, sizeof(*st->paths));
	if (!st->maps || !st->paths) {
		free(st->maps);
		free(st->paths);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	st->n_files = n;
	return TOAST_OK;
}

enum toast_status toast_st_open_file(struct toast_tensordir *st, const char *path, struct toast_error *err)
{
	enum toast_status rc = st_alloc_files(st, 1, err);
	if (rc != TOAST_OK)
		return rc;
	st->paths[0] = toast_strdup(path);
	rc = st->paths[0] ? st_load(st, err) : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (rc != TOAST_OK)
		toast_tensordir_close(st);
	return rc;
}

static enum toast_status st_open_index(struct toast_tensordir *st, const char *dir, const char *index_path,
				       struct toast_error *err)
{
	char *text = NULL;
	enum toast_status rc = toast_read_file(index_path, ST_MAX_INDEX, &text, NULL, err);
	if (rc != TOAST_OK)
		return rc;
	json_error_t je;
	json_t *root = json_loads(text, 0, &je);
	free(text);
	json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(wm)) {
		json_decref(root);
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: no weight_map object%s%s", index_path,
				     root ? "" : ": ", root ? "" : je.text);
	}
	/* the distinct shard names, in first-seen order (hashed: an index may name a million) */
	size_t n_map = json_object_size(wm);
	const char **shards = calloc(n_map ? n_map : 1, sizeof(*shards));
	struct toast_strmap seen;
	int n_shards = 0;
	const char *k;
	json_t *v;
	rc = shards && toast_strmap_init(&seen, 16) == 0 ? TOAST_OK : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	json_object_foreach(wm, k, v)
	{
		if (rc != TOAST_OK)
			break;
		const char *fname = json_string_value(v);
		if (!fname || !fname[0] || strchr(fname, '/') || strcmp(fname, "..") == 0 || strcmp(fname, ".") == 0) {
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: bad shard file name", index_path, k);
			break;
		}
		size_t len = strlen(fname);
		if (toast_strmap_get(&seen, fname, len) >= 0)
			continue;
		if (toast_strmap_put(&seen, fname, len, n_shards) != 0)
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		shards[n_shards++] = fname;
	}
	if (shards)
		toast_strmap_deinit(&seen);
	if (rc == TOAST_OK && n_shards == 0)
		rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: weight_map names no tensors", index_path);
	if (rc == TOAST_OK)
		rc = st_alloc_files(st, n_shards, err);
	for (int i = 0; rc == TOAST_OK && i < n_shards; i++) {
		char p[4096];
		if (!toast_path_join(p, sizeof(p), dir, shards[i]) || !(st->paths[i] = toast_strdup(p)))
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "path too long or out of memory");
	}
	if (rc == TOAST_OK)
		rc = st_load(st, err);
	/* every tensor the index names must be in the shard it names */
	json_object_foreach(wm, k, v)
	{
		if (rc != TOAST_OK)
			break;
		const struct toast_tensor *t = toast_tensordir_find(st, k);
		if (!t || strcmp(st->paths[t->file] + strlen(dir) + 1, json_string_value(v)) != 0)
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s is not in shard %s", index_path, k,
					   json_string_value(v));
	}
	free(shards);
	json_decref(root);
	if (rc != TOAST_OK)
		toast_tensordir_close(st);
	return rc;
}

enum toast_status toast_st_open_dir(struct toast_tensordir *st, const char *dir, struct toast_error *err)
{
	char p[4096];
	memset(st, 0, sizeof(*st));
	if (!toast_path_join(p, sizeof(p), dir, "model.safetensors.index.json"))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	if (toast_file_exists(p))
		return st_open_index(st, dir, p, err);
	toast_path_join(p, sizeof(p), dir, "model.safetensors");
	if (!toast_file_exists(p))
		return toast_err_set(err, TOAST_ERR_IO,
				     "%s: no model.safetensors or model.safetensors.index.json in this directory", dir);
	return toast_st_open_file(st, p, err);
}
