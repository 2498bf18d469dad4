/*
 * history.h - the conversation toast keeps for `toast -c`: a plain file of JSON lines, one
 * message each ({"role": "...", "content": "..."}), at $XDG_STATE_HOME/toast/conversation.jsonl
 * (default ~/.local/state/toast/). Written whole after each turn (temp file + rename, 0600).
 */
#ifndef TOAST_CLIENT_HISTORY_H
#define TOAST_CLIENT_HISTORY_H

#include "proto/proto.h"

#define TOAST_HISTORY_MAX_BYTES (64u << 20)

struct toast_history {
	struct toast_chat_msg *msgs; /* role and content malloc'd */
	int n, cap;
};

/* The history file's path (malloc'd); NULL when neither XDG_STATE_HOME nor HOME is set. */
char *toast_history_path(void);
bool toast_history_add(struct toast_history *h, const char *role, const char *content, size_t len);
/* Drop the last message. */
void toast_history_pop(struct toast_history *h);
/* Put a system message first (replacing one already there). */
bool toast_history_set_system(struct toast_history *h, const char *content);
/* Load path; a missing file is an empty history. */
enum toast_status toast_history_load(struct toast_history *h, const char *path, struct toast_error *err);
enum toast_status toast_history_save(const struct toast_history *h, const char *path, struct toast_error *err);
void toast_history_free(struct toast_history *h);

#endif
