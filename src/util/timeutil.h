/* timeutil.h - monotonic clock. */
#ifndef TOAST_UTIL_TIME_H
#define TOAST_UTIL_TIME_H

#include <time.h>

static inline double toast_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
