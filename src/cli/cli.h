/*
 * cli.h - the toasted command line: one function per subcommand, and shared option helpers.
 * Commands return the process exit status (0 ok, 1 failure, 2 unusable input or usage).
 */
#ifndef TOAST_CLI_H
#define TOAST_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "toasted.h"

int cli_check(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_convert(int argc, char **argv);
int cli_pull(int argc, char **argv);
int cli_publish(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_start(int argc, char **argv);
int cli_stop(int argc, char **argv);
int cli_status(int argc, char **argv);

/* Parse an integer option value in [lo, hi]; prints an error and returns false otherwise. */
bool cli_int(const char *opt, const char *val, long lo, long hi, long *out);
bool cli_float(const char *opt, const char *val, double lo, double hi, double *out);
/* "--name=value" or "--name value": the value of option name at argv[*i], advancing *i. */
const char *cli_optval(int argc, char **argv, int *i, const char *name);
/* The engine options several commands take: --backend B, --threads N, and where asked
 * --chunk N and --quant TYPE. 1: argv[*i] was one of them (*i advanced), 0: it was not,
 * -1: a bad value (said on stderr). */
enum { CLI_EO_CHUNK = 1, CLI_EO_QUANT = 2 };
int cli_engine_opt(int argc, char **argv, int *i, unsigned which, struct toast_engine_opts *eo);
/* Read all of f (at most max bytes, NUL-terminated, malloc'd); prints why and returns false on failure. */
bool cli_read_stream(FILE *f, size_t max, char **out, size_t *len);
/* exit status for an engine error: 2 for input problems, 1 otherwise */
int cli_status_exit(enum toast_status st);

#endif
