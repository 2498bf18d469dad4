/*
 * toast.c - the client: `cat FILE | toast "what is wrong here?"`.
 *
 * Composes standard input (when it is not a terminal) and the PROMPT into one user message
 * (toast_compose_user: the rule `toasted run` uses too), sends the conversation to the local
 * daemon (TOASTED_SOCKET or the default socket) or, when none runs, to an OpenAI-compatible
 * provider (TOAST_API_BASE, TOAST_API_KEY, TOAST_MODEL), and streams the answer to stdout.
 * Links util + proto only, never the engine. Exit status: 0 answered, 1 failed, 2 usage.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/history.h"
#include "client/provider.h"
#include "proto/conn.h"

#define TOAST_USAGE                                                                                            \
	"usage: toast [OPTIONS] [PROMPT...]\n"                                                                     \
	"  Standard input (when not a terminal) and PROMPT form one user message; the answer streams\n"         \
	"  to standard output.\n"                                                                                  \
	"  -s, --system TEXT    system prompt\n"                                                                   \
	"  -c, --continue       continue the last conversation\n"                                                  \
	"  -i, --interactive    chat: one turn per line of input\n"                                                \
	"      --new            forget the last conversation first\n"                                              \
	"      --temperature X  --top-p X  --top-k N  --min-p X  --repeat-penalty X  --seed N\n"            \
	"      --max-tokens N   (defaults as in `toasted run`: 0.7, 0.8, 20, 0, 1; a random seed)\n"                       \
	"      --stop TEXT      stop string (repeatable)   --no-think / --think\n"                                 \
	"      --draft N        draft up to N (<= 7) tokens a step from earlier text (no --repeat-penalty)\n"     \
	"      --socket PATH    the daemon's socket (default: $TOASTED_SOCKET, $XDG_RUNTIME_DIR/toasted.sock,\n"  \
	"                       /tmp/toasted-$UID/toasted.sock)\n"                                                 \
	"  Without a daemon, TOAST_API_BASE, TOAST_API_KEY and TOAST_MODEL name an OpenAI-compatible API.\n"

struct toast_opts {
	const char *system, *socket;
	bool cont, interactive, fresh;
	struct toast_proto_params p;
	struct toast_buf prompt;
};

static bool opt_num(const char *name, const char *v, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double x = v ? strtod(v, &end) : 0;
	if (!v || errno || end == v || *end || !(x >= lo && x <= hi)) {
		fprintf(stderr, "toast: %s needs a number in [%g, %g]\n", name, lo, hi);
		return false;
	}
	*out = x;
	return true;
}

static bool toast_parse(int argc, char **argv, struct toast_opts *o, int *exit_code)
{
	memset(o, 0, sizeof(*o));
	toast_proto_params_init(&o->p);
	toast_buf_init(&o->prompt);
	bool words = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		double x;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			fputs(TOAST_USAGE, stdout);
			*exit_code = 0;
			return false;
		} else if (strcmp(a, "--version") == 0) {
			printf("toast %s (protocol %d)\n", TOAST_VERSION, TOAST_PROTO_VERSION);
			*exit_code = 0;
			return false;
		} else if (strcmp(a, "-c") == 0 || strcmp(a, "--continue") == 0) {
			o->cont = true;
		} else if (strcmp(a, "-i") == 0 || strcmp(a, "--interactive") == 0) {
			o->interactive = true;
		} else if (strcmp(a, "--new") == 0) {
			o->fresh = true;
		} else if (strcmp(a, "--think") == 0 || strcmp(a, "--no-think") == 0) {
			o->p.enable_thinking = strcmp(a, "--think") == 0;
		} else if ((strcmp(a, "-s") == 0 || strcmp(a, "--system") == 0) && v) {
			o->system = argv[++i];
		} else if (strcmp(a, "--socket") == 0 && v) {
			o->socket = argv[++i];
		} else if (strcmp(a, "--stop") == 0 && v) {
			if (o->p.n_stop == TOAST_PROTO_MAX_STOP) {
				fprintf(stderr, "toast: at most %d --stop strings\n", TOAST_PROTO_MAX_STOP);
				return false;
			}
			o->p.stop[o->p.n_stop++] = argv[++i];
		} else if (strcmp(a, "--temperature") == 0) {
			if (!opt_num(a, v, 0, 100, &o->p.temperature))
				return false;
			i++;
		} else if (strcmp(a, "--top-p") == 0) {
			if (!opt_num(a, v, 1e-6, 1, &o->p.top_p))
				return false;
			i++;
		} else if (strcmp(a, "--min-p") == 0) {
			if (!opt_num(a, v, 0, 1, &o->p.min_p))
				return false;
			i++;
		} else if (strcmp(a, "--repeat-penalty") == 0) {
			if (!opt_num(a, v, 0.01, 100, &o->p.repeat_penalty))
				return false;
			i++;
		} else if (strcmp(a, "--top-k") == 0) {
			if (!opt_num(a, v, 0, 1 << 24, &x) || x != floor(x))
				return false;
			o->p.top_k = (int)x;
			i++;
		} else if (strcmp(a, "--draft") == 0) {
			if (!opt_num(a, v, 0, TOAST_DRAFT_MAX, &x) || x != floor(x))
				return false;
			o->p.draft = (int)x;
			i++;
		} else if (strcmp(a, "--max-tokens") == 0) {
			if (!opt_num(a, v, 1, TOAST_PROTO_MAX_TOKENS, &x) || x != floor(x))
				return false;
			o->p.max_tokens = (int)x;
			i++;
		} else if (strcmp(a, "--seed") == 0) {
			if (!opt_num(a, v, 0, 9007199254740992.0, &x) || x != floor(x))
				return false;
			o->p.seed = (uint64_t)x;
			o->p.has_seed = true;
			i++;
		} else if (strcmp(a, "--") == 0) {
			for (i++; i < argc; i++)
				if (!(words && !toast_buf_puts(&o->prompt, " ")) && toast_buf_puts(&o->prompt, argv[i]))
					words = true;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "toast: unknown or incomplete option \"%s\" (toast --help)\n", a);
			return false;
		} else {
			if ((words && !toast_buf_puts(&o->prompt, " ")) || !toast_buf_puts(&o->prompt, a))
				return false;
			words = true;
		}
	}
	return true;
}

/* ---- talking to the daemon or the provider ---- */

