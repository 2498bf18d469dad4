/* fs.c - file reads and mappings. */
#define _GNU_SOURCE
#include "util/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/mem.h"

enum toast_status toast_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
				  struct toast_error *err)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return toast_err_set(err, TOAST_ERR_IO, "%s: not a regular file", path);
	}
	if ((size_t)st.st_size > max_bytes) {
		close(fd);
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: %lld bytes, more than the %zu allowed", path,
				     (long long)st.st_size, max_bytes);
	}
	size_t n = (size_t)st.st_size;
	char *buf = malloc(n + 1);
	if (!buf) {
		close(fd);
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n);
	}
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(buf);
			close(fd);
			return toast_err_set(err, TOAST_ERR_IO, "%s: read failed", path);
		}
		got += (size_t)r;
	}
	close(fd);
	buf[n] = 0;
	*out = buf;
	if (out_len)
		*out_len = n;
	return TOAST_OK;
}

enum toast_status toast_map_open(struct toast_map *m, const char *path, struct toast_error *err)
{
	m->data = NULL;
	m->size = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return toast_err_set(err, TOAST_ERR_IO, "%s: not a regular file", path);
	}
	if (st.st_size > 0) {
		void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			close(fd);
			return toast_err_set(err, TOAST_ERR_IO, "%s: mmap: %s", path, strerror(errno));
		}
		m->data = p;
		m->size = (size_t)st.st_size;
	}
	close(fd);
	return TOAST_OK;
}

void toast_map_close(struct toast_map *m)
{
	if (m && m->data)
		munmap(m->data, m->size);
	if (m) {
		m->data = NULL;
		m->size = 0;
	}
}

int toast_path_join(char *buf, size_t n, const char *dir, const char *name)
{
	int r = snprintf(buf, n, "%s/%s", dir, name);
	return r >= 0 && (size_t)r < n;
}

int toast_file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

bool toast_mkdirs_for(const char *path, unsigned mode)
{
	char buf[4096];
	size_t n = strlen(path);
	if (n >= sizeof(buf))
		return false;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
			return false;
		*p = '/';
	}
	return true;
}

char *toast_state_path(const char *rel)
{
	const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
	char buf[4096];
	int n = -1;
	if (xdg && xdg[0] == '/')
		n = snprintf(buf, sizeof(buf), "%s/%s", xdg, rel);
	else if (home && home[0] == '/')
		n = snprintf(buf, sizeof(buf), "%s/.local/state/%s", home, rel);
	return n > 0 && (size_t)n < sizeof(buf) ? toast_strdup(buf) : NULL;
}
