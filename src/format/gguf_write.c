/*
 * gguf_write.c - writing a GGUF v3 file: metadata is serialised into a growing buffer as it is
 * added and tensors are declared (name, shape, type) up front; begin() writes the header, then
 * the tensors' data is streamed in declaration order, so a converter holds one tensor at a time.
 * Alignment is the default 32 bytes. The file is written under a temporary name and renamed into
 * place by finish() only when complete, so a failed conversion never leaves a plausible file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "util/mem.h"

struct wtensor {
	char *name;
	int ggml_type;
	int n_dims;
	int64_t ne[TOAST_GGUF_MAX_DIMS];
	size_t n_bytes;
};

struct toast_gguf_writer {
	char *path, *tmp;
	uint8_t *kv;
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	struct wtensor *t;
	int n_t, cap_t;
	FILE *f;
	int n_written;
	bool oom;
	char bad[256]; /* the first invalid call, reported by finish() */
};

static void w_bytes(struct toast_gguf_writer *w, const void *p, size_t n)
{
	if (w->oom)
		return;
	if (w->kv_len + n > w->kv_cap) {
		size_t cap = w->kv_cap ? w->kv_cap : 4096;
		while (cap < w->kv_len + n)
			cap *= 2;
		uint8_t *b = realloc(w->kv, cap);
		if (!b) {
			w->oom = true;
			return;
		}
		w->kv = b;
		w->kv_cap = cap;
	}
	memcpy(w->kv + w->kv_len, p, n);
	w->kv_len += n;
}

static void w_le(struct toast_gguf_writer *w, uint64_t v, int n)
{
	uint8_t b[8];
	for (int i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> 8 * i);
	w_bytes(w, b, (size_t)n);
}

static void w_str(struct toast_gguf_writer *w, const char *s, size_t len)
{
	w_le(w, len, 8);
	w_bytes(w, s, len);
}

static void w_key(struct toast_gguf_writer *w, const char *key, enum toast_gguf_type t)
{
	w_str(w, key, strlen(key));
	w_le(w, (uint64_t)t, 4);
	w->n_kv++;
}

