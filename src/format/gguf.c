/*
 * gguf.c - reading GGUF: a bounds-checked cursor over the mapping validates the header, every
 * metadata value and every tensor info before the file is used (see gguf.h).
 */
#include "format/gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/mem.h"

#define GGUF_MAX_KV (1 << 20)
#define GGUF_MAX_TENSORS (1 << 20)
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_NAME 4096
#define GGUF_MAX_ALIGNMENT (1u << 20)

/* ggml types: block elements, block bytes, name; the ones toasted computes with map to a dtype */
static const struct {
	uint32_t id;
	int blck, size;
	const char *name;
	enum toast_dtype dt;
} gguf_ggml_types[] = {
	{0, 1, 4, "F32", TOAST_DT_F32},         {1, 1, 2, "F16", TOAST_DT_F16},
	{2, 32, 18, "Q4_0", TOAST_DT_Q4_0},     {3, 32, 20, "Q4_1", TOAST_DT_Q4_1},
	{6, 32, 22, "Q5_0", TOAST_DT_UNKNOWN},  {7, 32, 24, "Q5_1", TOAST_DT_UNKNOWN},
	{8, 32, 34, "Q8_0", TOAST_DT_Q8_0},     {9, 32, 36, "Q8_1", TOAST_DT_UNKNOWN},
	{10, 256, 84, "Q2_K", TOAST_DT_UNKNOWN}, {11, 256, 110, "Q3_K", TOAST_DT_UNKNOWN},
	{12, 256, 144, "Q4_K", TOAST_DT_Q4_K},  {13, 256, 176, "Q5_K", TOAST_DT_Q5_K},
	{14, 256, 210, "Q6_K", TOAST_DT_Q6_K},  {15, 256, 292, "Q8_K", TOAST_DT_UNKNOWN},
	{16, 256, 66, "IQ2_XXS", TOAST_DT_UNKNOWN}, {17, 256, 74, "IQ2_XS", TOAST_DT_UNKNOWN},
	{18, 256, 98, "IQ3_XXS", TOAST_DT_UNKNOWN}, {19, 256, 50, "IQ1_S", TOAST_DT_UNKNOWN},
	{20, 32, 18, "IQ4_NL", TOAST_DT_UNKNOWN}, {21, 256, 110, "IQ3_S", TOAST_DT_UNKNOWN},
	{22, 256, 82, "IQ2_S", TOAST_DT_UNKNOWN}, {23, 256, 136, "IQ4_XS", TOAST_DT_UNKNOWN},
	{24, 1, 1, "I8", TOAST_DT_UNKNOWN},     {25, 1, 2, "I16", TOAST_DT_UNKNOWN},
	{26, 1, 4, "I32", TOAST_DT_I32},        {27, 1, 8, "I64", TOAST_DT_I64},
	{28, 1, 8, "F64", TOAST_DT_UNKNOWN},    {29, 256, 56, "IQ1_M", TOAST_DT_UNKNOWN},
	{30, 1, 2, "BF16", TOAST_DT_BF16},      {34, 256, 54, "TQ1_0", TOAST_DT_UNKNOWN},
	{35, 256, 66, "TQ2_0", TOAST_DT_UNKNOWN}, {39, 32, 17, "MXFP4", TOAST_DT_UNKNOWN},
};
#define GGUF_N_GGML_TYPES (int)(sizeof(gguf_ggml_types) / sizeof(gguf_ggml_types[0]))

static const int gguf_scalar_size[TOAST_GGUF_N_TYPES] = {
	[TOAST_GGUF_U8] = 1,  [TOAST_GGUF_I8] = 1,  [TOAST_GGUF_U16] = 2, [TOAST_GGUF_I16] = 2,
	[TOAST_GGUF_U32] = 4, [TOAST_GGUF_I32] = 4, [TOAST_GGUF_F32] = 4, [TOAST_GGUF_BOOL] = 1,
	[TOAST_GGUF_U64] = 8, [TOAST_GGUF_I64] = 8, [TOAST_GGUF_F64] = 8,
};

static const char *gguf_type_names[TOAST_GGUF_N_TYPES] = {
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

int toast_gguf_ggml_type(enum toast_dtype t)
{
	for (int i = 0; i < GGUF_N_GGML_TYPES; i++)
		if (gguf_ggml_types[i].dt == t && t != TOAST_DT_UNKNOWN)
			return (int)gguf_ggml_types[i].id;
	return -1;
}

/* ---- bounds-checked cursor ---- */

struct cur {
	const uint8_t *p, *end;
	const char *path;
	struct toast_error *err;
	enum toast_status rc;
};

static bool cur_fail(struct cur *c, const char *what)
{
	if (c->rc == TOAST_OK)
		c->rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "%s: %s (truncated or corrupt GGUF)", c->path, what);
	return false;
}

