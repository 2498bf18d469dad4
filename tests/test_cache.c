/*
 * test_cache.c - the session cache (src/engine/cache.c) on the CPU backend, with the tiny
 * hybrid (Gated DeltaNet + attention), attention-only and flat-GDN reference models:
 *
 * - a restored snapshot continues bit for bit as the session it was taken from, at both of its
 *   points (the end of a request and the end of its prompt), from host or backend memory;
 * - lookups key on exact tokens: a prompt that differs anywhere before a point never restores it;
 * - parent eviction: a conversation of ten turns holds one snapshot; interleaved conversations
 *   hold one each; the budget evicts the least recently used;
 * - files: a new cache on the same directory restores bit for bit; a corrupted, truncated,
 *   renamed or foreign file is detected and never loaded;
 * - the repetition penalty sees restored tokens as it sees prefilled ones.
 * With a GPU, restores and files are checked on the CUDA backend too (SKIP without one).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "test.h"
#include "util/fs.h"
#include "util/log.h"

#define N_CTX 512

static const char *backend = "cpu";
static const char *quant; /* NULL: the weights as stored */
static const char *kv_cache; /* NULL: the KV cache in the activation type; "q8" */

static struct toast_engine *open_model(const char *name, int chunk)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/models/%s", test_data_dir(), name);
	struct toast_engine_opts o;
	toast_engine_opts_init(&o);
	o.backend = backend;
	o.quant = quant;
	o.kv_cache = kv_cache;
	o.n_threads = 2;
	o.chunk = chunk;
	struct toast_engine *e = NULL;
	struct toast_error err = {0};
	CHECK(toast_engine_open(dir, &o, &e, &err) == TOAST_OK, "%s: %s", dir, err.msg);
	return e;
}

/* a model and a session of N_CTX tokens on it (NULL, reported, when either fails) */
static struct toast_engine *setup(const char *model, int chunk, struct toast_session **s)
{
	struct toast_engine *e = open_model(model, chunk);
	struct toast_error err = {0};
	*s = NULL;
	if (e && toast_session_new(e, N_CTX, s, &err) != TOAST_OK) {
		CHECK(0, "session: %s", err.msg);
		toast_engine_close(e);
		e = NULL;
	}
	return e;
}

static void teardown(struct toast_engine *e, struct toast_session *s, struct toast_cache *c)
{
	toast_cache_free(c);
	toast_session_free(s);
	toast_engine_close(e);
}

static void fill_ids(int32_t *ids, int n, uint32_t seed, int n_vocab)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		ids[i] = (int32_t)((seed >> 8) % (uint32_t)n_vocab);
	}
}

static struct toast_cache *cache_open(struct toast_engine *e, size_t budget, bool device, const char *dir)
{
	struct toast_cache_opts o = {.budget_bytes = budget, .device = device, .dir = dir};
	struct toast_cache *c = NULL;
	struct toast_error err = {0};
	CHECK(toast_cache_new(e, &o, &c, &err) == TOAST_OK, "cache: %s", err.msg);
	return c;
}

static struct toast_cache_stats stats(const struct toast_cache *c)
{
	struct toast_cache_stats st;
	toast_cache_get_stats(c, &st);
	return st;
}