enum toast_status toast_gguf_writer_new(const char *path, struct toast_gguf_writer **out, struct toast_error *err)
{
	*out = NULL;
	struct toast_gguf_writer *w = calloc(1, sizeof(*w));
	size_t n = strlen(path) + 8;
	if (w) {
		w->path = toast_strdup(path);
		w->tmp = malloc(n);
	}
	if (!w || !w->path || !w->tmp) {
		toast_gguf_writer_free(w);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	snprintf(w->tmp, n, "%s.part", path);
	*out = w;
	return TOAST_OK;
}

void toast_gguf_writer_free(struct toast_gguf_writer *w)
{
	if (!w)
		return;
	if (w->f) {
		fclose(w->f);
		remove(w->tmp);
	}
	for (int i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->kv);
	free(w->path);
	free(w->tmp);
	free(w);
}

void toast_gguf_put_u32(struct toast_gguf_writer *w, const char *key, uint32_t v)
{
	w_key(w, key, TOAST_GGUF_U32);
	w_le(w, v, 4);
}

void toast_gguf_put_i32(struct toast_gguf_writer *w, const char *key, int32_t v)
{
	w_key(w, key, TOAST_GGUF_I32);
	w_le(w, (uint32_t)v, 4);
}

void toast_gguf_put_f32(struct toast_gguf_writer *w, const char *key, float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	w_key(w, key, TOAST_GGUF_F32);
	w_le(w, u, 4);
}

void toast_gguf_put_bool(struct toast_gguf_writer *w, const char *key, bool v)
{
	w_key(w, key, TOAST_GGUF_BOOL);
	w_le(w, v ? 1 : 0, 1);
}

void toast_gguf_put_str(struct toast_gguf_writer *w, const char *key, const char *s, size_t len)
{
	w_key(w, key, TOAST_GGUF_STRING);
	w_str(w, s, len);
}

void toast_gguf_put_str_arr(struct toast_gguf_writer *w, const char *key, const char *const *s, const size_t *len,
			    size_t n)
{
	w_key(w, key, TOAST_GGUF_ARRAY);
	w_le(w, TOAST_GGUF_STRING, 4);
	w_le(w, n, 8);
	for (size_t i = 0; i < n; i++)
		w_str(w, s[i], len[i]);
}

void toast_gguf_put_i32_arr(struct toast_gguf_writer *w, const char *key, const int32_t *v, size_t n)
{
	w_key(w, key, TOAST_GGUF_ARRAY);
	w_le(w, TOAST_GGUF_I32, 4);
	w_le(w, n, 8);
	for (size_t i = 0; i < n; i++)
		w_le(w, (uint32_t)v[i], 4);
}

void toast_gguf_add_tensor(struct toast_gguf_writer *w, const char *name, enum toast_dtype t, int n_dims,
			   const int64_t *shape)
{
	int gt = toast_gguf_ggml_type(t);
	int64_t n = 1;
	size_t nb = 0;
	for (int i = 0; i < n_dims; i++)
		n *= shape[i];
	if ((gt < 0 || n_dims < 1 || n_dims > TOAST_GGUF_MAX_DIMS || !toast_dtype_bytes(t, n, &nb) ||
	     shape[n_dims - 1] % toast_dtypes[t].blck) &&
	    !w->bad[0])
		snprintf(w->bad, sizeof(w->bad), "tensor %s: %s with %d dimensions cannot be stored in GGUF", name,
			 toast_dtype_name(t), n_dims);
	if (w->n_t == w->cap_t) {
		int cap = w->cap_t ? 2 * w->cap_t : 64;
		struct wtensor *nt = realloc(w->t, (size_t)cap * sizeof(*nt));
		if (!nt) {
			w->oom = true;
			return;
		}
		w->t = nt;
		w->cap_t = cap;
	}
	struct wtensor *x = &w->t[w->n_t++];
	memset(x, 0, sizeof(*x));
	x->name = toast_strdup(name);
	x->ggml_type = gt;
	x->n_dims = n_dims;
	for (int i = 0; i < n_dims && i < TOAST_GGUF_MAX_DIMS; i++)
		x->ne[i] = shape[n_dims - 1 - i];
	x->n_bytes = nb;
	if (!x->name)
		w->oom = true;
}

static size_t w_pad(size_t n)
{
	return (n + TOAST_GGUF_DEFAULT_ALIGNMENT - 1) / TOAST_GGUF_DEFAULT_ALIGNMENT * TOAST_GGUF_DEFAULT_ALIGNMENT;
}

static const uint8_t w_zeros[TOAST_GGUF_DEFAULT_ALIGNMENT];

enum toast_status toast_gguf_writer_begin(struct toast_gguf_writer *w, struct toast_error *err)
{
	if (w->bad[0])
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: %s", w->path, w->bad);
	/* the tensor infos follow the metadata in the same buffer */
	uint64_t off = 0;
	for (int i = 0; i < w->n_t; i++) {
		const struct wtensor *x = &w->t[i];
		w_str(w, x->name, strlen(x->name));
		w_le(w, (uint64_t)x->n_dims, 4);
		for (int d = 0; d < x->n_dims; d++)
			w_le(w, (uint64_t)x->ne[d], 8);
		w_le(w, (uint64_t)x->ggml_type, 4);
		w_le(w, off, 8);
		off = w_pad(off + x->n_bytes);
	}
	if (w->oom)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: out of memory", w->path);
	uint8_t hdr[24];
	memcpy(hdr, "GGUF", 4);
	for (int i = 0; i < 4; i++)
		hdr[4 + i] = (uint8_t)(3 >> 8 * i);
	for (int i = 0; i < 8; i++) {
		hdr[8 + i] = (uint8_t)((uint64_t)w->n_t >> 8 * i);
		hdr[16 + i] = (uint8_t)(w->n_kv >> 8 * i);
	}
	w->f = fopen(w->tmp, "wb");
	if (!w->f)
		return toast_err_set(err, TOAST_ERR_IO, "%s: cannot create: %m", w->tmp);
	size_t pos = sizeof(hdr) + w->kv_len;
	if (fwrite(hdr, 1, sizeof(hdr), w->f) != sizeof(hdr) || fwrite(w->kv, 1, w->kv_len, w->f) != w->kv_len ||
	    fwrite(w_zeros, 1, w_pad(pos) - pos, w->f) != w_pad(pos) - pos)
		return toast_err_set(err, TOAST_ERR_IO, "%s: write failed: %m", w->tmp);
	return TOAST_OK;
}

enum toast_status toast_gguf_write_tensor(struct toast_gguf_writer *w, const void *data, size_t n_bytes,
					  struct toast_error *err)
{
	if (!w->f || w->n_written >= w->n_t || w->t[w->n_written].n_bytes != n_bytes)
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: tensor data written out of order or of the wrong size",
				     w->path);
	size_t pad = w_pad(n_bytes) - n_bytes;
	if (fwrite(data, 1, n_bytes, w->f) != n_bytes || fwrite(w_zeros, 1, pad, w->f) != pad)
		return toast_err_set(err, TOAST_ERR_IO, "%s: write failed: %m", w->tmp);
	w->n_written++;
	return TOAST_OK;
}

enum toast_status toast_gguf_writer_finish(struct toast_gguf_writer *w, struct toast_error *err)
{
	if (!w->f || w->n_written != w->n_t)
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: %d of %d tensors written", w->path, w->n_written, w->n_t);
	int rc = fclose(w->f);
	w->f = NULL;
	if (rc != 0 || rename(w->tmp, w->path) != 0) {
		remove(w->tmp);
		return toast_err_set(err, TOAST_ERR_IO, "%s: write failed: %m", w->path);
	}
	return TOAST_OK;
}