static bool cur_take(struct cur *c, size_t n, const uint8_t **out, const char *what)
{
	if (c->rc != TOAST_OK)
		return false;
	if ((size_t)(c->end - c->p) < n)
		return cur_fail(c, what);
	*out = c->p;
	c->p += n;
	return true;
}

static uint64_t le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static bool cur_u32(struct cur *c, uint32_t *v, const char *what)
{
	const uint8_t *p;
	if (!cur_take(c, 4, &p, what))
		return false;
	*v = (uint32_t)le(p, 4);
	return true;
}

static bool cur_u64(struct cur *c, uint64_t *v, const char *what)
{
	const uint8_t *p;
	if (!cur_take(c, 8, &p, what))
		return false;
	*v = le(p, 8);
	return true;
}

static bool cur_str(struct cur *c, const char **s, uint64_t *len, uint64_t max, const char *what)
{
	const uint8_t *p;
	if (!cur_u64(c, len, what))
		return false;
	if (*len > max)
		return cur_fail(c, what);
	if (!cur_take(c, (size_t)*len, &p, what))
		return false;
	*s = (const char *)p;
	return true;
}

/* skip one value of type t (arrays of scalars or strings; nested arrays are rejected) */
static bool cur_value(struct cur *c, uint32_t t, struct toast_gguf_kv *kv, const char *key)
{
	char what[160];
	snprintf(what, sizeof(what), "metadata %.100s: bad value", key);
	if (t >= TOAST_GGUF_N_TYPES)
		return cur_fail(c, what);
	kv->type = (enum toast_gguf_type)t;
	kv->n = 1;
	kv->val = c->p;
	const uint8_t *p;
	if (t == TOAST_GGUF_STRING) {
		const char *s;
		uint64_t len;
		return cur_str(c, &s, &len, (uint64_t)(c->end - c->p), what);
	}
	if (t != TOAST_GGUF_ARRAY)
		return cur_take(c, (size_t)gguf_scalar_size[t], &p, what);
	uint32_t at;
	uint64_t n;
	if (!cur_u32(c, &at, what) || !cur_u64(c, &n, what))
		return false;
	if (at >= TOAST_GGUF_N_TYPES || at == TOAST_GGUF_ARRAY)
		return cur_fail(c, what);
	kv->arr_type = (enum toast_gguf_type)at;
	kv->n = n;
	kv->val = c->p;
	if (at != TOAST_GGUF_STRING) {
		size_t bytes;
		if (!toast_mul_ok((size_t)n, (size_t)gguf_scalar_size[at], &bytes) || n > (uint64_t)SIZE_MAX)
			return cur_fail(c, what);
		return cur_take(c, bytes, &p, what);
	}
	if (n > (uint64_t)(c->end - c->p) / 8) /* every string has at least its length */
		return cur_fail(c, what);
	for (uint64_t i = 0; i < n; i++) {
		const char *s;
		uint64_t len;
		if (!cur_str(c, &s, &len, (uint64_t)(c->end - c->p), what))
			return false;
	}
	return true;
}

bool toast_gguf_is_gguf(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return false;
	char b[4];
	bool ok = read(fd, b, 4) == 4 && memcmp(b, "GGUF", 4) == 0;
	close(fd);
	return ok;
}

static int gguf_type_index(uint32_t id)
{
	for (int i = 0; i < GGUF_N_GGML_TYPES; i++)
		if (gguf_ggml_types[i].id == id)
			return i;
	return -1;
}

/* *out = a NUL-terminated copy of a key or name from the file, owned by g */
static enum toast_status gguf_strdup(struct toast_gguf *g, const char *s, size_t len, const char **out,
				     struct toast_error *err)
{
	char *p = malloc(len + 1);
	if (!p)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: out of memory for the header", g->path);
	memcpy(p, s, len);
	p[len] = 0;
	g->strings[g->n_strings++] = p;
	*out = p;
	if (strlen(p) != len)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: a key or tensor name holds a NUL byte", g->path);
	return TOAST_OK;
}

