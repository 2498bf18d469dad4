/*
 * tokenize.c - `toasted tokenize MODEL_DIR [TEXT]` and `toasted detokenize MODEL_DIR ID...`:
 * the model's tokenizer on the command line (only the tokenizer is loaded, not the weights).
 *
 * tokenize: TEXT, or all of stdin when there is no TEXT, exactly (no newline is stripped); prints
 * the ids space-separated on one line. With --jsonl, stdin holds JSON lines with a "text" field
 * and each gets one line {"ids": [...]} back. detokenize prints the decoded text as is.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define TOKENIZE_MAX_INPUT ((size_t)1 << 30)

bool cli_read_stream(FILE *f, size_t max, char **out, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap + 1);
	if (!buf)
		return false;
	for (;;) {
		if (n == cap) {
			if (cap >= max) {
				fprintf(stderr, "toasted: input is over %zu bytes\n", max);
				free(buf);
				return false;
			}
			cap = cap * 2 > max ? max : cap * 2;
			char *nb = realloc(buf, cap + 1);
			if (!nb) {
				free(buf);
				return false;
			}
			buf = nb;
		}
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
	}
	if (ferror(f)) {
		fprintf(stderr, "toasted: reading input: %s\n", strerror(errno));
		free(buf);
		return false;
	}
	buf[n] = 0;
	*out = buf;
	*len = n;
	return true;
}

static void tokenize_print_ids(FILE *f, const int32_t *ids, int n)
{
	for (int i = 0; i < n; i++)
		fprintf(f, i ? " %d" : "%d", ids[i]);
}

static int tokenize_one(const struct toast_tokenizer *tok, const char *text, size_t n, bool jsonl)
{
	int32_t *ids;
	int n_ids;
	struct toast_error err = {0};
	enum toast_status st = toast_tok_encode(tok, text, n, &ids, &n_ids, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted tokenize: %s\n", err.msg);
		return cli_status_exit(st);
	}
	if (jsonl) {
		fputs("{\"ids\": [", stdout);
		for (int i = 0; i < n_ids; i++)
			printf(i ? ", %d" : "%d", ids[i]);
		fputs("]}\n", stdout);
	} else {
		tokenize_print_ids(stdout, ids, n_ids);
		putchar('\n');
	}
	free(ids);
	return 0;
}

static int tokenize_jsonl(const struct toast_tokenizer *tok)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int rc = 0, lineno = 0;
	while (rc == 0 && (len = getline(&line, &cap, stdin)) >= 0) {
		lineno++;
		if (len == 0 || (len == 1 && line[0] == '\n'))
			continue;
		json_error_t je;
		json_t *j = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, &je);
		json_t *t = json_object_get(j, "text");
		if (!json_is_string(t)) {
			fprintf(stderr, "toasted tokenize: line %d: expected a JSON object with a \"text\" string\n", lineno);
			rc = 2;
		} else {
			rc = tokenize_one(tok, json_string_value(t), json_string_length(t), true);
		}
		json_decref(j);
	}
	free(line);
	return rc;
}

static int tokenize_load(const char *cmd, const char *dir, struct toast_tokenizer **tok)
{
	struct toast_error err = {0};
	enum toast_status st = toast_tok_load(dir, tok, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted %s: %s\n", cmd, err.msg);
		return cli_status_exit(st);
	}
	return 0;
}

int cli_tokenize(int argc, char **argv)
{
	const char *dir = NULL, *text = NULL;
	bool jsonl = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--jsonl") == 0)
			jsonl = true;
		else if (strcmp(argv[i], "--") == 0 && i + 1 < argc && dir && !text)
			text = argv[++i];
		else if (argv[i][0] == '-' && argv[i][1])
			return fprintf(stderr, "toasted tokenize: unknown option %s\n", argv[i]), 2;
		else if (!dir)
			dir = argv[i];
		else if (!text)
			text = argv[i];
		else
			return fprintf(stderr, "toasted tokenize: unexpected argument %s\n", argv[i]), 2;
	}
	if (!dir || (jsonl && text)) {
		fprintf(stderr, "usage: toasted tokenize MODEL_DIR [TEXT]   (stdin when no TEXT)\n"
				"       toasted tokenize MODEL_DIR --jsonl  < lines of {\"text\": ...}\n");
		return 2;
	}
	struct toast_tokenizer *tok;
	int rc = tokenize_load("tokenize", dir, &tok);
	if (rc)
		return rc;
	if (jsonl) {
		rc = tokenize_jsonl(tok);
	} else if (text) {
		rc = tokenize_one(tok, text, strlen(text), false);
	} else {
		char *in;
		size_t n;
		rc = cli_read_stream(stdin, TOKENIZE_MAX_INPUT, &in, &n) ? tokenize_one(tok, in, n, false) : 2;
		if (rc != 2)
			free(in);
	}
	toast_tok_free(tok);
	return rc;
}

int cli_detokenize(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: toasted detokenize MODEL_DIR ID...\n");
		return 2;
	}
	int n = argc - 2;
	int32_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
	if (!ids)
		return 1;
	for (int i = 0; i < n; i++) {
		long v;
		if (!cli_int("token id", argv[i + 2], 0, INT32_MAX, &v)) {
			free(ids);
			return 2;
		}
		ids[i] = (int32_t)v;
	}
	struct toast_tokenizer *tok;
	int rc = tokenize_load("detokenize", argv[1], &tok);
	if (rc) {
		free(ids);
		return rc;
	}
	char *text;
	size_t len;
	struct toast_error err = {0};
	enum toast_status st = toast_tok_decode(tok, ids, n, &text, &len, &err);
	if (st == TOAST_OK) {
		fwrite(text, 1, len, stdout);
		free(text);
	} else {
		fprintf(stderr, "toasted detokenize: %s\n", err.msg);
		rc = cli_status_exit(st);
	}
	free(ids);
	toast_tok_free(tok);
	return rc;
}
