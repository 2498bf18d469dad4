/*
 * pool.c - worker pool. Workers spin briefly on the job generation before sleeping on a
 * condition variable, so back-to-back loops (one per op in a forward pass) do not pay a wake-up.
 */
#define _GNU_SOURCE
#include "util/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct toast_pool {
	int n_threads;
	pthread_t *threads;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_uint gen;      /* bumped for each job, and once more to stop */
	atomic_int next;      /* next index to take */
	atomic_int pending;   /* workers still inside the current job */
	int stop;
	int n;
	void (*fn)(void *, int, int);
	void *ctx;
};

struct pool_worker_arg {
	struct toast_pool *p;
	int tid;
};

static void pool_run(struct toast_pool *p, int tid)
{
	for (;;) {
		int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (i >= p->n)
			break;
		p->fn(p->ctx, i, tid);
	}
}

static void *pool_worker(void *arg)
{
	struct toast_pool *p = ((struct pool_worker_arg *)arg)->p;
	int tid = ((struct pool_worker_arg *)arg)->tid;
	free(arg);
	unsigned seen = 0;
	for (;;) {
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && spins < 20000)
			spins++;
		if (g == seen) {
			pthread_mutex_lock(&p->mu);
			while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
				pthread_cond_wait(&p->cv, &p->mu);
			pthread_mutex_unlock(&p->mu);
		}
		seen = g;
		if (p->stop)
			return NULL;
		pool_run(p, tid);
		atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
	}
}

int toast_cpu_count(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

struct toast_pool *toast_pool_new(int n_threads)
{
	if (n_threads <= 0)
		n_threads = toast_cpu_count();
	struct toast_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->n_threads = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
	if (!p->threads) {
		free(p);
		return NULL;
	}
	for (int t = 1; t < n_threads; t++) {
		struct pool_worker_arg *a = malloc(sizeof(*a));
		if (a) {
			a->p = p;
			a->tid = t;
		}
		if (!a || pthread_create(&p->threads[t], NULL, pool_worker, a) != 0) {
			free(a);
			p->n_threads = t; /* stop the ones already started */
			toast_pool_free(p);
			return NULL;
		}
	}
	return p;
}

void toast_pool_free(struct toast_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int t = 1; t < p->n_threads; t++)
		pthread_join(p->threads[t], NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->threads);
	free(p);
}

int toast_pool_size(const struct toast_pool *p)
{
	return p ? p->n_threads : 1;
}

void toast_pool_for(struct toast_pool *p, int n, void (*fn)(void *ctx, int i, int tid), void *ctx)
{
	if (n <= 0)
		return;
	if (!p || p->n_threads == 1 || n == 1) {
		for (int i = 0; i < n; i++)
			fn(ctx, i, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pool_run(p, 0);
	/* yield after a short spin: on a loaded machine the workers we wait for may be descheduled */
	for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++)
		if (spins > 1000)
			sched_yield();
}