static enum toast_status gguf_tensor_info(struct toast_gguf *g, struct cur *c, struct toast_gguf_tensor *t,
					  struct toast_error *err)
{
	const char *name;
	uint64_t len, off;
	uint32_t nd, type;
	if (!cur_str(c, &name, &len, GGUF_MAX_NAME, "tensor name"))
		return c->rc;
	enum toast_status rc = gguf_strdup(g, name, (size_t)len, &t->name, err);
	if (rc != TOAST_OK)
		return rc;
	if (toast_strmap_get(&g->tensor_index, t->name, (size_t)len) >= 0)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s appears twice", g->path, t->name);
	if (toast_strmap_put(&g->tensor_index, t->name, (size_t)len, (int)(t - g->tensors)) != 0)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: out of memory for the header", g->path);
	if (!cur_u32(c, &nd, "tensor dimensions"))
		return c->rc;
	if (nd < 1 || nd > TOAST_GGUF_MAX_DIMS)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s has %u dimensions (1 to %d)", g->path, t->name,
				     nd, TOAST_GGUF_MAX_DIMS);
	t->n_dims = (int)nd;
	size_t numel = 1;
	for (int i = 0; i < TOAST_GGUF_MAX_DIMS; i++) {
		uint64_t ne = 1;
		if (i < t->n_dims && !cur_u64(c, &ne, "tensor shape"))
			return c->rc;
		if (ne > INT64_MAX || !toast_mul_ok(numel, (size_t)ne, &numel) || numel > (size_t)INT64_MAX)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: absurd shape", g->path, t->name);
		t->ne[i] = (int64_t)ne;
	}
	if (!cur_u32(c, &type, "tensor type") || !cur_u64(c, &off, "tensor offset"))
		return c->rc;
	int ti = gguf_type_index(type);
	if (ti < 0)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: unknown ggml type %u", g->path, t->name, type);
	t->ggml_type = type;
	t->dtype = gguf_ggml_types[ti].dt;
	t->type_name = gguf_ggml_types[ti].name;
	t->offset = off;
	int blck = gguf_ggml_types[ti].blck;
	if (t->ne[0] % blck)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: row of %lld elements is not whole %s blocks of %d",
				     g->path, t->name, (long long)t->ne[0], t->type_name, blck);
	if (!toast_mul_ok(numel / (size_t)blck, (size_t)gguf_ggml_types[ti].size, &t->n_bytes))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: absurd size", g->path, t->name);
	return TOAST_OK;
}

