/* history.c - the conversation file of `toast -c` (format in history.h and docs/protocol.md). */
#include "client/history.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs.h"
#include "util/mem.h"

char *toast_history_path(void)
{
	return toast_state_path("toast/conversation.jsonl");
}

bool toast_history_add(struct toast_history *h, const char *role, const char *content, size_t len)
{
	if (h->n == h->cap) {
		int cap = h->cap ? h->cap * 2 : 8;
		struct toast_chat_msg *m = realloc(h->msgs, (size_t)cap * sizeof(*m));
		if (!m)
			return false;
		h->msgs = m;
		h->cap = cap;
	}
	char *r = toast_strdup(role), *c = malloc(len + 1);
	if (!r || !c) {
		free(r);
		free(c);
		return false;
	}
	memcpy(c, content, len);
	c[len] = 0;
	h->msgs[h->n++] = (struct toast_chat_msg){r, c};
	return true;
}

void toast_history_pop(struct toast_history *h)
{
	if (!h->n)
		return;
	h->n--;
	free((char *)h->msgs[h->n].role);
	free((char *)h->msgs[h->n].content);
}

bool toast_history_set_system(struct toast_history *h, const char *content)
{
	if (h->n && strcmp(h->msgs[0].role, "system") == 0) {
		char *c = toast_strdup(content);
		if (!c)
			return false;
		free((char *)h->msgs[0].content);
		h->msgs[0].content = c;
		return true;
	}
	if (!toast_history_add(h, "system", content, strlen(content)))
		return false;
	struct toast_chat_msg sys = h->msgs[h->n - 1];
	memmove(h->msgs + 1, h->msgs, (size_t)(h->n - 1) * sizeof(*h->msgs));
	h->msgs[0] = sys;
	return true;
}

enum toast_status toast_history_load(struct toast_history *h, const char *path, struct toast_error *err)
{
	char *text = NULL;
	size_t len = 0;
	if (access(path, F_OK) != 0 && errno == ENOENT)
		return TOAST_OK;
	enum toast_status rc = toast_read_file(path, TOAST_HISTORY_MAX_BYTES, &text, &len, err);
	if (rc != TOAST_OK)
		return rc;
	int line = 0;
	for (char *p = text, *nl; rc == TOAST_OK && p < text + len; p = nl + 1) {
		nl = memchr(p, '\n', (size_t)(text + len - p));
		if (!nl)
			nl = text + len;
		line++;
		if (nl == p)
			continue;
		json_error_t je;
		json_t *m = json_loadb(p, (size_t)(nl - p), 0, &je);
		const char *role = json_string_value(json_object_get(m, "role"));
		json_t *content = json_object_get(m, "content");
		if (!role || !json_is_string(content))
			rc = toast_err_set(err, TOAST_ERR_FORMAT, "%s:%d: expected {\"role\": ..., \"content\": ...}", path, line);
		else if (!toast_history_add(h, role, json_string_value(content), json_string_length(content)))
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		json_decref(m);
	}
	free(text);
	return rc;
}

enum toast_status toast_history_save(const struct toast_history *h, const char *path, struct toast_error *err)
{
	struct toast_buf b, tmp;
	toast_buf_init(&b);
	toast_buf_init(&tmp);
	bool ok = toast_buf_printf(&tmp, "%s.%ld.tmp", path, (long)getpid());
	for (int i = 0; ok && i < h->n; i++)
		ok = toast_buf_puts(&b, "{\"role\":\"") && toast_buf_json_escape(&b, h->msgs[i].role, strlen(h->msgs[i].role)) &&
		     toast_buf_puts(&b, "\",\"content\":\"") &&
		     toast_buf_json_escape(&b, h->msgs[i].content, strlen(h->msgs[i].content)) && toast_buf_puts(&b, "\"}\n");
	enum toast_status rc = TOAST_OK;
	if (!ok) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		goto out;
	}
	toast_mkdirs_for(tmp.data, 0700);
	int fd = open(tmp.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t off = 0;
	while (fd >= 0 && off < b.len) {
		ssize_t w = write(fd, b.data + off, b.len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	bool written = fd >= 0 && off == b.len;
	if (fd >= 0 && close(fd) != 0)
		written = false;
	if (!written || rename(tmp.data, path) != 0) {
		rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", path, strerror(errno));
		unlink(tmp.data);
	}
out:
	toast_buf_deinit(&b);
	toast_buf_deinit(&tmp);
	return rc;
}

void toast_history_free(struct toast_history *h)
{
	if (!h)
		return;
	for (int i = 0; i < h->n; i++) {
		free((char *)h->msgs[i].role);
		free((char *)h->msgs[i].content);
	}
	free(h->msgs);
	memset(h, 0, sizeof(*h));
}