struct toast_answer {
	struct toast_buf text;
	bool wrote;
	bool failed_write;
};

static int answer_write(void *ud, const char *text, size_t len)
{
	struct toast_answer *a = ud;
	if (!toast_buf_append(&a->text, text, len))
		return 1;
	while (len) {
		ssize_t w = write(1, text, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			a->failed_write = true;
			return 1;
		}
		text += w;
		len -= (size_t)w;
	}
	a->wrote = true;
	return 0;
}

/* Ask the daemon at sock; *absent when none listens there. */
static enum toast_status ask_daemon(const char *sock, const struct toast_history *h, const struct toast_proto_params *p,
				    struct toast_answer *ans, bool *absent, struct toast_error *err)
{
	struct toast_conn c;
	enum toast_status rc = toast_conn_open(&c, sock, absent, err);
	if (rc != TOAST_OK)
		return rc;
	struct toast_buf req;
	toast_buf_init(&req);
	char id[32];
	snprintf(id, sizeof(id), "toast-%ld", (long)getpid());
	if (!toast_proto_chat_write(&req, id, h->msgs, h->n, p))
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (rc == TOAST_OK)
		rc = toast_conn_send(&c, req.data, req.len, err);
	toast_buf_deinit(&req);
	for (bool end = false; rc == TOAST_OK && !end;) {
		struct toast_proto_event ev;
		rc = toast_conn_event(&c, &ev, err);
		if (rc != TOAST_OK)
			break;
		if (ev.kind == TOAST_EV_DELTA || (ev.kind == TOAST_EV_DONE && ev.text)) {
			if (answer_write(ans, ev.text, ev.text_len))
				rc = toast_err_set(err, TOAST_ERR_IO, "writing the answer: %s", strerror(errno));
		}
		if (ev.kind == TOAST_EV_ERROR)
			rc = toast_err_set(err, TOAST_ERR_IO, "%s: %s", ev.code, ev.text);
		end = ev.kind != TOAST_EV_DELTA;
		toast_proto_event_deinit(&ev);
	}
	toast_conn_close(&c);
	return rc;
}

static enum toast_status ask(const struct toast_opts *o, const char *sock, const struct toast_history *h,
			     struct toast_answer *ans, struct toast_error *err)
{
	bool absent = false;
	enum toast_status rc = ask_daemon(sock, h, &o->p, ans, &absent, err);
	if (!absent)
		return rc;
	struct toast_provider pv = {getenv("TOAST_API_BASE"), getenv("TOAST_API_KEY"), getenv("TOAST_MODEL")};
	if (!pv.base || !*pv.base)
		return toast_err_set(err, TOAST_ERR_IO,
				     "no toasted daemon on %s, and no provider configured.\n"
				     "  Start one:      toasted start MODEL_DIR\n"
				     "  or set TOAST_API_BASE (and TOAST_API_KEY, TOAST_MODEL) to use an OpenAI-compatible API",
				     sock);
	if (!pv.model || !*pv.model)
		return toast_err_set(err, TOAST_ERR_INVALID, "TOAST_API_BASE is set but TOAST_MODEL is not");
	rc = toast_provider_chat(&pv, h->msgs, h->n, &o->p, answer_write, ans, err);
	if (rc == TOAST_ERR_CANCELLED && ans->failed_write)
		rc = toast_err_set(err, TOAST_ERR_IO, "writing the answer: %s", strerror(errno));
	return rc;
}

