/*
 * fs.h - whole-file reads with a size limit, and read-only file mappings.
 */
#ifndef TOAST_UTIL_FS_H
#define TOAST_UTIL_FS_H

#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

/* Read all of path into a NUL-terminated heap buffer (free()); fails beyond max_bytes. */
enum toast_status toast_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
				  struct toast_error *err);

struct toast_map {
	void *data;
	size_t size;
};

/* Map path read-only (shared). A zero-length file maps to data == NULL, size 0. */
enum toast_status toast_map_open(struct toast_map *m, const char *path, struct toast_error *err);
void toast_map_close(struct toast_map *m);

/* dir + "/" + name into buf; false if it does not fit. */
int toast_path_join(char *buf, size_t n, const char *dir, const char *name);
int toast_file_exists(const char *path);
/* $XDG_STATE_HOME/rel, else $HOME/.local/state/rel (malloc'd); NULL when neither is set. */
char *toast_state_path(const char *rel);
/* Create the missing directories above the file path (each with mode); false if one cannot be made. */
bool toast_mkdirs_for(const char *path, unsigned mode);

#endif
