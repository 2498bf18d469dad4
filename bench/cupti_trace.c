/*
 * cupti_trace.c - a CUDA injection library that records when every kernel ran, graph replays
 * included, for a timeline of a decode step as the GPU runs it (kernels overlapping under
 * programmatic dependent launch, no events between them). Nothing in toasted links it:
 *
 *   CUDA_INJECTION64_PATH=build/bench/libcupti_trace.so TOASTED_TRACE_OUT=trace.csv toasted bench ...
 *
 * The CUDA driver loads it at initialisation and calls InitializeInjection(); kernel records
 * (CUPTI's concurrent-kernel activity, which does not serialise kernels) are written to
 * TOASTED_TRACE_OUT at exit as CSV: start_ns,end_ns,graph_id,grid,block,grid_id,name (mangled).
 * bench/trace-table.py turns that into time per kernel on a step's critical path.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUF_BYTES (8u << 20)

static FILE *trace_out;

static void CUPTIAPI trace_buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
	*buf = aligned_alloc(8, TRACE_BUF_BYTES);
	*size = *buf ? TRACE_BUF_BYTES : 0;
	*max_records = 0;
}

static void CUPTIAPI trace_buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
	CUpti_Activity *rec = NULL;
	while (trace_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
		if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
			continue;
		const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
		fprintf(trace_out, "%llu,%llu,%u,%d,%d,%lld,%s\n", (unsigned long long)k->start,
			(unsigned long long)k->end, k->graphId, k->gridX * k->gridY * k->gridZ,
			k->blockX * k->blockY * k->blockZ, (long long)k->gridId, k->name);
	}
	free(buf);
}

static void trace_flush(void)
{
	cuptiActivityFlushAll(1);
	if (trace_out)
		fclose(trace_out);
	trace_out = NULL;
}

int InitializeInjection(void)
{
	const char *path = getenv("TOASTED_TRACE_OUT");
	trace_out = fopen(path ? path : "trace.csv", "w");
	if (!trace_out) {
		perror("cupti_trace: TOASTED_TRACE_OUT");
		return 0;
	}
	fprintf(trace_out, "start_ns,end_ns,graph_id,grid,block,grid_id,name\n");
	if (cuptiActivityRegisterCallbacks(trace_buf_requested, trace_buf_completed) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(stderr, "cupti_trace: cannot enable kernel activity records\n");
		return 0;
	}
	atexit(trace_flush);
	return 1;
}
