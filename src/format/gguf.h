/*
 * gguf.h - GGUF files (versions 2 and 3, little-endian): reading the metadata and the tensor
 * infos of a mapped file, and writing a file.
 *
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv of {string key, u32 type, value};
 * n_tensors of {string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset}; padding to
 * general.alignment (default 32); the data section. Strings are u64 length + bytes (no NUL).
 * ne[] is innermost first: ne[0] is the row length, so a PyTorch [n_out][n_in] matrix has
 * ne = {n_in, n_out}. Tensor offsets are relative to the data section and aligned.
 *
 * The file is untrusted: open validates every count, length, type, shape, offset and size
 * against the file before anything is used, so the accessors below cannot read out of bounds.
 */
#ifndef TOAST_FORMAT_GGUF_H
#define TOAST_FORMAT_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "format/dtype.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/strmap.h"

enum toast_gguf_type {
	TOAST_GGUF_U8, TOAST_GGUF_I8, TOAST_GGUF_U16, TOAST_GGUF_I16, TOAST_GGUF_U32, TOAST_GGUF_I32,
	TOAST_GGUF_F32, TOAST_GGUF_BOOL, TOAST_GGUF_STRING, TOAST_GGUF_ARRAY, TOAST_GGUF_U64,
	TOAST_GGUF_I64, TOAST_GGUF_F64, TOAST_GGUF_N_TYPES
};

#define TOAST_GGUF_MAX_DIMS 4
#define TOAST_GGUF_DEFAULT_ALIGNMENT 32

struct toast_gguf_kv {
	const char *key; /* NUL-terminated copy */
	enum toast_gguf_type type;
	enum toast_gguf_type arr_type; /* element type when type is ARRAY */
	uint64_t n;                    /* array length (1 for a scalar) */
	const uint8_t *val;            /* the value (scalar, string or array body) in the mapping */
};

struct toast_gguf_tensor {
	const char *name; /* NUL-terminated copy */
	int n_dims;
	int64_t ne[TOAST_GGUF_MAX_DIMS]; /* innermost first; unused dims 1 */
	uint32_t ggml_type;
	enum toast_dtype dtype; /* TOAST_DT_UNKNOWN for ggml types the engine does not compute with */
	const char *type_name;
	uint64_t offset;
	const void *data;
	size_t n_bytes;
};

struct toast_gguf {
	char *path;
	struct toast_map map;
	uint32_t version;
	int n_kv, n_tensors;
	struct toast_gguf_kv *kv;
	struct toast_gguf_tensor *tensors;
	char **strings; /* NUL-terminated copies of keys and names, n_kv + n_tensors of them */
	int n_strings;
	struct toast_strmap kv_index, tensor_index;
	size_t alignment, data_offset;
};

/* Map and validate path. */
enum toast_status toast_gguf_open(struct toast_gguf *g, const char *path, struct toast_error *err);
void toast_gguf_close(struct toast_gguf *g);
/* true when the file at path starts with the GGUF magic */
bool toast_gguf_is_gguf(const char *path);

const struct toast_gguf_kv *toast_gguf_find(const struct toast_gguf *g, const char *key);
/*
 * Typed getters. Each returns TOAST_OK with the value, TOAST_ERR_FORMAT (message naming the
 * key) when the key has the wrong type or is out of [lo, hi], and when the key is absent:
 * the default (and TOAST_OK) if `required` is false, else TOAST_ERR_FORMAT.
 */
enum toast_status toast_gguf_get_int(const struct toast_gguf *g, const char *key, bool required, int64_t def,
				     int64_t lo, int64_t hi, int64_t *out, struct toast_error *err);
enum toast_status toast_gguf_get_f32(const struct toast_gguf *g, const char *key, bool required, float def,
				     float *out, struct toast_error *err);
enum toast_status toast_gguf_get_bool(const struct toast_gguf *g, const char *key, bool required, bool def,
				      bool *out, struct toast_error *err);
/* A string value: *s points into the mapping (not NUL-terminated), *len its bytes; NULL if absent
 * and not required. */
enum toast_status toast_gguf_get_str(const struct toast_gguf *g, const char *key, bool required, const char **s,
				     size_t *len, struct toast_error *err);
/* Walk an array of strings: *pos starts at 0; each call gives the next string. */
void toast_gguf_next_str(const struct toast_gguf_kv *kv, size_t *pos, const char **s, size_t *len);
/* Element i of an integer or float array as int64 / double (the caller checked i < kv->n). */
int64_t toast_gguf_arr_int(const struct toast_gguf_kv *kv, uint64_t i);
double toast_gguf_arr_f64(const struct toast_gguf_kv *kv, uint64_t i);

const struct toast_gguf_tensor *toast_gguf_find_tensor(const struct toast_gguf *g, const char *name);

/* ggml type id of a toasted dtype that GGUF can store (-1 for none) and back. */
int toast_gguf_ggml_type(enum toast_dtype t);

/* ---- writing (gguf_write.c) ---- */

struct toast_gguf_writer;

/*
 * Writing a file: new(), put_*() the metadata and add_tensor() every tensor (name, shape
 * outermost first, type), begin() (writes the header), write_tensor() each tensor's data in the
 * order added, finish() (renames PATH.part to PATH). free() at any point discards the file.
 */
enum toast_status toast_gguf_writer_new(const char *path, struct toast_gguf_writer **out, struct toast_error *err);
void toast_gguf_writer_free(struct toast_gguf_writer *w);
void toast_gguf_put_u32(struct toast_gguf_writer *w, const char *key, uint32_t v);
void toast_gguf_put_i32(struct toast_gguf_writer *w, const char *key, int32_t v);
void toast_gguf_put_f32(struct toast_gguf_writer *w, const char *key, float v);
void toast_gguf_put_bool(struct toast_gguf_writer *w, const char *key, bool v);
void toast_gguf_put_str(struct toast_gguf_writer *w, const char *key, const char *s, size_t len);
/* arrays: strings (s[i] of len[i] bytes), int32 */
void toast_gguf_put_str_arr(struct toast_gguf_writer *w, const char *key, const char *const *s, const size_t *len,
			    size_t n);
void toast_gguf_put_i32_arr(struct toast_gguf_writer *w, const char *key, const int32_t *v, size_t n);
void toast_gguf_add_tensor(struct toast_gguf_writer *w, const char *name, enum toast_dtype t, int n_dims,
			   const int64_t *shape);
enum toast_status toast_gguf_writer_begin(struct toast_gguf_writer *w, struct toast_error *err);
enum toast_status toast_gguf_write_tensor(struct toast_gguf_writer *w, const void *data, size_t n_bytes,
					  struct toast_error *err);
enum toast_status toast_gguf_writer_finish(struct toast_gguf_writer *w, struct toast_error *err);

#endif
