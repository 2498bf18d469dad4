/*
 * safetensors.h - fill a tensor directory (tensordir.h) from one safetensors file or a sharded set.
 *
 * Files are mmapped; tensor data pointers point into the mappings and stay valid until
 * toast_tensordir_close(). Every header entry is validated on open (known size for its dtype, offsets
 * inside the file, byte count equal to the shape's, data aligned to its elements, no two tensors
 * sharing bytes), so a tensor found here is safe to read.
 */
#ifndef TOAST_FORMAT_SAFETENSORS_H
#define TOAST_FORMAT_SAFETENSORS_H

#include "format/tensordir.h"

/* Open a model directory: model.safetensors.index.json (sharded) or model.safetensors. */
enum toast_status toast_st_open_dir(struct toast_tensordir *st, const char *dir, struct toast_error *err);
/* Open one .safetensors file. */
enum toast_status toast_st_open_file(struct toast_tensordir *st, const char *path, struct toast_error *err);

#endif