static void feed(struct toast_session *s, const int32_t *ids, int n)
{
	struct toast_error err = {0};
	for (int i = 0; i < n; i++) /* one at a time, as generation feeds */
		CHECK(toast_session_feed(s, ids + i, 1, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
}

static int restore(struct toast_cache *c, struct toast_session *s, const int32_t *ids, int n)
{
	int keep = -1;
	struct toast_error err = {0};
	CHECK(toast_cache_restore(c, s, ids, n, &keep, &err) == TOAST_OK, "restore: %s", err.msg);
	CHECK(toast_session_n_past(s) == keep, "the session holds what restore says (%d vs %d)",
	      toast_session_n_past(s), keep);
	return keep;
}

/*
 * One request as the daemon runs it: restore the longest cached prefix of prompt, prefill the
 * rest, mark the end of the prompt, "generate" gen (fed one at a time), snapshot. Returns n_keep.
 */
static int request(struct toast_cache *c, struct toast_session *s, const int32_t *prompt, int n, const int32_t *gen,
		   int n_gen)
{
	struct toast_error err = {0};
	int keep = restore(c, s, prompt, n);
	if (keep < n)
		CHECK(toast_session_feed(s, prompt + keep, n - keep, NULL, &err) == TOAST_OK, "prefill: %s", err.msg);
	toast_cache_mark_prompt(c, s);
	feed(s, gen, n_gen);
	CHECK(toast_cache_save(c, s, &err) == TOAST_OK, "save: %s", err.msg);
	return keep;
}

/* logits after feeding ids in a fresh session, the same way request() feeds them */
static void reference(struct toast_engine *e, const int32_t *prompt, int n, const int32_t *gen, int n_gen,
		      const int32_t *next, int n_next, float *logits)
{
	struct toast_session *s = NULL;
	struct toast_error err = {0};
	CHECK(toast_session_new(e, N_CTX, &s, &err) == TOAST_OK, "session: %s", err.msg);
	CHECK(toast_session_feed(s, prompt, n, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
	feed(s, gen, n_gen);
	if (n_next)
		CHECK(toast_session_feed(s, next, n_next, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
	memcpy(logits, toast_session_logits(s), (size_t)toast_engine_info(e)->n_vocab * sizeof(float));
	toast_session_free(s);
}

static bool same_logits(struct toast_session *s, const float *ref, int V)
{
	const float *l = toast_session_logits(s);
	return l && memcmp(l, ref, (size_t)V * sizeof(float)) == 0;
}

/* Restore at both points, from host and backend memory: bit for bit the same continuation. */
static void test_restore(const char *model, bool device)
{
	struct toast_session *s;
	struct toast_engine *e = setup(model, 0, &s);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	struct toast_cache *c = cache_open(e, 64 << 20, device, NULL);
	int32_t conv[200], other[100];
	fill_ids(conv, 200, 1, V);
	fill_ids(other, 100, 2, V);
	float *ref = malloc((size_t)V * sizeof(float));
	/* request 1: prompt conv[0, 70) (crosses a prefill chunk), reply conv[70, 80) */
	CHECK(request(c, s, conv, 70, conv + 70, 10) == 0, "%s: the first request is a miss", model);
	CHECK(stats(c).entries == 1, "%s: one snapshot", model);

	/* the end point, after another conversation used the session: conv[0, 80) + 30 new tokens */
	CHECK(request(c, s, other, 50, other + 50, 5) == 0, "%s: another conversation misses", model);
	CHECK(restore(c, s, conv, 110) == 80, "%s: the end point of the first request is restored", model);
	CHECK(toast_session_feed(s, conv + 80, 30, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
	reference(e, conv, 70, conv + 70, 10, conv + 80, 30, ref);
	CHECK(same_logits(s, ref, V), "%s (%s, %s): restored at the end, the continuation is bit-identical", model,
	      backend, device ? "device" : "host");

	/* the prompt point: the same prompt with another reply (an edited or regenerated answer) */
	int32_t edited[120];
	memcpy(edited, conv, sizeof(edited));
	edited[75] = (edited[75] + 1) % V;
	CHECK(restore(c, s, edited, 120) == 70, "%s: a changed reply falls back to the end of the prompt", model);
	reference(e, conv, 70, NULL, 0, NULL, 0, ref);
	CHECK(same_logits(s, ref, V), "%s: the logits at the end of the prompt come back", model);
	CHECK(toast_session_feed(s, edited + 70, 50, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
	reference(e, conv, 70, NULL, 0, edited + 70, 50, ref);
	CHECK(same_logits(s, ref, V), "%s (%s): restored at the prompt point, bit-identical", model,
	      device ? "device" : "host");
	CHECK(restore(c, s, conv, 70) == 70, "%s: the exact prompt again (a regenerated answer) is a full hit", model);

	/* exact tokens: a difference before a point never restores it */
	memcpy(edited, conv, sizeof(edited));
	edited[69] = (edited[69] + 1) % V;
	CHECK(restore(c, s, edited, 120) == 0 && toast_session_n_past(s) == 0, "%s: a changed prompt token is a miss",
	      model);
	edited[69] = conv[69];
	edited[0] = (edited[0] + 1) % V;
	CHECK(restore(c, s, edited, 120) == 0, "%s: a changed first token is a miss", model);
	CHECK(restore(c, s, conv, 69) == 0, "%s: a prompt shorter than every point is a miss", model);

	/* the session itself: a conversation that continues in it needs no copy */
	CHECK(request(c, s, conv, 80, conv + 80, 10) == 80, "%s: the snapshot continues", model);
	CHECK(restore(c, s, conv, 120) == 90, "%s: the session holds the last request", model);
	CHECK(toast_session_feed(s, conv + 90, 30, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
	reference(e, conv, 70, conv + 70, 20, conv + 90, 30, ref);
	CHECK(same_logits(s, ref, V), "%s: continued in the session, bit-identical", model);
	free(ref);
	teardown(e, s, c);
}

/* Ten turns of one conversation hold one snapshot; interleaved conversations hold one each. */
static void test_parent_eviction(void)
{
	struct toast_session *s;
	struct toast_engine *e = setup("qwen3next-tiny", 0, &s);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_cache *c = cache_open(e, 64 << 20, false, NULL);
	int32_t a[400], b[400];
	fill_ids(a, 400, 3, V);
	fill_ids(b, 400, 4, V);
	int na = 0, nb = 0;
	for (int turn = 0; turn < 10; turn++) {
		/* a turn: the history so far + 12 new prompt tokens, then a reply of 6 */
		int keep = request(c, s, a, na + 12, a + na + 12, 6);
		CHECK(keep == na, "turn %d of A: the whole history is reused (%d of %d)", turn, keep, na);
		na += 18;
		keep = request(c, s, b, nb + 12, b + nb + 12, 6);
		CHECK(keep == nb, "turn %d of B: the whole history is reused (%d of %d)", turn, keep, nb);
		nb += 18;
		CHECK(stats(c).entries == 2, "turn %d: one snapshot per conversation (%d)", turn, stats(c).entries);
	}
	CHECK(stats(c).replaced == 18, "each turn after the first replaced its parent (%llu)",
	      (unsigned long long)stats(c).replaced);
	CHECK(stats(c).evictions == 0, "nothing evicted for the budget");
	teardown(e, s, c);
}

/* The budget holds two snapshots: the least recently used one goes. */
static void test_lru(void)
{
	struct toast_session *s;
	struct toast_engine *e = setup("qwen3next-tiny", 0, &s);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	/* measure one snapshot (prompt 40 + reply 10, with its prompt point) */
	struct toast_cache *c = cache_open(e, 64 << 20, false, NULL);
	int32_t conv[4][60];
	for (int k = 0; k < 4; k++)
		fill_ids(conv[k], 60, 10 + k, V);
	request(c, s, conv[0], 40, conv[0] + 40, 10);
	size_t one = stats(c).bytes_held;
	CHECK(one > toast_model_kv_bytes(&e->model, 50) + 2 * toast_model_rec_bytes(&e->model),
	      "a snapshot holds the KV rows, the states at both points and the logits (%zu)", one);
	toast_cache_free(c);

	c = cache_open(e, 2 * one + one / 2, false, NULL);
	request(c, s, conv[0], 40, conv[0] + 40, 10);
	request(c, s, conv[1], 40, conv[1] + 40, 10);
	CHECK(restore(c, s, conv[0], 50) == 50, "0 is used again (now more recent than 1)");
	request(c, s, conv[2], 40, conv[2] + 40, 10);
	struct toast_cache_stats st = stats(c);
	CHECK(st.entries == 2 && st.evictions == 1 && st.bytes_held <= st.budget_bytes,
	      "the budget holds two: one eviction (%d snapshots, %llu evictions, %zu of %zu bytes)", st.entries,
	      (unsigned long long)st.evictions, st.bytes_held, st.budget_bytes);
	CHECK(restore(c, s, conv[1], 50) == 0, "the least recently used (1) was evicted");
	CHECK(restore(c, s, conv[0], 50) == 50, "0 stays");
	CHECK(restore(c, s, conv[2], 50) == 50, "2 stays");
	toast_cache_free(c);

	c = cache_open(e, one / 2, false, NULL);
	request(c, s, conv[3], 40, conv[3] + 40, 10);
	CHECK(stats(c).entries == 0 && stats(c).bytes_held == 0, "a snapshot larger than the budget is not kept");
	teardown(e, s, c);
}

static char *only_file(const char *dir)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "ls %s/*.snap 2>/dev/null", dir);
	FILE *p = popen(cmd, "r");
	static char line[4200];
	line[0] = 0;
	if (p) {
		if (!fgets(line, sizeof(line), p))
			line[0] = 0;
		pclose(p);
	}
	line[strcspn(line, "\n")] = 0;
	return line[0] ? line : NULL;
}

static void flip_byte(const char *path, long off_from_end)
{
	int fd = open(path, O_RDWR);
	struct stat st;
	CHECK(fd >= 0 && fstat(fd, &st) == 0, "open %s", path);
	if (fd < 0)
		return;
	unsigned char b;
	off_t off = st.st_size - off_from_end;
	CHECK(pread(fd, &b, 1, off) == 1, "read");
	b ^= 0x40;
	CHECK(pwrite(fd, &b, 1, off) == 1, "write");
	close(fd);
}

/* Files: a restart restores bit for bit; broken or foreign files are never loaded. */
static void test_files(void)
{
	struct toast_session *s;
	struct toast_engine *e = setup("qwen3next-tiny", 0, &s);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	char dir[] = "/tmp/toast-cache-test-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	struct toast_error err = {0};
	int32_t conv[120];
	fill_ids(conv, 120, 5, V);
	float *ref = malloc((size_t)V * sizeof(float));
	reference(e, conv, 70, conv + 70, 10, conv + 80, 40, ref);

	for (int device = 0; device < 2; device++) {
		struct toast_cache *c = cache_open(e, 64 << 20, device, dir);
		request(c, s, conv, 70, conv + 70, 10);
		CHECK(stats(c).files == 1 && only_file(dir), "the snapshot is written to a file");
		toast_cache_free(c);

		c = cache_open(e, 64 << 20, !device, dir); /* files do not depend on where images live */
		struct toast_cache_stats st = stats(c);
		CHECK(st.entries == 1 && st.files == 1 && st.bytes_held == 0, "a new cache indexes the file, loads nothing");
		toast_session_reset(s);
		CHECK(restore(c, s, conv, 120) == 80, "after a restart: a hit");
		CHECK(toast_session_feed(s, conv + 80, 40, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
		CHECK(same_logits(s, ref, V), "restored from a file: bit-identical");
		CHECK(stats(c).bytes_held > 0, "the state is in memory once used");
		toast_cache_free(c);
	}

	/* a corrupted payload: indexed (its header is fine), never loaded, removed */
	char *path = only_file(dir);
	char keep[4200];
	snprintf(keep, sizeof(keep), "%s", path ? path : "");
	flip_byte(keep, 3);
	struct toast_cache *c = cache_open(e, 64 << 20, false, dir);
	toast_session_reset(s);
	CHECK(restore(c, s, conv, 120) == 0 && toast_session_n_past(s) == 0, "a corrupted file is a miss");
	CHECK(stats(c).rejected == 1 && stats(c).entries == 0, "and counted as rejected");
	CHECK(!toast_file_exists(keep), "a broken snapshot file of ours is removed");
	request(c, s, conv, 70, conv + 70, 10);
	toast_cache_free(c);

	/* corrupted tokens: the header checksum rejects it at once */
	struct stat st0;
	CHECK(stat(keep, &st0) == 0, "the file is back");
	{
		int fd = open(keep, O_RDWR);
		unsigned char b;
		CHECK(fd >= 0 && pread(fd, &b, 1, 72 + 4) == 1, "read a token byte");
		b ^= 1;
		CHECK(pwrite(fd, &b, 1, 72 + 4) == 1, "write");
		close(fd);
	}
	c = cache_open(e, 64 << 20, false, dir);
	CHECK(stats(c).entries == 0 && stats(c).rejected == 1, "corrupted tokens: rejected when indexed");
	toast_session_reset(s);
	CHECK(restore(c, s, conv, 120) == 0, "and a miss");
	request(c, s, conv, 70, conv + 70, 10); /* rewrites it */
	toast_cache_free(c);

	/* truncated: rejected when indexed */
	CHECK(truncate(keep, st0.st_size - 1) == 0, "truncate");
	c = cache_open(e, 64 << 20, false, dir);
	CHECK(stats(c).entries == 0 && stats(c).rejected == 1, "a truncated file is rejected");
	toast_session_reset(s);
	CHECK(restore(c, s, conv, 120) == 0, "and a miss");
	request(c, s, conv, 70, conv + 70, 10);
	toast_cache_free(c);

	/* renamed: its name no longer matches its tokens */
	char moved[4200];
	snprintf(moved, sizeof(moved), "%s/0000000000000000-0000000000000000.snap", dir);
	CHECK(rename(keep, moved) == 0, "rename");
	c = cache_open(e, 64 << 20, false, dir);
	CHECK(stats(c).entries == 0 && stats(c).rejected == 1, "a renamed file is rejected");
	toast_cache_free(c);
	CHECK(rename(moved, keep) == 0, "rename back");

	/* another model, the same one quantised, or on another backend (another act type): the
	 * file is refused and left alone */
	const char *mine = backend;
	for (int k = 0; k < 3; k++) {
		static const char *what[] = {"another model", "the same model quantised", "the same model elsewhere"};
		backend = k < 2 ? mine : strcmp(mine, "cpu") == 0 && toast_backend_cuda_available() ? "cuda" : NULL;
		quant = k == 1 ? "q8_0" : NULL;
		struct toast_engine *e2 = backend ? open_model(k == 0 ? "qwen35-tiny" : "qwen3next-tiny", 0) : NULL;
		if (e2) {
			c = cache_open(e2, 64 << 20, false, dir);
			CHECK(stats(c).entries == 0 && stats(c).rejected == 1, "%s (%s): the file is refused", what[k], backend);
			toast_cache_free(c);
			CHECK(toast_file_exists(keep), "and left alone");
			toast_engine_close(e2);
		}
	}
	backend = mine;
	quant = NULL;

	/* the directory budget: a second conversation's file pushes out the older one, whose state
	 * stays in memory once it is there */
	c = cache_open(e, 64 << 20, false, dir);
	size_t one = stats(c).file_bytes;
	toast_cache_free(c);
	struct toast_cache_opts o = {.budget_bytes = 64 << 20, .dir = dir, .dir_budget_bytes = one + one / 2};
	CHECK(toast_cache_new(e, &o, &c, &err) == TOAST_OK, "cache: %s", err.msg);
	toast_session_reset(s);
	CHECK(restore(c, s, conv, 120) == 80, "loaded from its file");
	int32_t other[80];
	fill_ids(other, 80, 6, V);
	request(c, s, other, 70, other + 70, 10);
	CHECK(stats(c).files == 1 && stats(c).file_bytes <= one + one / 2, "the directory budget holds one file");
	CHECK(!toast_file_exists(keep), "the older file went");
	CHECK(stats(c).entries == 2, "its snapshot stays in memory");
	teardown(e, s, c);

	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0, "cleanup");
	free(ref);
}

struct collect {
	int32_t ids[64];
	int n;
	int cut; /* > 0: ask to stop after this many tokens */
};

static int collect_id(void *ud, int32_t id, const char *text, size_t len)
{
	struct collect *c = ud;
	(void)text, (void)len;
	if (c->n < 64)
		c->ids[c->n++] = id;
	return c->cut > 0 && c->n >= c->cut;
}

/* the next token of session h by hand: the top the sampler needs and a draw from it, or, where
 * it needs every logit, a draw from them */
static int32_t hand_pick(struct toast_session *h, struct toast_sampler *sp, struct toast_error *err)
{
	int32_t ids[TOAST_SAMPLER_TOP_MAX];
	float vals[TOAST_SAMPLER_TOP_MAX];
	int need = toast_sampler_top_need(sp), n;
	if (need == 0) {
		const float *l = toast_session_logits(h);
		return l ? toast_sampler_sample(sp, l) : -1;
	}
	n = toast_session_top(h, need, ids, vals, err);
	return n < 0 ? -1 : toast_sampler_sample_top(sp, ids, vals, n);
}

/* Generation feeds every token it streams, the last included, also where a step runs while the
 * host streams the token before it (an asynchronous backend, CUDA, or the CPU told it is one:
 * the token fed before its text is found; steps chained, each queued before its token
 * is read): the ids a loop of top and feed picks, the session then holding prompt + reply with
 * that loop's logits bit for bit; a reply the callback cuts holds its tokens too. Greedy, and
 * drawn from the top 20, with and without a repetition penalty, and from every logit (top-k 0
 * with a nucleus; a penalty under 1) (chained too: the draw made where the logits are, draw.h).
 * The session cache's snapshot of a request's end relies on it. */
static void test_generate_fed(bool async)
{
	struct toast_session *s, *h = NULL;
	struct toast_engine *e = setup("qwen3next-tiny", 0, &s);
	if (!e)
		return;
	if (async)
		e->be->async_steps = true;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	int32_t p[30];
	fill_ids(p, 30, 9, V);
	float *ref = malloc((size_t)V * sizeof(float));
	for (int mode = 0; ref && mode < 6; mode++) {
		bool drawn = mode % 2 || mode == 4;
		const char *how = (const char *[]){"greedy",           "drawn",
						   "greedy, penalised", "drawn, penalised",
						   "drawn from every logit", "drawn, penalised under 1"}[mode];
		struct toast_gen_opts go = {.max_tokens = 12};
		toast_sampling_init(&go.sampling);
		go.sampling.temperature = drawn ? 0.7f : 0.0f;
		go.sampling.repeat_penalty = mode == 5 ? 0.8f : mode >= 2 && mode < 4 ? 5.0f : 1.0f;
		go.sampling.top_k = mode == 4 ? 0 : go.sampling.top_k;
		go.sampling.top_p = mode == 4 ? 0.9f : go.sampling.top_p;
		go.sampling.repeat_last_n = 4; /* (greedy repeats a token 5 later here: the window's edge) */
		go.sampling.seed = 42;
		struct toast_gen_result res;
		struct collect got = {0};
		toast_session_reset(s);
		CHECK(toast_generate(s, NULL, p, 30, &go, collect_id, &got, &res, &err) == TOAST_OK, "generate: %s", err.msg);
		CHECK(got.n == 12 && res.finish == TOAST_FINISH_LENGTH && toast_session_n_past(s) == 42,
		      "%s %s: 12 tokens streamed (%d), all fed (%d in the session)", backend, how, got.n,
		      toast_session_n_past(s));
		CHECK(memcmp(toast_session_tokens(s) + 30, got.ids, 12 * sizeof(int32_t)) == 0,
		      "%s %s: the session holds the reply", backend, how);
		/* by hand: the same sampler, top and feed a token at a time */
		struct toast_sampler *sp = NULL;
		CHECK(toast_sampler_new(&go.sampling, V, &sp, &err) == TOAST_OK, "sampler: %s", err.msg);
		CHECK(toast_session_new(e, N_CTX, &h, &err) == TOAST_OK, "session: %s", err.msg);
		CHECK(h && toast_session_feed(h, p, 30, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
		for (int i = 0; sp && h && i < 30; i++)
			toast_sampler_accept(sp, p[i]);
		for (int i = 0; sp && h && i < 12; i++) {
			int32_t id = hand_pick(h, sp, &err);
			toast_sampler_accept(sp, id);
			CHECK(id == got.ids[i], "%s %s: token %d is %d, by hand %d", backend, how, i, got.ids[i], id);
			feed(h, &id, 1);
		}
		if (h) {
			memcpy(ref, toast_session_logits(h), (size_t)V * sizeof(float));
			CHECK(same_logits(s, ref, V), "%s %s: generation ends with the logits of its last token fed", backend,
			      how);
		}
		if (h) { /* more, from logits on the host (as a cache restore leaves them): the first
			  * token picked there, the chain (if any) from the next; a new sampler */
			struct collect more = {0};
			go.max_tokens = 6;
			CHECK(toast_generate(s, NULL, NULL, 0, &go, collect_id, &more, &res, &err) == TOAST_OK, "generate: %s",
			      err.msg);
			go.max_tokens = 12;
			toast_sampler_free(sp);
			sp = NULL;
			CHECK(toast_sampler_new(&go.sampling, V, &sp, &err) == TOAST_OK, "sampler: %s", err.msg);
			for (int i = 0; sp && i < toast_session_n_past(h); i++) /* (the penalty's window) */
				toast_sampler_accept(sp, toast_session_tokens(h)[i]);
			for (int i = 0; sp && i < 6; i++) {
				int32_t id = hand_pick(h, sp, &err);
				CHECK(more.n == 6 && id == more.ids[i], "%s %s: continued, token %d is %d, by hand %d", backend, how,
				      i, more.ids[i], id);
				toast_sampler_accept(sp, id);
				feed(h, &id, 1);
			}
			memcpy(ref, toast_session_logits(h), (size_t)V * sizeof(float));
			CHECK(toast_session_n_past(s) == 48 && same_logits(s, ref, V),
			      "%s %s: continued from host logits, the session holds 48 tokens (%d) and the same logits", backend,
			      how, toast_session_n_past(s));
		}
		toast_sampler_free(sp);
		toast_session_free(h);
		h = NULL;
		struct collect cut = {.cut = 5};
		toast_session_reset(s);
		CHECK(toast_generate(s, NULL, p, 30, &go, collect_id, &cut, &res, &err) == TOAST_OK, "generate: %s", err.msg);
		CHECK(res.finish == TOAST_FINISH_CANCELLED && cut.n == 5 && toast_session_n_past(s) == 35 &&
			      memcmp(toast_session_tokens(s) + 30, got.ids, 5 * sizeof(int32_t)) == 0,
		      "%s %s: a reply cut after 5 tokens holds them (finish %d, %d streamed, %d in the session)", backend,
		      how, (int)res.finish, cut.n, toast_session_n_past(s));
	}
	free(ref);
	toast_session_free(s);
	toast_engine_close(e);
}

static double max_rel(const float *a, const float *b, int n)
{
	double mr = 0, md = 0;
	for (int i = 0; i < n; i++) {
		mr = fmax(mr, fabs(b[i]));
		md = fmax(md, isnan(a[i]) ? INFINITY : fabs((double)a[i] - b[i]));
	}
	return md / mr;
}

/* The speculative-step tests' engine, session s and reference session h: h holds the prompt
 * p[32] (fill_ids(seed)) and the n tokens G of the reply to it, greedy (so NULL) or drawn by a
 * sampler of so's settings. NULL, nothing left open, where they cannot be made. */
static struct toast_engine *spec_setup(const char *model, uint32_t seed, const struct toast_sampling *so,
				       struct toast_session **s, struct toast_session **h, int32_t *p, int32_t *G, int n)
{
	struct toast_engine *e = setup(model, 0, s);
	if (!e)
		return NULL;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	struct toast_sampler *b = NULL;
	*h = NULL;
	CHECK(toast_session_new(e, N_CTX, h, &err) == TOAST_OK && (!so || toast_sampler_new(so, V, &b, &err) == TOAST_OK),
	      "session, sampler: %s", err.msg);
	if (!*h || (so && !b)) {
		toast_session_free(*h);
		toast_session_free(*s);
		toast_engine_close(e);
		return NULL;
	}
	fill_ids(p, 32, seed, V);
	feed(*h, p, 32);
	for (int i = 0; i < n; i++) {
		float v;
		if (b)
			G[i] = hand_pick(*h, b, &err);
		else
			CHECK(toast_session_top(*h, 1, G + i, &v, &err) == 1, "top: %s", err.msg);
		feed(*h, G + i, 1);
	}
	toast_sampler_free(b);
	return e;
}

/* A speculative step's drafts: all taken, some, none; then trimmed. The session holds what
 * feeding the kept tokens one at a time gives (its logits within tol). */
static void test_spec_step(const char *model, double tol)
{
	struct toast_session *s, *h;
	int32_t p[32], G[10];
	struct toast_engine *e = spec_setup(model, 7, NULL, &s, &h, p, G, 10);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	/* h again from the start, fed token by token alongside s: the reference */
	toast_session_reset(h);
	feed(h, p, 32);
	feed(s, p, 32);
	int32_t x = (G[7] + 1) % V, y = (G[7] + 2) % V, next = -1;
	const struct {
		int32_t ids[5];
		int T, n, next, trim; /* n kept, the pick after them, then trimmed to (0: not) */
	} steps[] = {
		{{G[0], G[1], G[2], G[3], G[4]}, 5, 5, G[5], 0},
		{{G[5], G[6], x, G[8]}, 4, 2, G[7], 1},
		{{G[6], y}, 2, 1, G[7], 0},
		{{G[7]}, 1, 1, G[8], 0},
	};
	for (int k = 0; k < 4; k++) {
		int n = toast_session_spec_step(s, steps[k].ids, steps[k].T, NULL, &next, &err);
		CHECK(n == steps[k].n && next == steps[k].next, "%s %s step %d: %d of %d kept (want %d), then %d (want %d) %s",
		      backend, model, k, n, steps[k].T, steps[k].n, next, steps[k].next, err.msg);
		int kept = n;
		if (steps[k].trim) {
			CHECK(toast_session_spec_trim(s, steps[k].trim, &err) == TOAST_OK, "trim: %s", err.msg);
			kept = steps[k].trim;
		}
		feed(h, steps[k].ids, kept > 0 ? kept : 1);
		double d = max_rel(toast_session_logits(s), toast_session_logits(h), V);
		CHECK(toast_session_n_past(s) == toast_session_n_past(h) && d < tol &&
			      memcmp(toast_session_tokens(s), toast_session_tokens(h), (size_t)toast_session_n_past(h) * 4) == 0,
		      "%s %s step %d: the session holds %d tokens (%d by hand), logits error %.3g", backend, model, k,
		      toast_session_n_past(s), toast_session_n_past(h), d);
	}
	CHECK(toast_session_spec_trim(s, 2, &err) == TOAST_ERR_INVALID, "a trim past what was kept is refused");
	CHECK(toast_session_spec_step(s, G, TOAST_GDN_KEEP_MAX + 1, NULL, &next, &err) < 0, "a step of %d is refused",
	      TOAST_GDN_KEEP_MAX + 1);
	toast_session_free(h);
	toast_session_free(s);
	toast_engine_close(e);
}

/* The draft tests' engine and session (async: on the CPU, steps chained by the backend's picks,
 * as on a GPU, then left) and prompt p[40], a text that repeats itself: the prompt lookup finds
 * drafts at once */
static struct toast_engine *draft_setup(const char *model, bool async, struct toast_session **s, int32_t *p)
{
	struct toast_engine *e = setup(model, 0, s);
	if (!e)
		return NULL;
	if (async)
		e->be->async_steps = true;
	fill_ids(p, 20, 5, toast_engine_info(e)->n_vocab);
	memcpy(p + 20, p, 20 * sizeof(int32_t));
	return e;
}

/* Speculative greedy decoding (toast_gen_opts.draft): the tokens of plain greedy decoding, drafts
 * taken and refused, and a reply cut inside a step's kept tokens leaves the session as plain
 * decoding would (its tokens and logits; the logits within tol of the one-token path's). */
static void test_generate_draft(const char *model, bool loops, bool async, double tol)
{
	struct toast_session *s;
	int32_t p[40];
	struct toast_engine *e = draft_setup(model, async, &s, p);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	struct collect plain = {0};
	struct toast_gen_opts go = {.max_tokens = 60};
	toast_sampling_init(&go.sampling);
	go.sampling.temperature = 0;
	struct toast_gen_result res;
	CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &plain, &res, &err) == TOAST_OK, "generate: %s", err.msg);
	float *ref = malloc((size_t)V * sizeof(float));
	memcpy(ref, toast_session_logits(s), (size_t)V * sizeof(float));
	int drafted = 0, accepted = 0;
	for (int k = 1; k <= TOAST_DRAFT_MAX; k++) {
		struct collect got = {0};
		go.draft = k;
		toast_session_reset(s);
		CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &got, &res, &err) == TOAST_OK, "generate: %s", err.msg);
		CHECK(got.n == 60 && memcmp(got.ids, plain.ids, sizeof(got.ids)) == 0 && toast_session_n_past(s) == 92 &&
			      memcmp(toast_session_tokens(s) + 32, got.ids, 60 * sizeof(int32_t)) == 0,
		      "%s %s, drafts of %d: the greedy tokens (%d streamed, %d in the session)", backend, model, k, got.n,
		      toast_session_n_past(s));
		double d = max_rel(toast_session_logits(s), ref, V);
		CHECK(d < tol, "%s %s, drafts of %d: the last token's logits, error %.3g", backend, model, k, d);
		drafted += res.n_drafted, accepted += res.n_accepted;
		/* cut after each count of tokens: the session ends at the last streamed */
		for (int cut = 1; cut <= 60; cut += loops ? 1 : 7) {
			struct collect c = {.cut = cut};
			toast_session_reset(s);
			CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &c, &res, &err) == TOAST_OK, "generate: %s",
			      err.msg);
			struct toast_session *h = NULL;
			CHECK(toast_session_new(e, N_CTX, &h, &err) == TOAST_OK, "session: %s", err.msg);
			feed(h, p, 32);
			feed(h, plain.ids, cut);
			d = max_rel(toast_session_logits(s), toast_session_logits(h), V);
			CHECK(c.n == cut && toast_session_n_past(s) == 32 + cut && d < tol,
			      "%s %s, drafts of %d cut after %d: %d in the session, logits error %.3g", backend, model, k, cut,
			      toast_session_n_past(s), d);
			toast_session_free(h);
		}
	}
	/* (only where the reply repeats itself: qwen3-tiny's greedy reply falls into a loop; the
	 * hybrid fixtures' do not within 60 tokens, test_spec_step takes and refuses drafts there;
	 * chained, the loop's drafts are all taken) */
	CHECK(!loops || (accepted > 0 && (async || drafted > accepted)), "%s %s: drafts taken (%d) and refused (%d of %d)",
	      backend, model, accepted, drafted - accepted, drafted);
	go.draft = TOAST_DRAFT_MAX + 1;
	CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &(struct collect){0}, &res, &err) == TOAST_ERR_INVALID,
	      "drafts of more than %d tokens are refused", TOAST_DRAFT_MAX);
	free(ref);
	toast_session_free(s);
	toast_engine_close(e);
}

/* A speculative step with a sampler: each row drawn with the uniform its token takes, a draft
 * token kept where that draw chooses it (all, some, none): the step's picks are the host's draws
 * from its own rows of logits with a twin sampler's uniforms, and where the logits are exactly
 * decode's (exact: the CPU) the kept tokens are those of sampling by hand, and the sampler then
 * stands where sampling them and the next one by hand leaves it (the next draws agree). */
static void test_spec_step_sampled(const char *model, bool exact)
{
	struct toast_session *s, *h;
	struct toast_sampling so;
	toast_sampling_init(&so);
	so.temperature = 1.0f, so.top_k = 40, so.top_p = 0.95f, so.seed = 99;
	int32_t p[32], G[12], next = -1; /* G: the sampled reply by hand */
	struct toast_engine *e = spec_setup(model, 11, &so, &s, &h, p, G, 12);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	struct toast_sampler *a = NULL, *c = NULL; /* the step's, the twin */
	float *rows = malloc((size_t)TOAST_GDN_KEEP_MAX * V * sizeof(float));
	CHECK(rows && toast_sampler_new(&so, V, &a, &err) == TOAST_OK && toast_sampler_new(&so, V, &c, &err) == TOAST_OK,
	      "samplers: %s", err.msg);
	if (!rows || !a || !c)
		goto out;
	feed(s, p, 32);
	CHECK(hand_pick(s, a, &err) == G[0] && hand_pick(s, c, &err) == G[0], "%s %s: the first token by hand", backend,
	      model);
	int32_t x = (G[7] + 1) % V, y = (G[8] + 1) % V;
	const struct {
		int32_t ids[5];
		int T, n, next;
	} steps[] = {
		{{G[0], G[1], G[2], G[3], G[4]}, 5, 5, G[5]},
		{{G[5], G[6], x, G[8]}, 4, 2, G[7]},
		{{G[7], y}, 2, 1, G[8]},
		{{G[8]}, 1, 1, G[9]},
	};
	for (int k = 0; k < 4; k++) {
		int T = steps[k].T;
		int n = toast_session_spec_step(s, steps[k].ids, T, a, &next, &err);
		struct toast_draw d[TOAST_GDN_KEEP_MAX];
		int32_t pk[TOAST_GDN_KEEP_MAX];
		bool drawn = toast_sampler_draws(c, d, T);
		CHECK(drawn && e->be->ops->read(e->be, rows, e->work.logits_all, (size_t)T * V * sizeof(float), &err) == TOAST_OK,
		      "the step's rows: %s", err.msg);
		int want = 1;
		for (int r = 0; r < T; r++)
			pk[r] = toast_pick_host(rows + (size_t)r * V, V, d + r, -1);
		while (want < T && steps[k].ids[want] == pk[want - 1])
			want++;
		toast_sampler_take(c, want);
		CHECK(n == want && next == pk[want - 1], "%s %s sampled step %d: %d of %d kept, then %d (the rows' draws: %d, %d)",
		      backend, model, k, n, T, next, want, pk[want - 1]);
		CHECK(!exact || (n == steps[k].n && next == steps[k].next),
		      "%s %s sampled step %d: %d of %d kept (by hand %d), then %d (by hand %d) %s", backend, model, k, n, T,
		      steps[k].n, next, steps[k].next, err.msg);
	}
	feed(s, &next, 1);
	for (int i = 10; i < 12; i++) {
		int32_t t = hand_pick(s, a, &err), tc = hand_pick(s, c, &err);
		CHECK(t == tc && (!exact || t == G[i]), "%s %s: token %d by hand after the steps: %d (the twin's %d, want %d)",
		      backend, model, i, t, tc, G[i]);
		feed(s, &t, 1);
	}
	CHECK(!exact || (toast_session_n_past(s) == 44 && memcmp(toast_session_tokens(s), toast_session_tokens(h), 44 * 4) == 0),
	      "%s %s: the session holds the sampled reply", backend, model);
out:
	free(rows);
	toast_sampler_free(a);
	toast_sampler_free(c);
	toast_session_free(h);
	toast_session_free(s);
	toast_engine_close(e);
}

/* Speculative sampling: with drafts, a sampled reply is the one plain sampling gives with the
 * same seed, for a draw from the top k, from every logit, and near-greedy ones (whose drafts are
 * taken where the reply loops). With a repetition penalty nothing is drafted. Not exact (a GPU:
 * the verifying pass's logits round differently from decode's, so a draw near the edge between
 * two tokens may take the other), only the near-greedy draws and the penalty's. */
static void test_generate_draft_sampled(const char *model, bool loops, bool async, bool exact)
{
	struct toast_session *s;
	int32_t p[40];
	struct toast_engine *e = draft_setup(model, async, &s, p);
	if (!e)
		return;
	struct toast_error err = {0};
	const struct {
		float temperature, top_p, penalty;
		int top_k;
	} cfg[] = {{0.7f, 0.8f, 1.0f, 20}, {1.0f, 1.0f, 1.0f, 0}, {0.3f, 0.95f, 1.0f, 3}, {0.7f, 0.8f, 1.1f, 20},
		   {0.05f, 1.0f, 1.0f, 0}, {0.05f, 0.8f, 1.0f, 20}};
	int drafted = 0, accepted = 0;
	for (int c = 0; c < 6; c++) {
		if (!exact && cfg[c].temperature > 0.05f && cfg[c].penalty == 1.0f)
			continue;
		struct toast_gen_opts go = {.max_tokens = 60};
		toast_sampling_init(&go.sampling);
		go.sampling.temperature = cfg[c].temperature, go.sampling.top_p = cfg[c].top_p;
		go.sampling.top_k = cfg[c].top_k, go.sampling.repeat_penalty = cfg[c].penalty;
		go.sampling.seed = 1234 + c;
		struct collect plain = {0};
		struct toast_gen_result res;
		toast_session_reset(s);
		CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &plain, &res, &err) == TOAST_OK, "generate: %s",
		      err.msg);
		for (int k = 1; k <= TOAST_DRAFT_MAX; k += 3) {
			struct collect got = {0};
			go.draft = k;
			toast_session_reset(s);
			CHECK(toast_generate(s, NULL, p, 32, &go, collect_id, &got, &res, &err) == TOAST_OK, "generate: %s",
			      err.msg);
			CHECK(got.n == 60 && memcmp(got.ids, plain.ids, sizeof(got.ids)) == 0 && toast_session_n_past(s) == 92 &&
				      memcmp(toast_session_tokens(s) + 32, got.ids, 60 * sizeof(int32_t)) == 0,
			      "%s %s, sampler %d, drafts of %d: plain sampling's tokens (%d streamed, %d in the session)",
			      backend, model, c, k, got.n, toast_session_n_past(s));
			if (cfg[c].penalty != 1.0f)
				CHECK(res.n_drafted == 0, "%s %s: nothing drafted with a penalty (%d)", backend, model,
				      res.n_drafted);
			drafted += res.n_drafted, accepted += res.n_accepted;
		}
		go.draft = 0;
	}
	CHECK(!loops || (accepted > 0 && drafted > 0), "%s %s: sampled drafts taken (%d; %d refused of %d)",
	      backend, model, accepted, drafted - accepted, drafted);
	toast_session_free(s);
	toast_engine_close(e);
}

/* The repetition penalty sees the restored history: the same tokens as a full prefill. With
 * chunk 1 every token is its own forward pass, so both ways compute the same logits. */
static void test_penalty(void)
{
	struct toast_session *s;
	struct toast_engine *e = setup("qwen3next-tiny", 1, &s);
	if (!e)
		return;
	int V = toast_engine_info(e)->n_vocab;
	struct toast_error err = {0};
	struct toast_cache *c = cache_open(e, 64 << 20, false, NULL);
	int32_t p[60];
	fill_ids(p, 60, 7, V);
	struct toast_gen_opts go = {.max_tokens = 24};
	toast_sampling_init(&go.sampling);
	go.sampling.temperature = 0;
	go.sampling.repeat_penalty = 50;
	go.sampling.repeat_last_n = 64;
	struct toast_gen_result res;
	struct collect full = {0}, cached = {0};
	toast_session_reset(s);
	CHECK(toast_generate(s, NULL, p, 60, &go, collect_id, &full, &res, &err) == TOAST_OK, "generate: %s", err.msg);
	/* a snapshot with its prompt point at p[0, 40) (and a reply that is not p[40]), then the rest
	 * of the prompt on top of that point */
	int32_t reply = (p[40] + 1) % V;
	request(c, s, p, 40, &reply, 1);
	CHECK(restore(c, s, p, 60) == 40, "the prompt point is restored");
	CHECK(toast_generate(s, NULL, p + 40, 20, &go, collect_id, &cached, &res, &err) == TOAST_OK, "generate: %s",
	      err.msg);
	CHECK(res.n_prompt == 60 && res.n_prefilled == 20, "n_prompt %d, n_prefilled %d", res.n_prompt, res.n_prefilled);
	CHECK(full.n == cached.n && memcmp(full.ids, cached.ids, (size_t)full.n * sizeof(int32_t)) == 0,
	      "with a repetition penalty, the restored session generates what a full prefill does");
	/* the penalty mattered: without it the reply differs */
	struct collect plain = {0};
	go.sampling.repeat_penalty = 1;
	toast_session_reset(s);
	CHECK(toast_generate(s, NULL, p, 60, &go, collect_id, &plain, &res, &err) == TOAST_OK, "generate: %s", err.msg);
	CHECK(plain.n != full.n || memcmp(plain.ids, full.ids, (size_t)full.n * sizeof(int32_t)) != 0,
	      "the penalty changes the reply (else this test proves nothing)");
	teardown(e, s, c);
}

/* An 8-bit KV cache: restores at points inside a unit of 4 tokens (70, 110) are bit-identical
 * too, and its snapshots are not another cache type's (the fingerprint). */
static void test_kv8(void)
{
	struct toast_engine *e = open_model("qwen3next-tiny", 0);
	kv_cache = "q8";
	test_restore("qwen3next-tiny", false);
	test_restore("qwen3-tiny", true);
	/* the prompt point (70) restored after a longer conversation overwrote the session: tokens
	 * 68 and 69 come from the image's last unit, which is copied whole */
	struct toast_session *s;
	struct toast_engine *e8 = setup("qwen3next-tiny", 0, &s);
	kv_cache = NULL;
	if (e8) {
		int V = toast_engine_info(e8)->n_vocab;
		struct toast_cache *c = cache_open(e8, 64 << 20, false, NULL);
		int32_t conv[120], other[100];
		fill_ids(conv, 120, 3, V);
		fill_ids(other, 100, 4, V);
		float *ref = malloc((size_t)V * sizeof(float));
		struct toast_error err = {0};
		request(c, s, conv, 70, conv + 70, 10);
		request(c, s, other, 90, other + 90, 5);
		conv[75] = (conv[75] + 1) % V;
		CHECK(restore(c, s, conv, 120) == 70, "%s: the prompt point of an 8-bit cache", backend);
		CHECK(toast_session_feed(s, conv + 70, 50, NULL, &err) == TOAST_OK, "feed: %s", err.msg);
		reference(e8, conv, 70, NULL, 0, conv + 70, 50, ref);
		CHECK(same_logits(s, ref, V), "%s: an 8-bit cache restored inside a unit, bit-identical", backend);
		free(ref);
		toast_cache_free(c);
		toast_session_free(s);
	}
	CHECK(e && e8 && toast_model_fingerprint(&e->model) != toast_model_fingerprint(&e8->model),
	      "%s: an 8-bit KV cache's snapshots have their own fingerprint", backend);
	size_t b70 = e8 ? toast_model_kv_bytes(&e8->model, 70) : 0;
	CHECK(e && e8 && b70 == toast_model_kv_bytes(&e8->model, 72) && b70 > toast_model_kv_bytes(&e8->model, 68) &&
		      1.5 * b70 < toast_model_kv_bytes(&e->model, 70),
	      "%s: an 8-bit image holds whole units of 4 tokens, in fewer bytes", backend);
	toast_engine_close(e), toast_engine_close(e8);
}

int main(int argc, char **argv)
{
	const char *models[] = {"qwen3next-tiny", "qwen3-tiny", "qwen35-tiny"};
	toast_log_set_level(TOAST_LOG_ERROR); /* the broken files below are warned about, as they should be */
	for (int i = 0; i < 3; i++)
		for (int device = 0; device < 2; device++)
			test_restore(models[i], device);
	test_kv8();
	test_parent_eviction();
	test_lru();
	test_files();
	test_penalty();
	test_generate_fed(false);
	test_generate_fed(true);
	for (int i = 0; i < 3; i++) {
		test_spec_step(models[i], 1e-4);
		test_generate_draft(models[i], i == 1, false, 1e-4);
		test_generate_draft(models[i], i == 1, true, 1e-4);
		test_spec_step_sampled(models[i], true);
		test_generate_draft_sampled(models[i], i == 1, false, true);
		test_generate_draft_sampled(models[i], i == 1, true, true);
	}
	/* the GPU: restores (from pinned host and from device memory) and files, bit for bit */
	if (toast_backend_cuda_available()) {
		backend = "cuda";
		for (int i = 0; i < 3; i++)
			for (int device = 0; device < 2; device++)
				test_restore(models[i], device);
		test_kv8();
		test_files();
		test_generate_fed(false);
		/* the steps' kernels are not decode's (T tokens a GEMV, the DeltaNet step token after
		 * token): logits within bf16's tolerance; the tokens are the same here */
		for (int i = 0; i < 3; i++) {
			test_spec_step(models[i], 2e-2);
			test_generate_draft(models[i], i == 1, true, 2e-2);
			test_spec_step_sampled(models[i], false);
			test_generate_draft_sampled(models[i], i == 1, true, false);
		}
	} else {
		printf("test_cache: cuda SKIP (no CUDA device in this build or machine)\n");
	}
	return test_done("test_cache");
}
