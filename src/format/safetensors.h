/*
 * safetensors.h - read-only tensor directory over one safetensors file or a sharded set.
 *
 * Files are mmapped; tensor data pointers point into the mappings and stay valid until
 * toast_st_close(). Every header entry is validated on open (known size for its dtype, offsets
 * inside the file, byte count equal to the shape's, data aligned to its elements, no two tensors
 * sharing bytes), so a tensor found here is safe to read.
 */
#ifndef TOAST_FORMAT_SAFETENSORS_H
#define TOAST_FORMAT_SAFETENSORS_H

#include "format/dtype.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/strmap.h"

#define TOAST_ST_MAX_DIMS 8

struct toast_st_tensor {
	const char *name;
	enum toast_dtype dtype; /* TOAST_DT_UNKNOWN for types the engine does not compute with */
	const char *dtype_name; /* as written in the file */
	int n_dims;
	int64_t shape[TOAST_ST_MAX_DIMS]; /* outermost first, as in the file */
	int64_t n_elems;
	const void *data;
	size_t offset; /* of data in the file's data section */
	size_t n_bytes;
	int file; /* index of the shard */
};

struct toast_safetensors {
	int n_files;
	struct toast_map *maps;
	char **paths;
	int n_tensors;
	struct toast_st_tensor *tensors;
	char *names; /* all names, NUL-separated */
	struct toast_strmap index;
};

/* Open a model directory: model.safetensors.index.json (sharded) or model.safetensors. */
enum toast_status toast_st_open_dir(struct toast_safetensors *st, const char *dir, struct toast_error *err);
/* Open one .safetensors file. */
enum toast_status toast_st_open_file(struct toast_safetensors *st, const char *path, struct toast_error *err);
void toast_st_close(struct toast_safetensors *st);
/* The tensor called name, or NULL. */
const struct toast_st_tensor *toast_st_find(const struct toast_safetensors *st, const char *name);

#endif
