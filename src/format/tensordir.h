/*
 * tensordir.h - a read-only directory of named tensors, whatever file format they came from
 * (safetensors.c fills it from safetensors files, models/gguf_model.c from a GGUF file under
 * Hugging Face names).
 *
 * Data pointers point into the mapped files (or into buffers the directory owns, for tensors
 * derived at load time) and stay valid until toast_tensordir_close(). Whoever fills a directory
 * validates every entry (known size for its dtype, data inside the file, byte count equal to
 * the shape's), so a tensor found here is safe to read.
 */
#ifndef TOAST_FORMAT_TENSORDIR_H
#define TOAST_FORMAT_TENSORDIR_H

#include "format/dtype.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/strmap.h"

#define TOAST_MAX_DIMS 8

struct toast_tensor {
	const char *name;
	enum toast_dtype dtype; /* TOAST_DT_UNKNOWN for types the engine does not compute with */
	const char *dtype_name; /* as the file names it */
	int n_dims;
	int64_t shape[TOAST_MAX_DIMS]; /* outermost first (PyTorch order; GGUF's ne[] reversed) */
	int64_t n_elems;
	const void *data;
	size_t offset; /* of data in its file's data section (safetensors) */
	size_t n_bytes;
	int file; /* index of the shard */
};

struct toast_tensordir {
	int n_files;
	struct toast_map *maps;
	char **paths;
	int n_tensors;
	struct toast_tensor *tensors;
	char *names; /* all names, NUL-separated */
	struct toast_strmap index;
	void **owned; /* heap buffers of derived tensors, freed by close */
	int n_owned;
};

void toast_tensordir_close(struct toast_tensordir *d);
/* The tensor called name, or NULL. */
const struct toast_tensor *toast_tensordir_find(const struct toast_tensordir *d, const char *name);
/* Index tensors[0..n_tensors) by name; an error names a duplicate. */
enum toast_status toast_tensordir_index(struct toast_tensordir *d, const char *what, struct toast_error *err);
/* Hand a heap buffer (malloc'd) to the directory, to be freed on close; false (and the buffer
 * freed) when out of memory. */
bool toast_tensordir_own(struct toast_tensordir *d, void *buf);

#endif
