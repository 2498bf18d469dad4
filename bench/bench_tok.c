/*
 * bench_tok.c - tokenizer speed: `build/bench/bench_tok MODEL_DIR FILE [REPEAT]` encodes FILE
 * (one call over the whole file, REPEAT times) and reports MB/s and tokens/s on one core, then
 * the time to encode a prompt cut from FILE to about 17,000 tokens, and the load time.
 * Encoding is timed in the thread's CPU time, so other processes on the machine do not count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "toasted.h"
#include "util/fs.h"
#include "util/timeutil.h"

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: bench_tok MODEL_DIR FILE [REPEAT]\n");
		return 2;
	}
	int repeat = argc > 3 ? atoi(argv[3]) : 5;
	struct toast_error err = {0};
	struct toast_tokenizer *tok;
	double t0 = toast_now();
	if (toast_tok_load(argv[1], &tok, &err) != TOAST_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	double t_load = toast_now() - t0;
	char *text;
	size_t n;
	if (toast_read_file(argv[2], (size_t)1 << 30, &text, &n, &err) != TOAST_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	double best = 1e30;
	int n_ids = 0;
	for (int r = 0; r < repeat; r++) {
		int32_t *ids;
		t0 = cpu_now();
		if (toast_tok_encode(tok, text, n, &ids, &n_ids, &err) != TOAST_OK) {
			fprintf(stderr, "%s\n", err.msg);
			return 1;
		}
		double t = cpu_now() - t0;
		best = t < best ? t : best;
		free(ids);
	}
	printf("load %.0f ms; %zu bytes -> %d tokens: best of %d %.1f ms = %.1f MB/s, %.2f M tokens/s\n", t_load * 1e3, n,
	       n_ids, repeat, best * 1e3, n / best / 1e6, n_ids / best / 1e6);
	/* a prompt of about 17,000 tokens */
	size_t cut = n_ids > 17000 ? (size_t)((double)n * 17000 / n_ids) : n;
	int32_t *ids;
	int m;
	toast_tok_encode(tok, text, cut, &ids, &m, &err); /* refine the cut to land near 17,000 */
	free(ids);
	if (m > 0 && (size_t)((double)cut * 17000 / m) < n)
		cut = (size_t)((double)cut * 17000 / m);
	best = 1e30;
	for (int r = 0; r < repeat; r++) {
		t0 = cpu_now();
		toast_tok_encode(tok, text, cut, &ids, &m, &err);
		double t = cpu_now() - t0;
		best = t < best ? t : best;
		free(ids);
	}
	printf("prompt of %zu bytes -> %d tokens: %.2f ms\n", cut, m, best * 1e3);
	free(text);
	toast_tok_free(tok);
	return 0;
}