static enum toast_status gguf_parse(struct toast_gguf *g, struct toast_error *err)
{
	struct cur c = {g->map.data, (const uint8_t *)g->map.data + g->map.size, g->path, err, TOAST_OK};
	const uint8_t *p;
	uint32_t version;
	uint64_t n_tensors, n_kv;
	if (g->map.size < 4 || memcmp(g->map.data, "GGUF", 4) != 0)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->path);
	cur_take(&c, 4, &p, "magic");
	if (!cur_u32(&c, &version, "header"))
		return c.rc;
	if (version == 0x03000000 || version == 0x02000000)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: big-endian GGUF is not supported", g->path);
	if (version != 2 && version != 3)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 or 3)", g->path,
				     version);
	g->version = version;
	if (!cur_u64(&c, &n_tensors, "header") || !cur_u64(&c, &n_kv, "header"))
		return c.rc;
	/* every kv takes at least 13 bytes and every tensor info at least 28 */
	size_t left = (size_t)(c.end - c.p);
	if (n_kv > GGUF_MAX_KV || n_tensors > GGUF_MAX_TENSORS || n_kv > left / 13 || n_tensors > left / 28)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: absurd counts (%llu tensors, %llu metadata keys)", g->path,
				     (unsigned long long)n_tensors, (unsigned long long)n_kv);
	g->kv = calloc((size_t)n_kv + 1, sizeof(*g->kv));
	g->tensors = calloc((size_t)n_tensors + 1, sizeof(*g->tensors));
	g->strings = calloc((size_t)(n_kv + n_tensors) + 1, sizeof(char *));
	if (!g->kv || !g->tensors || !g->strings || toast_strmap_init(&g->kv_index, (size_t)n_kv) != 0 ||
	    toast_strmap_init(&g->tensor_index, (size_t)n_tensors) != 0)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: out of memory for the header", g->path);
	g->alignment = TOAST_GGUF_DEFAULT_ALIGNMENT;
	for (uint64_t i = 0; i < n_kv; i++) {
		struct toast_gguf_kv *kv = &g->kv[i];
		const char *key;
		uint64_t len;
		uint32_t type;
		if (!cur_str(&c, &key, &len, GGUF_MAX_KEY, "metadata key"))
			return c.rc;
		enum toast_status rc = gguf_strdup(g, key, (size_t)len, &kv->key, err);
		if (rc != TOAST_OK)
			return rc;
		if (toast_gguf_find(g, kv->key))
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata key %s appears twice", g->path, kv->key);
		if (toast_strmap_put(&g->kv_index, kv->key, (size_t)len, (int)i) != 0)
			return toast_err_set(err, TOAST_ERR_NOMEM, "%s: out of memory for the header", g->path);
		if (!cur_u32(&c, &type, "metadata type") || !cur_value(&c, type, kv, kv->key))
			return c.rc;
		g->n_kv++;
	}
	int64_t al;
	enum toast_status rc = toast_gguf_get_int(g, "general.alignment", false, TOAST_GGUF_DEFAULT_ALIGNMENT, 1,
						  GGUF_MAX_ALIGNMENT, &al, err);
	if (rc != TOAST_OK)
		return rc;
	if (al & (al - 1))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: general.alignment %lld is not a power of two", g->path,
				     (long long)al);
	g->alignment = (size_t)al;
	for (uint64_t i = 0; i < n_tensors; i++) {
		if ((rc = gguf_tensor_info(g, &c, &g->tensors[i], err)) != TOAST_OK)
			return rc;
		g->n_tensors++;
	}
	size_t hdr = (size_t)(c.p - (const uint8_t *)g->map.data);
	g->data_offset = (hdr + g->alignment - 1) / g->alignment * g->alignment;
	if (g->data_offset > g->map.size && n_tensors > 0)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: truncated before the tensor data", g->path);
	size_t data_size = g->data_offset <= g->map.size ? g->map.size - g->data_offset : 0;
	for (int i = 0; i < g->n_tensors; i++) {
		struct toast_gguf_tensor *t = &g->tensors[i];
		if (t->offset % g->alignment)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s: data offset %llu is not aligned to %zu",
					     g->path, t->name, (unsigned long long)t->offset, g->alignment);
		if (t->offset > data_size || t->n_bytes > data_size - t->offset)
			return toast_err_set(err, TOAST_ERR_FORMAT,
					     "%s: tensor %s: data [%llu, +%zu) runs past the end of the file (%zu data bytes): "
					     "truncated?",
					     g->path, t->name, (unsigned long long)t->offset, t->n_bytes, data_size);
		t->data = (const uint8_t *)g->map.data + g->data_offset + t->offset;
	}
	return TOAST_OK;
}

enum toast_status toast_gguf_open(struct toast_gguf *g, const char *path, struct toast_error *err)
{
	memset(g, 0, sizeof(*g));
	g->path = toast_strdup(path);
	if (!g->path)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = toast_map_open(&g->map, path, err);
	if (rc == TOAST_OK)
		rc = gguf_parse(g, err);
	if (rc != TOAST_OK)
		toast_gguf_close(g);
	return rc;
}

void toast_gguf_close(struct toast_gguf *g)
{
	if (!g)
		return;
	toast_map_close(&g->map);
	for (int i = 0; i < g->n_strings; i++)
		free(g->strings[i]);
	free(g->strings);
	toast_strmap_deinit(&g->kv_index);
	toast_strmap_deinit(&g->tensor_index);
	free(g->kv);
	free(g->tensors);
	free(g->path);
	memset(g, 0, sizeof(*g));
}

const struct toast_gguf_kv *toast_gguf_find(const struct toast_gguf *g, const char *key)
{
	int i = g->kv_index.cap ? toast_strmap_get(&g->kv_index, key, strlen(key)) : -1;
	return i >= 0 ? &g->kv[i] : NULL;
}

const struct toast_gguf_tensor *toast_gguf_find_tensor(const struct toast_gguf *g, const char *name)
{
	int i = g->tensor_index.cap ? toast_strmap_get(&g->tensor_index, name, strlen(name)) : -1;
	return i >= 0 ? &g->tensors[i] : NULL;
}

static bool gguf_int_of(enum toast_gguf_type t, const uint8_t *p, int64_t *v, bool *too_big)
{
	*too_big = false;
	switch (t) {
	case TOAST_GGUF_U8: *v = p[0]; return true;
	case TOAST_GGUF_I8: *v = (int8_t)p[0]; return true;
	case TOAST_GGUF_U16: *v = (int64_t)le(p, 2); return true;
	case TOAST_GGUF_I16: *v = (int16_t)le(p, 2); return true;
	case TOAST_GGUF_U32: *v = (int64_t)le(p, 4); return true;
	case TOAST_GGUF_I32: *v = (int32_t)le(p, 4); return true;
	case TOAST_GGUF_I64: *v = (int64_t)le(p, 8); return true;
	case TOAST_GGUF_U64: *v = (int64_t)le(p, 8); *too_big = le(p, 8) > INT64_MAX; return true;
	default: return false;
	}
}

