/*
 * pool.h - a fixed pool of worker threads for data-parallel loops.
 *
 * toast_pool_for() runs fn(ctx, i, tid) for every i in [0, n) on the workers and the calling
 * thread, and returns when all are done. tid is in [0, toast_pool_size()) and unique among the
 * threads running at once, so per-thread scratch can be indexed by it. Not reentrant: one loop
 * at a time per pool, from one thread.
 */
#ifndef TOAST_UTIL_POOL_H
#define TOAST_UTIL_POOL_H

struct toast_pool;

/* n_threads total, the caller included; <= 0 means all online cores. NULL on failure. */
struct toast_pool *toast_pool_new(int n_threads);
void toast_pool_free(struct toast_pool *p);
int toast_pool_size(const struct toast_pool *p);
void toast_pool_for(struct toast_pool *p, int n, void (*fn)(void *ctx, int i, int tid), void *ctx);
int toast_cpu_count(void);

#endif
