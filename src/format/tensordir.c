/* tensordir.c - tensor directory lookup and lifetime (see tensordir.h). */
#include "format/tensordir.h"

#include <stdlib.h>
#include <string.h>

void toast_tensordir_close(struct toast_tensordir *d)
{
	if (!d)
		return;
	for (int f = 0; f < d->n_files; f++) {
		if (d->maps)
			toast_map_close(&d->maps[f]);
		if (d->paths)
			free(d->paths[f]);
	}
	for (int i = 0; i < d->n_owned; i++)
		free(d->owned[i]);
	free(d->owned);
	free(d->maps);
	free(d->paths);
	free(d->tensors);
	free(d->names);
	toast_strmap_deinit(&d->index);
	memset(d, 0, sizeof(*d));
}

const struct toast_tensor *toast_tensordir_find(const struct toast_tensordir *d, const char *name)
{
	int i = toast_strmap_get(&d->index, name, strlen(name));
	return i >= 0 ? &d->tensors[i] : NULL;
}

enum toast_status toast_tensordir_index(struct toast_tensordir *d, const char *what, struct toast_error *err)
{
	if (toast_strmap_init(&d->index, (size_t)d->n_tensors) != 0)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory indexing tensors");
	for (int i = 0; i < d->n_tensors; i++) {
		size_t n = strlen(d->tensors[i].name);
		if (toast_strmap_get(&d->index, d->tensors[i].name, n) >= 0)
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: tensor %s appears twice", what, d->tensors[i].name);
		if (toast_strmap_put(&d->index, d->tensors[i].name, n, i) != 0)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory indexing tensors");
	}
	return TOAST_OK;
}

bool toast_tensordir_own(struct toast_tensordir *d, void *buf)
{
	void **o = realloc(d->owned, (size_t)(d->n_owned + 1) * sizeof(*o));
	if (!o) {
		free(buf);
		return false;
	}
	d->owned = o;
	d->owned[d->n_owned++] = buf;
	return true;
}
