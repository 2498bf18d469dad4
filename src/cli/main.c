/*
 * main.c - `toasted COMMAND ...`: dispatch to the subcommands in src/cli/.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

bool cli_int(const char *opt, const char *val, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = val ? strtol(val, &end, 10) : 0;
	if (!val || errno || *end || end == val || v < lo || v > hi) {
		fprintf(stderr, "toasted: %s needs an integer in [%ld, %ld]\n", opt, lo, hi);
		return false;
	}
	*out = v;
	return true;
}

bool cli_float(const char *opt, const char *val, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = val ? strtod(val, &end) : 0;
	if (!val || errno || *end || end == val || !(v >= lo && v <= hi)) {
		fprintf(stderr, "toasted: %s needs a number in [%g, %g]\n", opt, lo, hi);
		return false;
	}
	*out = v;
	return true;
}

const char *cli_optval(int argc, char **argv, int *i, const char *name)
{
	size_t n = strlen(name);
	const char *a = argv[*i];
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] == 0) {
		if (*i + 1 >= argc) {
			fprintf(stderr, "toasted: %s needs a value\n", name);
			return "";
		}
		return argv[++*i];
	}
	return NULL;
}

int cli_engine_opt(int argc, char **argv, int *i, unsigned which, struct toast_engine_opts *eo)
{
	const char *v;
	long n;
	if ((v = cli_optval(argc, argv, i, "--backend"))) {
		eo->backend = v;
	} else if ((v = cli_optval(argc, argv, i, "--threads"))) {
		if (!cli_int("--threads", v, 1, 1024, &n))
			return -1;
		eo->n_threads = (int)n;
	} else if ((v = cli_optval(argc, argv, i, "--kv-cache"))) {
		eo->kv_cache = v;
	} else if ((which & CLI_EO_CHUNK) && (v = cli_optval(argc, argv, i, "--chunk"))) {
		if (!cli_int("--chunk", v, 1, TOAST_MAX_CHUNK, &n))
			return -1;
		eo->chunk = (int)n;
	} else if ((which & CLI_EO_QUANT) && (v = cli_optval(argc, argv, i, "--quant"))) {
		eo->quant = v;
	} else {
		return 0;
	}
	return 1;
}

int cli_status_exit(enum toast_status st)
{
	switch (st) {
	case TOAST_OK: return 0;
	case TOAST_ERR_IO:
	case TOAST_ERR_FORMAT:
	case TOAST_ERR_INVALID:
	case TOAST_ERR_UNSUPPORTED:
	case TOAST_ERR_CTX_FULL: return 2;
	default: return 1;
	}
}

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
} commands[] = {
	{"check", cli_check, "check MODEL_DIR [--reference FILE] [--threads N] [--chunk N] [--backend B]: compare with reference logits"},
	{"convert", cli_convert, "convert MODEL_DIR -o FILE.gguf --type bf16|q8_0|q4_0|q4_1|q4_k_m|q5_k_m|q6_k: write one GGUF file"},
	{"pull", cli_pull, "pull [--bwlimit KBPS] [--threads N] [--quiet] SOURCE [DEST]: copy a model with rsync (resumable) and verify its SHA256SUMS"},
	{"publish", cli_publish, "publish [--threads N] DIR: write DIR/SHA256SUMS so that DIR can be served to toasted pull"},
	{"run", cli_run, "run MODEL_DIR [PROMPT] [--system TEXT] [--messages FILE.json] [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed N] [--stop STR] [--no-think] [--ignore-eos] [--print-ids] [--stats] [--ctx-size N] [--backend B] [--threads N]: generate a reply (stdin is appended to PROMPT)"},
	{"tokenize", cli_tokenize, "tokenize MODEL_DIR [TEXT] [--jsonl]: print token ids (stdin when no TEXT)"},
	{"detokenize", cli_detokenize, "detokenize MODEL_DIR ID...: print the text of token ids"},
	{"start", cli_start, "start MODEL_DIR [--socket PATH] [--foreground] [--log FILE] [--debug] [--http 127.0.0.1:PORT] [--ctx-size N] [--cache-mb N] [--cache-dir DIR] ...: serve a model"},
	{"stop", cli_stop, "stop [--socket PATH] [--timeout S]: stop the daemon (SIGTERM) and wait for it"},
	{"status", cli_status, "status [--socket PATH] [--json]: what the daemon serves, requests, memory, cache"},
	{"bench", cli_bench, "bench (MODEL_DIR | --synthetic SHAPE|CONFIG.json [--type T]) [--backend B] [--threads N] [--cache]: prefill and decode speed, or time to first token with the session cache"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: toasted COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  toasted %s\n", commands[i].help);
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("toasted %s\n", TOAST_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[1], commands[i].name) == 0)
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "toasted: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return 2;
}
