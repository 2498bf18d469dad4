/*
 * probe.cuh - what the GPU probes (bench/decode_probe.cu, bench/k4_probe.cu) share: a CUDA call
 * checked, and the copy bandwidth each measures in its own run (as toasted bench does).
 */
#ifndef TOAST_BENCH_PROBE_CUH
#define TOAST_BENCH_PROBE_CUH

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

/* a failed call ends the probe (a program of its own, not library code) */
#define CHECK(x)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s: %s: %s (line %d)\n", __FILE__, #x, cudaGetErrorString(e_), __LINE__); \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* read + written bytes a second of a 1 GB device copy on stream s, best of 5 after a first that
 * touches the pages (a memcpy node in a graph goes to a copy engine, ~20% slower) */
static double probe_copy_bw(cudaStream_t s)
{
	size_t cb = 1ull << 30;
	void *ca, *cb2;
	CHECK(cudaMalloc(&ca, cb));
	CHECK(cudaMalloc(&cb2, cb));
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	double bw = 0;
	for (int i = 0; i < 6; i++) {
		float ms = 0;
		CHECK(cudaEventRecord(e0, s));
		CHECK(cudaMemcpyAsync(cb2, ca, cb, cudaMemcpyDeviceToDevice, s));
		CHECK(cudaEventRecord(e1, s));
		CHECK(cudaEventSynchronize(e1));
		CHECK(cudaEventElapsedTime(&ms, e0, e1));
		bw = i > 0 && 2.0 * cb / (ms * 1e-3) > bw ? 2.0 * cb / (ms * 1e-3) : bw;
	}
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(ca);
	cudaFree(cb2);
	return bw;
}

#endif