/* One turn: send h, print the answer, append it to h. */
static bool turn(const struct toast_opts *o, const char *sock, struct toast_history *h)
{
	struct toast_answer ans = {0};
	struct toast_error err = {0};
	toast_buf_init(&ans.text);
	enum toast_status rc = ask(o, sock, h, &ans, &err);
	if (rc == TOAST_OK && !toast_history_add(h, "assistant", ans.text.data ? ans.text.data : "", ans.text.len))
		rc = toast_err_set(&err, TOAST_ERR_NOMEM, "out of memory");
	/* on a terminal, end the answer with a newline (as `toasted run` does; not kept in the history) */
	if (rc == TOAST_OK && ans.text.len && ans.text.data[ans.text.len - 1] != '\n' && isatty(1) && write(1, "\n", 1) != 1)
		rc = toast_err_set(&err, TOAST_ERR_IO, "writing the answer: %s", strerror(errno));
	if (rc != TOAST_OK) {
		if (ans.wrote)
			fputc('\n', stderr);
		fprintf(stderr, "toast: %s\n", err.msg);
	}
	toast_buf_deinit(&ans.text);
	return rc == TOAST_OK;
}

/* Read all of standard input (bounded by the protocol's line size). */
static bool read_stdin(struct toast_buf *b)
{
	char tmp[65536];
	for (;;) {
		ssize_t r = read(0, tmp, sizeof(tmp));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			fprintf(stderr, "toast: reading standard input: %s\n", strerror(errno));
			return false;
		}
		if (r == 0)
			return true;
		if (b->len + (size_t)r > TOAST_PROTO_MAX_LINE / 2) {
			fprintf(stderr, "toast: standard input is larger than %u bytes\n", TOAST_PROTO_MAX_LINE / 2);
			return false;
		}
		if (!toast_buf_append(b, tmp, (size_t)r))
			return false;
	}
}

static int interactive(const struct toast_opts *o, const char *sock, struct toast_history *h, const char *hist_path)
{
	bool tty = isatty(0);
	char *line = NULL;
	size_t cap = 0;
	int rc = 0;
	if (o->prompt.len) {
		if (!toast_history_add(h, "user", o->prompt.data, o->prompt.len) || !turn(o, sock, h))
			rc = 1;
		else if (hist_path)
			toast_history_save(h, hist_path, NULL);
	}
	for (;;) {
		if (tty)
			fputs("> ", stderr);
		ssize_t n = getline(&line, &cap, stdin);
		if (n < 0)
			break;
		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = 0;
		if (!n)
			continue;
		if (!toast_history_add(h, "user", line, (size_t)n))
			break;
		if (!turn(o, sock, h)) {
			rc = 1;
			toast_history_pop(h); /* drop the unanswered question, keep chatting */
			continue;
		}
		if (hist_path)
			toast_history_save(h, hist_path, NULL);
	}
	if (tty)
		fputc('\n', stderr);
	free(line);
	return rc;
}

int main(int argc, char **argv)
{
	struct toast_opts o;
	int code = 2;
	if (!toast_parse(argc, argv, &o, &code)) {
		toast_buf_deinit(&o.prompt);
		return code;
	}
	char sock[108];
	if (o.socket ? snprintf(sock, sizeof(sock), "%s", o.socket) >= (int)sizeof(sock)
		     : !toast_proto_default_socket(sock, sizeof(sock))) {
		fprintf(stderr, "toast: the socket path is too long\n");
		return 2;
	}
	struct toast_history h = {0};
	struct toast_error err = {0};
	struct toast_buf input, user;
	toast_buf_init(&input);
	toast_buf_init(&user);
	char *hist_path = toast_history_path();
	code = 1;
	if (hist_path && o.fresh)
		unlink(hist_path);
	if (hist_path && o.cont && toast_history_load(&h, hist_path, &err) != TOAST_OK) {
		fprintf(stderr, "toast: %s (toast --new starts over)\n", err.msg);
		goto out;
	}
	if (o.system && !toast_history_set_system(&h, o.system))
		goto out;
	if (o.interactive) {
		code = interactive(&o, sock, &h, hist_path);
		goto out;
	}
	if (!isatty(0) && !read_stdin(&input))
		goto out;
	if (!toast_compose_user(&user, o.prompt.data, input.data, input.len))
		goto out;
	if (!user.len) {
		if (o.fresh && !o.prompt.len) {
			code = 0; /* `toast --new` alone: just forget */
			goto out;
		}
		fprintf(stderr, "toast: nothing to ask: give a PROMPT, pipe text in, or use -i\n%s", TOAST_USAGE);
		code = 2;
		goto out;
	}
	if (!toast_history_add(&h, "user", user.data, user.len) || !turn(&o, sock, &h))
		goto out;
	if (hist_path && toast_history_save(&h, hist_path, &err) != TOAST_OK)
		fprintf(stderr, "toast: cannot keep the conversation: %s\n", err.msg);
	code = 0;
out:
	free(hist_path);
	toast_history_free(&h);
	toast_buf_deinit(&input);
	toast_buf_deinit(&user);
	toast_buf_deinit(&o.prompt);
	return code;
}
