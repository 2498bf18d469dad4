/*
 * test_load_progress.c - toast_engine_opts.progress: called while the weights are prepared,
 * never decreasing, ending at the total; returning nonzero cancels the load cleanly
 * (TOAST_ERR_CANCELLED, nothing leaked: run under ASan/valgrind).
 */
#include <string.h>

#include "test.h"
#include "toasted.h"

struct prog {
	int calls, cancel_at;
	size_t last, total;
	bool monotonic;
};

static int on_progress(void *ud, size_t done, size_t total)
{
	struct prog *p = ud;
	p->monotonic &= done >= p->last && done <= total && (p->calls == 0 || total == p->total);
	p->last = done;
	p->total = total;
	p->calls++;
	return p->cancel_at && p->calls >= p->cancel_at;
}

int main(void)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/models/qwen3next-tiny", test_data_dir());
	struct toast_engine_opts o;
	toast_engine_opts_init(&o);
	o.backend = "cpu";
	o.n_threads = 1;
	struct prog p = {.monotonic = true};
	o.progress = on_progress;
	o.progress_ud = &p;
	struct toast_engine *e = NULL;
	struct toast_error err = {0};
	CHECK(toast_engine_open(dir, &o, &e, &err) == TOAST_OK, "open %s: %s", dir, err.msg);
	int n_layer = e ? toast_engine_info(e)->n_layer : 0;
	CHECK(p.calls == n_layer && n_layer > 0, "one call per layer: %d calls, %d layers", p.calls, n_layer);
	CHECK(p.monotonic && p.total > 0 && p.last == p.total, "monotonic, ends at the total: %zu of %zu", p.last, p.total);
	CHECK(e && p.total == toast_engine_info(e)->weight_bytes, "the total is the weight bytes");
	toast_engine_close(e);

	struct prog c = {.monotonic = true, .cancel_at = 2};
	o.progress_ud = &c;
	e = NULL;
	CHECK(toast_engine_open(dir, &o, &e, &err) == TOAST_ERR_CANCELLED && !e && c.calls == 2,
	      "returning nonzero cancels the load: %s", err.msg);
	return test_done("test_load_progress");
}
