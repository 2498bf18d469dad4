/*
 * test_load_errors.c - damaged model directories must fail to open with the right status and a
 * message naming the object (file, tensor, key), never crash and never leak (run it under
 * valgrind or the ASan build to see the last two).
 *
 * Every case is made from a good fixture (qwen3next-odd: hybrid attention/GDN with MoE, so
 * every kind of tensor is there) in a temporary directory: the safetensors file truncated at
 * several points or rewritten with a header that lies (offsets, sizes, dtypes, shapes,
 * alignment, overlaps, duplicates, a header length beyond the file, no JSON at all), a sharded
 * index that points at a missing shard, at the wrong shard or outside the directory, missing
 * tensors, tensors of the wrong shape or dtype, and config.json with an unknown model_type,
 * missing keys, values out of range, unsupported variants, or no JSON object at all. Positive
 * controls (the rewritten file and a sharded split of it) must load.
 */
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "toasted.h"
#include "util/fs.h"

#define FIXTURE "qwen3next-odd"
#define T_QKVZ "model.layers.0.linear_attn.in_proj_qkvz.weight" /* BF16 [264, 52] */
#define T_EXPERT "model.layers.4.mlp.experts.11.down_proj.weight"

static char dir[300];            /* the damaged model directory */
static json_t *good_hdr;         /* the fixture's safetensors header */
static unsigned char *good_data; /* and its data section */
static size_t good_n;
static json_t *good_cfg;

static const char *dir_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
				  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void dir_clear(void)
{
	char p[512];
	for (size_t i = 0; i < sizeof(dir_files) / sizeof(dir_files[0]); i++) {
		toast_path_join(p, sizeof(p), dir, dir_files[i]);
		unlink(p);
		rmdir(p);
	}
}

static void write_file(const char *name, const void *a, size_t na, const void *b, size_t nb)
{
	char p[512];
	toast_path_join(p, sizeof(p), dir, name);
	FILE *f = fopen(p, "wb");
	CHECK(f && fwrite(a, 1, na, f) == na && (!nb || fwrite(b, 1, nb, f) == nb) && fclose(f) == 0, "cannot write %s",
	      p);
}

/* a safetensors file: 8-byte little-endian header length, the header padded with spaces to a
 * multiple of 8 (as writers do), the data; truncated to `keep` bytes when keep >= 0 */
static void write_st(const char *name, json_t *hdr, const unsigned char *data, size_t n, long keep)
{
	char *js = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
	size_t hl = strlen(js), padded = (hl + 7) / 8 * 8;
	size_t total = 8 + padded + n;
	unsigned char *buf = malloc(total);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	memcpy(buf + 8, js, hl);
	memset(buf + 8 + hl, ' ', padded - hl);
	memcpy(buf + 8 + padded, data, n);
	write_file(name, buf, keep >= 0 && (size_t)keep < total ? (size_t)keep : total, NULL, 0);
	free(buf);
	free(js);
}

static void write_json(const char *name, json_t *j)
{
	char *s = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	write_file(name, s, strlen(s), NULL, 0);
	free(s);
}

/* the good directory: config.json and model.safetensors as the fixture has them */
static void write_good(void)
{
	dir_clear();
	write_json("config.json", good_cfg);
	write_st("model.safetensors", good_hdr, good_data, good_n, -1);
}

/* Open the directory with options o; the status must be `want` and the message must contain `name`. */
static void expect_opts(const struct toast_engine_opts *o, enum toast_status want, const char *name, const char *what)
{
	struct toast_engine *e = NULL;
	struct toast_error err = {0};
	enum toast_status st = toast_engine_open(dir, o, &e, &err);
	CHECK(st == want, "%s: status %s (want %s): %s", what, toast_status_name(st), toast_status_name(want), err.msg);
	CHECK(want == TOAST_OK || (!e && err.code == st), "%s: error without a cleared engine or a code", what);
	CHECK(!name || strstr(err.msg, name), "%s: message \"%s\" does not name %s", what, err.msg, name);
	if (want != TOAST_OK)
		CHECK(strlen(err.msg) > 10, "%s: no message", what);
	toast_engine_close(e);
}

static void expect(enum toast_status want, const char *name, const char *what)
{
	struct toast_engine_opts o;
	toast_engine_opts_init(&o);
	o.backend = "cpu";
	o.n_threads = 1;
	expect_opts(&o, want, name, what);
}

