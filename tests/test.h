/*
 * test.h - a minimal test harness: CHECK() records a failure with its location and goes on;
 * test files end main() with `return test_done();`. Data paths come from TOASTED_TESTDATA
 * (default build/testdata); a missing fixture is a failure, never a skip.
 */
#ifndef TOAST_TEST_H
#define TOAST_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int test_failures, test_checks;

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		test_checks++;                                                    \
		if (!(cond)) {                                                    \
			test_failures++;                                          \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                             \
			fprintf(stderr, "\n");                                    \
		}                                                                 \
	} while (0)

static inline const char *test_data_dir(void)
{
	const char *d = getenv("TOASTED_TESTDATA");
	return d && *d ? d : "build/testdata";
}

static inline int test_done(const char *name)
{
	if (test_failures)
		fprintf(stderr, "%s: %d of %d checks FAILED\n", name, test_failures, test_checks);
	else
		printf("%s: %d checks OK\n", name, test_checks);
	return test_failures ? 1 : 0;
}

#endif
