/*
 * tok_bpe.c - byte-pair encoding of one pre-tokenized piece, and the merge table.
 *
 * The piece starts as one symbol per byte; the adjacent pair with the lowest merge rank is merged
 * (leftmost first among equal ranks) until no pair has a merge. A min-heap of candidate merges
 * keyed (rank, position) with lazy invalidation makes this O(n log n), as Hugging Face's
 * `Word::merge_all` does, so a megabyte-long piece (one character repeated) stays fast.
 * Invariant: the result is exactly the upstream one; nothing here allocates per call except the
 * caller's growable scratch.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok.h"
#include "util/err.h"
#include "util/mem.h"

uint32_t tok_byte_to_cp(unsigned char b)
{
	/* printable Latin-1 stands for itself; the other 68 bytes map to U+0100.. in byte order */
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
		return b;
	uint32_t n = 0;
	for (int x = 0; x < b; x++)
		if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
			n++;
	return 256 + n;
}

static inline size_t merge_slot(uint64_t key, size_t cap)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

enum toast_status tok_merges_init(struct toast_tokenizer *tok, size_t n_merges, struct toast_error *err)
{
	size_t cap = 1024;
	while (cap < n_merges * 2 + 1)
		cap *= 2;
	tok->merge_key = malloc(cap * sizeof(*tok->merge_key));
	tok->merge_rank = malloc(cap * sizeof(*tok->merge_rank));
	tok->merge_result = malloc(cap * sizeof(*tok->merge_result));
	if (!tok->merge_key || !tok->merge_rank || !tok->merge_result)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory for %zu merges", n_merges);
	memset(tok->merge_key, 0xff, cap * sizeof(*tok->merge_key));
	tok->merge_cap = cap;
	return TOAST_OK;
}

void tok_merges_put(struct toast_tokenizer *tok, int32_t left, int32_t right, uint32_t rank, int32_t result)
{
	uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
	size_t i = merge_slot(key, tok->merge_cap);
	while (tok->merge_key[i] != UINT64_MAX && tok->merge_key[i] != key)
		i = (i + 1) & (tok->merge_cap - 1);
	tok->merge_key[i] = key;
	tok->merge_rank[i] = rank;
	tok->merge_result[i] = result;
}

bool tok_merges_get(const struct toast_tokenizer *tok, int32_t left, int32_t right, uint32_t *rank, int32_t *result)
{
	uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
	size_t i = merge_slot(key, tok->merge_cap);
	for (;;) {
		uint64_t k = tok->merge_key[i];
		if (k == key) {
			*rank = tok->merge_rank[i];
			*result = tok->merge_result[i];
			return true;
		}
		if (k == UINT64_MAX)
			return false;
		i = (i + 1) & (tok->merge_cap - 1);
	}
}

bool tok_ids_push(struct tok_ids *ids, int32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? ids->cap * 2 : 256;
		int32_t *v = realloc(ids->v, cap * sizeof(*v));
		if (!v)
			return false;
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return true;
}

void tok_bpe_free(struct tok_bpe_scratch *s)
{
	free(s->sym);
	free(s->heap);
	memset(s, 0, sizeof(*s));
}

static inline bool bpe_less(const struct tok_bpe_merge *a, const struct tok_bpe_merge *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void bpe_heap_push(struct tok_bpe_scratch *s, size_t *n, struct tok_bpe_merge m)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bpe_less(&m, &s->heap[p]))
			break;
		s->heap[i] = s->heap[p];
		i = p;
	}
	s->heap[i] = m;
}

static struct tok_bpe_merge bpe_heap_pop(struct tok_bpe_scratch *s, size_t *n)
{
	struct tok_bpe_merge top = s->heap[0], last = s->heap[--*n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && bpe_less(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!bpe_less(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (*n)
		s->heap[i] = last;
	return top;
}

/* Queue the merge of symbol a with its right neighbour, if there is one. */
static void bpe_queue(const struct toast_tokenizer *tok, struct tok_bpe_scratch *s, size_t *nh, int32_t a)
{
	if (a < 0 || s->sym[a].next < 0)
		return;
	int32_t b = s->sym[a].next;
	uint32_t rank;
	int32_t res;
	if (s->sym[a].id >= 0 && s->sym[b].id >= 0 && tok_merges_get(tok, s->sym[a].id, s->sym[b].id, &rank, &res))
		bpe_heap_push(s, nh, (struct tok_bpe_merge){rank, (uint32_t)a, res});
}

enum toast_status tok_bpe_piece(const struct toast_tokenizer *tok, struct tok_bpe_scratch *s, const char *p, size_t n,
				struct tok_ids *out, struct toast_error *err)
{
	const unsigned char *u = (const unsigned char *)p;
	/* a byte without a token (byte_id -1) is dropped, as upstream's BPE without an unk token does */
	if (n == 1)
		return tok->byte_id[u[0]] < 0 || tok_ids_push(out, tok->byte_id[u[0]])
			       ? TOAST_OK
			       : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	if (tok->ignore_merges) {
		int id = toast_strmap_get(&tok->bpe_ids, p, n);
		if (id >= 0)
			return tok_ids_push(out, id) ? TOAST_OK : toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	if (n > s->sym_cap) {
		size_t cap = n < 64 ? 64 : n;
		void *a = realloc(s->sym, cap * sizeof(*s->sym));
		if (a)
			s->sym = a;
		void *b = a ? realloc(s->heap, cap * sizeof(*s->heap)) : NULL;
		if (!b)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory for a %zu-byte piece", n);
		s->heap = b;
		s->sym_cap = s->heap_cap = cap;
	}
	for (size_t i = 0; i < n; i++)
		s->sym[i] = (struct tok_bpe_sym){tok->byte_id[u[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
	/* stale candidates (a symbol merged away, a pair changed) stay queued and are skipped when
	 * popped, as upstream does; the heap grows when a merge queues two new pairs */
	size_t nh = 0;
	for (size_t i = 0; i + 1 < n; i++)
		bpe_queue(tok, s, &nh, (int32_t)i);
	while (nh) {
		struct tok_bpe_merge m = bpe_heap_pop(s, &nh);
		struct tok_bpe_sym *a = &s->sym[m.pos];
		if (a->len == 0 || a->next < 0)
			continue;
		struct tok_bpe_sym *b = &s->sym[a->next];
		uint32_t rank;
		int32_t res;
		if (!tok_merges_get(tok, a->id, b->id, &rank, &res) || res != m.result)
			continue;
		a->id = res;
		a->len += b->len;
		a->next = b->next;
		b->len = 0;
		if (a->next >= 0)
			s->sym[a->next].prev = (int32_t)m.pos;
		if (nh + 2 > s->heap_cap) {
			struct tok_bpe_merge *h = realloc(s->heap, s->heap_cap * 2 * sizeof(*h));
			if (!h)
				return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
			s->heap = h;
			s->heap_cap *= 2;
		}
		bpe_queue(tok, s, &nh, a->prev);
		bpe_queue(tok, s, &nh, (int32_t)m.pos);
	}
	for (int32_t i = 0; i >= 0; i = s->sym[i].next)
		if (s->sym[i].id >= 0 && !tok_ids_push(out, s->sym[i].id))
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	return TOAST_OK;
}