int64_t toast_gguf_arr_int(const struct toast_gguf_kv *kv, uint64_t i)
{
	int64_t v = 0;
	bool big;
	gguf_int_of(kv->arr_type, kv->val + i * (uint64_t)gguf_scalar_size[kv->arr_type], &v, &big);
	return v;
}

static double gguf_f64_of(enum toast_gguf_type t, const uint8_t *p)
{
	if (t == TOAST_GGUF_F32) {
		uint32_t u = (uint32_t)le(p, 4);
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	if (t == TOAST_GGUF_F64) {
		uint64_t u = le(p, 8);
		double d;
		memcpy(&d, &u, 8);
		return d;
	}
	int64_t v = 0;
	bool big;
	gguf_int_of(t, p, &v, &big);
	return (double)v;
}

double toast_gguf_arr_f64(const struct toast_gguf_kv *kv, uint64_t i)
{
	return gguf_f64_of(kv->arr_type, kv->val + i * (uint64_t)gguf_scalar_size[kv->arr_type]);
}

static enum toast_status gguf_absent(const struct toast_gguf *g, const char *key, bool required,
				     struct toast_error *err)
{
	return required ? toast_err_set(err, TOAST_ERR_FORMAT, "%s: missing metadata %s", g->path, key) : TOAST_OK;
}

enum toast_status toast_gguf_get_int(const struct toast_gguf *g, const char *key, bool required, int64_t def,
				     int64_t lo, int64_t hi, int64_t *out, struct toast_error *err)
{
	const struct toast_gguf_kv *kv = toast_gguf_find(g, key);
	*out = def;
	if (!kv)
		return gguf_absent(g, key, required, err);
	int64_t v;
	bool big;
	if (!gguf_int_of(kv->type, kv->val, &v, &big))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata %s is a %s, not an integer", g->path, key,
				     gguf_type_names[kv->type]);
	if (big || v < lo || v > hi)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata %s = %lld outside [%lld, %lld]", g->path, key,
				     (long long)v, (long long)lo, (long long)hi);
	*out = v;
	return TOAST_OK;
}

enum toast_status toast_gguf_get_f32(const struct toast_gguf *g, const char *key, bool required, float def,
				     float *out, struct toast_error *err)
{
	const struct toast_gguf_kv *kv = toast_gguf_find(g, key);
	*out = def;
	if (!kv)
		return gguf_absent(g, key, required, err);
	if (kv->type != TOAST_GGUF_F32 && kv->type != TOAST_GGUF_F64)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata %s is a %s, not a float", g->path, key,
				     gguf_type_names[kv->type]);
	*out = (float)gguf_f64_of(kv->type, kv->val);
	return TOAST_OK;
}

enum toast_status toast_gguf_get_bool(const struct toast_gguf *g, const char *key, bool required, bool def,
				      bool *out, struct toast_error *err)
{
	const struct toast_gguf_kv *kv = toast_gguf_find(g, key);
	*out = def;
	if (!kv)
		return gguf_absent(g, key, required, err);
	if (kv->type != TOAST_GGUF_BOOL)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata %s is a %s, not a bool", g->path, key,
				     gguf_type_names[kv->type]);
	*out = kv->val[0] != 0;
	return TOAST_OK;
}

enum toast_status toast_gguf_get_str(const struct toast_gguf *g, const char *key, bool required, const char **s,
				     size_t *len, struct toast_error *err)
{
	const struct toast_gguf_kv *kv = toast_gguf_find(g, key);
	*s = NULL;
	*len = 0;
	if (!kv)
		return gguf_absent(g, key, required, err);
	if (kv->type != TOAST_GGUF_STRING)
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: metadata %s is a %s, not a string", g->path, key,
				     gguf_type_names[kv->type]);
	*len = (size_t)le(kv->val, 8);
	*s = (const char *)kv->val + 8;
	return TOAST_OK;
}

void toast_gguf_next_str(const struct toast_gguf_kv *kv, size_t *pos, const char **s, size_t *len)
{
	*len = (size_t)le(kv->val + *pos, 8);
	*s = (const char *)kv->val + *pos + 8;
	*pos += 8 + *len;
}