static json_t *entry(json_t *hdr, const char *tensor)
{
	json_t *e = json_object_get(hdr, tensor);
	CHECK(e, "fixture has no %s", tensor);
	return e;
}

static json_t *ints(int n, const long long *v)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_integer(v[i]));
	return a;
}

/* ---- safetensors ---- */

static void test_truncated(void)
{
	char *js = json_dumps(good_hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
	long hl = (long)(strlen(js) + 7) / 8 * 8, total = 8 + hl + (long)good_n;
	free(js);
	const long at[] = {0, 5, 8, 8 + hl / 2, 8 + hl, 8 + hl + 1, 8 + hl + (long)good_n / 2, total - 1};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		write_good();
		write_st("model.safetensors", good_hdr, good_data, good_n, at[i]);
		char what[64];
		snprintf(what, sizeof(what), "truncated at %ld of %ld bytes", at[i], total);
		expect(TOAST_ERR_FORMAT, "model.safetensors", what);
	}
}

/* write raw bytes as model.safetensors: a header length and header text of our choosing */
static void write_raw_header(uint64_t hlen, const char *text)
{
	unsigned char len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)(hlen >> (8 * i));
	write_file("model.safetensors", len, 8, text, strlen(text));
}

static void test_bad_header(void)
{
	static const struct {
		uint64_t hlen; /* 0: the text's length */
		const char *text, *what;
	} cases[] = {
		{1ull << 40, "{}", "header length beyond the file"},
		{UINT64_MAX, "{}", "header length 2^64-1"},
		{0, "\x01\x02garbage\xff", "header is not JSON"},
		{0, "{\"a\": ", "header JSON cut short"},
		{0, "[1, 2]", "header is an array"},
		{0, "{\"x\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}, "
		    "\"x\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}}",
		 "duplicate names"},
		{0, "{\"x\": [1]}", "entry not an object"},
		{0, "{\"x\": {\"shape\": [1], \"data_offsets\": [0, 2]}}", "entry without dtype"},
		{0, "{\"x\": {\"dtype\": \"BF16\", \"data_offsets\": [0, 2]}}", "entry without shape"},
		{0, "{\"x\": {\"dtype\": \"BF16\", \"shape\": [1]}}", "entry without data_offsets"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		write_good();
		write_raw_header(cases[i].hlen ? cases[i].hlen : strlen(cases[i].text), cases[i].text);
		expect(TOAST_ERR_FORMAT, "model.safetensors", cases[i].what);
	}
}

/* header entry changes: field of T_QKVZ (BF16 [264, 52], 27456 bytes) set to a JSON value */
static void test_lying_entries(void)
{
	json_t *e = entry(good_hdr, T_QKVZ);
	long long b = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
	long long n_bytes = 264 * 52 * 2, end = b + n_bytes, total = (long long)good_n;
	const long long off_past[] = {total - 10, total + n_bytes - 10}, off_neg[] = {-2, n_bytes - 2},
			off_rev[] = {end, b}, off_big[] = {b, end + (1ll << 50)}, off_odd[] = {b + 1, end + 1},
			off_short[] = {b, end - 2}, off_zero[] = {0, n_bytes}, shape_big[] = {264, 53},
			shape_neg[] = {-264, -52}, shape_huge[] = {1ll << 62, 1ll << 62},
			shape_9d[] = {1, 1, 1, 1, 1, 1, 1, 264, 52}, off3[] = {b, end, end};
	static const char *bad_dtypes[] = {"Q4_0", "", "bf16"};
	struct {
		const char *field;
		json_t *value;
		const char *what;
	} cases[] = {
		{"data_offsets", ints(2, off_past), "data beyond the end of the file"},
		{"data_offsets", ints(2, off_neg), "negative offset"},
		{"data_offsets", ints(2, off_rev), "end before begin"},
		{"data_offsets", ints(2, off_big), "end far beyond the file"},
		{"data_offsets", ints(2, off_short), "byte count smaller than the shape's"},
		{"data_offsets", ints(2, off_odd), "data not aligned to its elements"},
		{"data_offsets", ints(2, off_zero), "overlapping another tensor"},
		{"data_offsets", ints(3, off3), "three offsets"},
		{"data_offsets", json_pack("[s, i]", "0", end), "string offset"},
		{"shape", ints(2, shape_big), "shape larger than the bytes"},
		{"shape", ints(2, shape_neg), "negative dimensions"},
		{"shape", ints(2, shape_huge), "dimensions whose product overflows"},
		{"shape", ints(9, shape_9d), "nine dimensions"},
		{"shape", json_pack("[s]", "264"), "string dimension"},
		{"dtype", json_string(bad_dtypes[0]), "unknown dtype"},
		{"dtype", json_string(bad_dtypes[1]), "empty dtype"},
		{"dtype", json_string(bad_dtypes[2]), "lower-case dtype"},
		{"dtype", json_integer(2), "numeric dtype"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *h = json_deep_copy(good_hdr);
		json_object_set_new(json_object_get(h, T_QKVZ), cases[i].field, cases[i].value);
		write_good();
		write_st("model.safetensors", h, good_data, good_n, -1);
		expect(TOAST_ERR_FORMAT, T_QKVZ, cases[i].what);
		json_decref(h);
	}
}

/* tensors that are valid safetensors but not what the model needs */
static void test_wrong_tensors(void)
{
	static const long long swapped[] = {52, 264}, flat[] = {264 * 52}, conv_bad[] = {96, 2, 3};
	struct {
		const char *tensor, *field;
		json_t *value; /* NULL: delete the tensor */
		const char *what;
	} cases[] = {
		{T_EXPERT, NULL, NULL, "missing expert tensor"},
		{"model.layers.2.self_attn.k_norm.weight", NULL, NULL, "missing k_norm"},
		{"model.norm.weight", NULL, NULL, "missing final norm"},
		{"lm_head.weight", NULL, NULL, "missing lm_head (untied)"},
		{"model.layers.6.mlp.shared_expert.up_proj.weight", NULL, NULL, "missing shared expert"},
		{T_QKVZ, "shape", ints(2, swapped), "transposed matrix"},
		{T_QKVZ, "shape", ints(1, flat), "flattened matrix"},
		{"model.layers.0.linear_attn.conv1d.weight", "shape", ints(3, conv_bad), "conv1d of the right size and the wrong shape"},
		{T_QKVZ, "dtype", json_string("I16"), "integer dtype"},
		{T_QKVZ, "dtype", json_string("U16"), "dtype the engine does not compute with"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *h = json_deep_copy(good_hdr);
		if (cases[i].value)
			json_object_set_new(json_object_get(h, cases[i].tensor), cases[i].field, cases[i].value);
		else
			json_object_del(h, cases[i].tensor);
		write_good();
		write_st("model.safetensors", h, good_data, good_n, -1);
		expect(TOAST_ERR_FORMAT, cases[i].tensor, cases[i].what);
		json_decref(h);
	}
}

/* ---- sharded ---- */

/* split the fixture into two shards (tensors alternate) and write the index; mutate(index)
 * may then change the weight map */
static json_t *write_shards(bool duplicate_one)
{
	static const char *names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
	json_t *hdr[2] = {json_object(), json_object()}, *wm = json_object();
	unsigned char *data[2] = {malloc(good_n), malloc(good_n)};
	size_t n[2] = {0, 0};
	int i = 0;
	const char *k;
	json_t *v;
	json_object_foreach(good_hdr, k, v)
	{
		if (strcmp(k, "__metadata__") == 0)
			continue;
		json_t *off = json_object_get(v, "data_offsets");
		size_t b = (size_t)json_integer_value(json_array_get(off, 0)), e = (size_t)json_integer_value(json_array_get(off, 1));
		int s = i++ % 2;
		for (int copy = 0; copy < (duplicate_one && i == 5 ? 2 : 1); copy++, s ^= 1) {
			json_t *nv = json_deep_copy(v);
			const long long no[2] = {(long long)n[s], (long long)(n[s] + e - b)};
			json_object_set_new(nv, "data_offsets", ints(2, no));
			json_object_set_new(hdr[s], k, nv);
			memcpy(data[s] + n[s], good_data + b, e - b);
			n[s] += e - b;
			json_object_set_new(wm, k, json_string(names[s]));
		}
	}
	for (int s = 0; s < 2; s++) {
		write_st(names[s], hdr[s], data[s], n[s], -1);
		json_decref(hdr[s]);
		free(data[s]);
	}
	json_t *index = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", (json_int_t)good_n, "weight_map", wm);
	write_json("model.safetensors.index.json", index);
	return index;
}

static void test_sharded(void)
{
	dir_clear();
	write_json("config.json", good_cfg);
	json_decref(write_shards(false));
	expect(TOAST_OK, NULL, "two shards");

	static const struct {
		const char *shard; /* what the index says for T_QKVZ; NULL: the shard it is not in */
		enum toast_status want;
		const char *name, *what;
	} cases[] = {
		{"model-00003-of-00002.safetensors", TOAST_ERR_IO, "model-00003-of-00002.safetensors", "missing shard"},
		{NULL, TOAST_ERR_FORMAT, T_QKVZ, "tensor not in the shard the index names"},
		{"../qwen3next-odd/model.safetensors", TOAST_ERR_FORMAT, T_QKVZ, "shard path outside the directory"},
		{"/etc/passwd", TOAST_ERR_FORMAT, T_QKVZ, "absolute shard path"},
		{"..", TOAST_ERR_FORMAT, T_QKVZ, "shard called .."},
		{"", TOAST_ERR_FORMAT, T_QKVZ, "empty shard name"},
		{"config.json", TOAST_ERR_FORMAT, "config.json", "shard that is not safetensors"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dir_clear();
		write_json("config.json", good_cfg);
		json_t *index = write_shards(false);
		json_t *wm = json_object_get(index, "weight_map");
		const char *in = json_string_value(json_object_get(wm, T_QKVZ)), *other = "model-00001-of-00002.safetensors";
		if (strcmp(in, other) == 0)
			other = "model-00002-of-00002.safetensors";
		json_object_set_new(wm, T_QKVZ, json_string(cases[i].shard ? cases[i].shard : other));
		write_json("model.safetensors.index.json", index);
		json_decref(index);
		expect(cases[i].want, cases[i].name, cases[i].what);
	}

	dir_clear();
	write_json("config.json", good_cfg);
	json_decref(write_shards(true));
	expect(TOAST_ERR_FORMAT, "appears twice", "a tensor in two shards");

	/* an index naming many shards must not take quadratic time to list them */
	dir_clear();
	write_json("config.json", good_cfg);
	json_t *wm = json_object();
	for (int i = 0; i < 100000; i++) {
		char k[32], v[48];
		snprintf(k, sizeof(k), "t%d", i);
		snprintf(v, sizeof(v), "model-%06d-of-100000.safetensors", i);
		json_object_set_new(wm, k, json_string(v));
	}
	json_t *index = json_pack("{s:o}", "weight_map", wm);
	write_json("model.safetensors.index.json", index);
	json_decref(index);
	expect(TOAST_ERR_IO, "model-000000-of-100000.safetensors", "100000 shards, none there");

	static const char *bad_index[] = {"not json", "[]", "{\"weight_map\": []}", "{\"weight_map\": {}}",
					  "{\"weight_map\": {\"x\": 3}}", "{}"};
	for (size_t i = 0; i < sizeof(bad_index) / sizeof(bad_index[0]); i++) {
		write_good();
		write_file("model.safetensors.index.json", bad_index[i], strlen(bad_index[i]), NULL, 0);
		expect(TOAST_ERR_FORMAT, "model.safetensors.index.json", bad_index[i]);
	}
}

/* ---- files ---- */

static void test_missing_files(void)
{
	write_good();
	char p[512];
	toast_path_join(p, sizeof(p), dir, "model.safetensors");
	unlink(p);
	expect(TOAST_ERR_IO, "model.safetensors", "no weights file");

	write_good();
	toast_path_join(p, sizeof(p), dir, "config.json");
	unlink(p);
	expect(TOAST_ERR_IO, "config.json", "no config.json");

	write_good();
	unlink(p);
	CHECK(mkdir(p, 0700) == 0, "mkdir %s", p);
	expect(TOAST_ERR_IO, "config.json", "config.json is a directory");
	rmdir(p);

	write_good();
	toast_path_join(p, sizeof(p), dir, "model.safetensors");
	unlink(p);
	CHECK(mkdir(p, 0700) == 0, "mkdir %s", p);
	expect(TOAST_ERR_IO, "model.safetensors", "model.safetensors is a directory");
	rmdir(p);

	write_good();
	char *big = malloc(5u << 20);
	memset(big, ' ', 5u << 20);
	write_file("config.json", big, 5u << 20, NULL, 0);
	free(big);
	expect(TOAST_ERR_FORMAT, "config.json", "config.json of 5 MiB");

	char saved[sizeof(dir) - 32];
	write_good();
	snprintf(saved, sizeof(saved), "%.*s", (int)sizeof(saved) - 1, dir);
	snprintf(dir, sizeof(dir), "%s/no-such-model", saved);
	expect(TOAST_ERR_IO, "no-such-model", "no such directory");
	snprintf(dir, sizeof(dir), "%s/model.safetensors", saved);
	expect(TOAST_ERR_IO, "model.safetensors/config.json", "a file for the directory");
	snprintf(dir, sizeof(dir), "%s", saved);
}

static void test_bad_options(void)
{
	static const struct {
		const char *backend;
		int n_threads, chunk;
		const char *name;
	} cases[] = {
		{"gpu", 1, 0, "gpu"}, {"cpu", -1, 0, "thread"}, {"cpu", 100000, 0, "thread"},
		{"cpu", 1, -1, "chunk"}, {"cpu", 1, 100000, "chunk"},
	};
	write_good();
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct toast_engine_opts o;
		toast_engine_opts_init(&o);
		o.backend = cases[i].backend;
		o.n_threads = cases[i].n_threads;
		o.chunk = cases[i].chunk;
		expect_opts(&o, TOAST_ERR_INVALID, cases[i].name, cases[i].name);
	}
}

/* ---- config.json ---- */

static void config_case(const char *key, const char *value, enum toast_status want, const char *name)
{
	json_t *cfg = json_deep_copy(good_cfg);
	if (value) {
		json_error_t je;
		json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
		CHECK(v, "test value %s: %s", value, je.text);
		json_object_set_new(cfg, key, v);
	} else {
		json_object_del(cfg, key);
	}
	write_good();
	write_json("config.json", cfg);
	json_decref(cfg);
	char what[160];
	snprintf(what, sizeof(what), "config %s = %s", key, value ? value : "(missing)");
	expect(want, name ? name : key, what);
}

static void test_config(void)
{
	static const char *required[] = {"model_type",           "vocab_size",          "hidden_size",
					 "num_hidden_layers",    "num_attention_heads", "linear_num_key_heads",
					 "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
					 "num_experts_per_tok",  "moe_intermediate_size", "num_experts"};
	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
		config_case(required[i], NULL, TOAST_ERR_FORMAT, NULL);

	static const struct {
		const char *key, *value;
		enum toast_status want;
		const char *name; /* what the message must name (the key when NULL) */
	} cases[] = {
		{"model_type", "\"llama4\"", TOAST_ERR_UNSUPPORTED, "llama4"},
		{"model_type", "\"qwen3_6\"", TOAST_ERR_UNSUPPORTED, "qwen3_6"},
		{"model_type", "3", TOAST_ERR_FORMAT, NULL},
		{"vocab_size", "0", TOAST_ERR_FORMAT, NULL},
		{"vocab_size", "-131", TOAST_ERR_FORMAT, NULL},
		{"vocab_size", "1099511627776", TOAST_ERR_FORMAT, NULL},
		{"vocab_size", "131.5", TOAST_ERR_FORMAT, NULL},
		{"vocab_size", "\"131\"", TOAST_ERR_FORMAT, NULL},
		{"hidden_size", "0", TOAST_ERR_FORMAT, NULL},
		{"hidden_size", "-52", TOAST_ERR_FORMAT, NULL},
		{"hidden_size", "4294967348", TOAST_ERR_FORMAT, NULL},
		{"hidden_size", "1000000", TOAST_ERR_FORMAT, "model.embed_tokens.weight"},
		{"hidden_size", "53", TOAST_ERR_FORMAT, "model.embed_tokens.weight"},
		{"vocab_size", "132", TOAST_ERR_FORMAT, "model.embed_tokens.weight"},
		{"num_hidden_layers", "0", TOAST_ERR_FORMAT, NULL},
		{"num_hidden_layers", "1000000", TOAST_ERR_FORMAT, NULL},
		{"num_hidden_layers", "8", TOAST_ERR_FORMAT, NULL}, /* layer_types lists 7 */
		{"num_attention_heads", "0", TOAST_ERR_FORMAT, NULL},
		{"num_attention_heads", "5", TOAST_ERR_FORMAT, "num_key_value_heads"},
		{"num_key_value_heads", "0", TOAST_ERR_FORMAT, NULL},
		{"num_key_value_heads", "4", TOAST_ERR_FORMAT, NULL},
		{"num_key_value_heads", "3", TOAST_ERR_FORMAT, "model.layers.2.self_attn.k_proj.weight"},
		{"head_dim", "0", TOAST_ERR_FORMAT, NULL},
		{"head_dim", "-20", TOAST_ERR_FORMAT, NULL},
		{"head_dim", "1048576", TOAST_ERR_FORMAT, NULL},
		{"head_dim", "24", TOAST_ERR_FORMAT, "model.layers.2.self_attn.q_proj.weight"},
		{"max_position_embeddings", "0", TOAST_ERR_FORMAT, NULL},
		{"max_position_embeddings", "-1", TOAST_ERR_FORMAT, NULL},
		{"max_position_embeddings", "100000000000", TOAST_ERR_FORMAT, NULL},
		{"rms_norm_eps", "0", TOAST_ERR_FORMAT, NULL},
		{"rms_norm_eps", "-1e-6", TOAST_ERR_FORMAT, NULL},
		{"rms_norm_eps", "\"tiny\"", TOAST_ERR_FORMAT, NULL},
		{"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 0}", TOAST_ERR_FORMAT, "rope_theta"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": -10000}", TOAST_ERR_FORMAT, "rope_theta"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 1e300}", TOAST_ERR_FORMAT, "rope_theta"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 2}", TOAST_ERR_FORMAT,
		 "partial_rotary_factor"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0}", TOAST_ERR_FORMAT,
		 "partial_rotary_factor"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.05}", TOAST_ERR_FORMAT,
		 "rotary dims"},
		{"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4}", TOAST_ERR_UNSUPPORTED, "yarn"},
		{"rope_parameters", "[]", TOAST_ERR_FORMAT, NULL},
		{"num_experts", "0", TOAST_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight"}, /* all dense */
		{"num_experts", "-12", TOAST_ERR_FORMAT, NULL},
		{"num_experts", "13", TOAST_ERR_FORMAT, "model.layers.0.mlp.gate.weight"},
		{"num_experts_per_tok", "0", TOAST_ERR_FORMAT, NULL},
		{"num_experts_per_tok", "13", TOAST_ERR_FORMAT, NULL},
		{"moe_intermediate_size", "0", TOAST_ERR_FORMAT, NULL},
		{"linear_num_key_heads", "4", TOAST_ERR_FORMAT, "linear_num_value_heads"},
		{"linear_num_value_heads", "0", TOAST_ERR_FORMAT, NULL},
		{"linear_key_head_dim", "100000", TOAST_ERR_FORMAT, NULL},
		{"linear_conv_kernel_dim", "1", TOAST_ERR_FORMAT, NULL},
		{"linear_conv_kernel_dim", "1000", TOAST_ERR_FORMAT, NULL},
		{"linear_conv_kernel_dim", "4", TOAST_ERR_FORMAT, "model.layers.0.linear_attn.conv1d.weight"},
		{"decoder_sparse_step", "0", TOAST_ERR_FORMAT, NULL},
		{"decoder_sparse_step", "2", TOAST_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight"},
		{"mlp_only_layers", "[7]", TOAST_ERR_FORMAT, NULL},
		{"mlp_only_layers", "[-1]", TOAST_ERR_FORMAT, NULL},
		{"mlp_only_layers", "{}", TOAST_ERR_FORMAT, NULL},
		{"layer_types", "[\"linear_attention\"]", TOAST_ERR_FORMAT, NULL},
		{"layer_types", "\"full_attention\"", TOAST_ERR_FORMAT, NULL},
		{"layer_types",
		 "[\"linear_attention\", \"linear_attention\", \"sliding_attention\", \"linear_attention\", "
		 "\"linear_attention\", \"full_attention\", \"linear_attention\"]",
		 TOAST_ERR_UNSUPPORTED, "sliding_attention"},
		{"layer_types", "[1, 2, 3, 4, 5, 6, 7]", TOAST_ERR_FORMAT, "layer_types"},
		{"tie_word_embeddings", "\"no\"", TOAST_ERR_FORMAT, NULL},
		{"norm_topk_prob", "1", TOAST_ERR_FORMAT, NULL},
		{"hidden_act", "\"gelu\"", TOAST_ERR_UNSUPPORTED, "gelu"},
		{"attention_bias", "true", TOAST_ERR_UNSUPPORTED, NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		config_case(cases[i].key, cases[i].value, cases[i].want, cases[i].name);

	/* full_attention_interval instead of layer_types */
	json_t *saved = json_deep_copy(good_cfg);
	json_object_del(good_cfg, "layer_types");
	config_case("full_attention_interval", "3", TOAST_OK, "");
	config_case("full_attention_interval", "0", TOAST_ERR_FORMAT, NULL);
	config_case("full_attention_interval", "2", TOAST_ERR_FORMAT, "model.layers.1.self_attn.q_proj.weight");
	json_decref(good_cfg);
	good_cfg = saved;

	/* sliding windows (qwen3 dense) */
	json_t *q3 = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:i}", "model_type", "qwen3", "vocab_size", 131,
			       "hidden_size", 52, "num_hidden_layers", 7, "num_attention_heads", 6, "num_key_value_heads", 2,
			       "intermediate_size", 24, "use_sliding_window", true, "sliding_window", 64,
			       "max_window_layers", 2);
	write_good();
	write_json("config.json", q3);
	expect(TOAST_ERR_UNSUPPORTED, "sliding", "qwen3 with a sliding window from layer 2");
	json_object_set_new(q3, "max_window_layers", json_integer(7)); /* no layer reaches the window */
	write_json("config.json", q3);
	expect(TOAST_ERR_FORMAT, "model.layers.0.self_attn.q_proj.weight", "qwen3 with a window from layer 7 of 7");
	json_object_set_new(q3, "model_type", json_string("qwen3_moe"));
	json_object_set_new(q3, "num_experts", json_integer(12));
	json_object_set_new(q3, "num_experts_per_tok", json_integer(3));
	json_object_set_new(q3, "moe_intermediate_size", json_integer(6));
	write_json("config.json", q3);
	expect(TOAST_ERR_UNSUPPORTED, "sliding", "qwen3_moe with a sliding window");
	json_decref(q3);

	/* not a JSON object */
	static const char *not_object[] = {"", "[]", "\"qwen3_next\"", "{", "{\"model_type\": \"qwen3_next\",}", "\xff\xfe"};
	for (size_t i = 0; i < sizeof(not_object) / sizeof(not_object[0]); i++) {
		write_good();
		write_file("config.json", not_object[i], strlen(not_object[i]), NULL, 0);
		expect(TOAST_ERR_FORMAT, "config.json", not_object[i]);
	}
}

static bool load_fixture(void)
{
	char p[1024];
	struct toast_error err = {0};
	snprintf(p, sizeof(p), "%s/models/%s/config.json", test_data_dir(), FIXTURE);
	json_error_t je;
	good_cfg = json_load_file(p, JSON_PRESERVE_ORDER, &je);
	CHECK(good_cfg, "%s: %s", p, je.text);
	snprintf(p, sizeof(p), "%s/models/%s/model.safetensors", test_data_dir(), FIXTURE);
	char *buf = NULL;
	size_t n = 0;
	enum toast_status st = toast_read_file(p, 64u << 20, &buf, &n, &err);
	CHECK(st == TOAST_OK, "%s", err.msg);
	if (!good_cfg || st != TOAST_OK) {
		free(buf);
		return false;
	}
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | (unsigned char)buf[i];
	good_hdr = json_loadb(buf + 8, (size_t)hl, JSON_PRESERVE_ORDER, &je);
	CHECK(good_hdr, "%s: header: %s", p, je.text);
	good_n = n - 8 - (size_t)hl;
	good_data = malloc(good_n);
	memcpy(good_data, buf + 8 + hl, good_n);
	free(buf);
	return good_hdr != NULL;
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/toast-load-errors-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir), "mkdtemp %s", dir);
	if (load_fixture()) {
		write_good();
		expect(TOAST_OK, NULL, "the rewritten fixture");
		test_bad_options();
		test_missing_files();
		test_truncated();
		test_bad_header();
		test_lying_entries();
		test_wrong_tensors();
		test_sharded();
		test_config();
	}
	dir_clear();
	rmdir(dir);
	json_decref(good_hdr);
	json_decref(good_cfg);
	free(good_data);
	return test_done("test_load_errors");
}
