/*
 * tok_decode.c - ids back to text: token pieces, whole-sequence decoding and the streaming
 * detokenizer, plus the small lookups (vocabulary size, id by spelling, end-of-generation).
 *
 * Decoding concatenates the pieces' bytes and makes them valid UTF-8 the way upstream's
 * String::from_utf8_lossy does: each maximal invalid subsequence becomes one U+FFFD. The
 * streaming detokenizer is the same decoder run byte by byte, so streaming a sequence token by
 * token and then flushing yields exactly the whole-sequence decoding.
 * Invariant: output never contains a partial or invalid UTF-8 character.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok.h"
#include "util/err.h"

int toast_tok_n_vocab(const struct toast_tokenizer *tok)
{
	return tok->n_vocab;
}

const char *toast_tok_piece(const struct toast_tokenizer *tok, int32_t id, size_t *len)
{
	if (id < 0 || id >= tok->n_vocab || tok->piece_len[id] == UINT32_MAX) {
		*len = 0;
		return NULL;
	}
	*len = tok->piece_len[id];
	return tok->blob + tok->piece_off[id];
}

int32_t toast_tok_lookup(const struct toast_tokenizer *tok, const char *text)
{
	size_t n = strlen(text);
	int a = toast_strmap_get(&tok->added_ids, text, n);
	if (a >= 0)
		return tok->added[a].id;
	return toast_strmap_get(&tok->bpe_ids, text, n);
}

bool toast_tok_is_eog(const struct toast_tokenizer *tok, int32_t id)
{
	return id >= 0 && id < tok->n_vocab && tok->eog[id];
}

size_t toast_detok_cap(const struct toast_tokenizer *tok)
{
	return 3 * (tok->max_piece + 8) + 16;
}

/* ---- the lossy UTF-8 decoder ---- */

void toast_detok_init(struct toast_detok *d)
{
	memset(d, 0, sizeof(*d));
}

/* Bytes a sequence led by b needs in all (0: b cannot lead one). */
static int detok_need(unsigned char b)
{
	if (b >= 0xC2 && b <= 0xDF)
		return 2;
	if (b >= 0xE0 && b <= 0xEF)
		return 3;
	if (b >= 0xF0 && b <= 0xF4)
		return 4;
	return 0;
}

/* May x follow the pending bytes? (the second byte has lead-specific bounds) */
static bool detok_fits(const struct toast_detok *d, unsigned char x)
{
	unsigned char lo = 0x80, hi = 0xBF;
	if (d->n_pending == 1) {
		unsigned char b = d->pending[0];
		if (b == 0xE0)
			lo = 0xA0;
		else if (b == 0xED)
			hi = 0x9F;
		else if (b == 0xF0)
			lo = 0x90;
		else if (b == 0xF4)
			hi = 0x8F;
	}
	return x >= lo && x <= hi;
}

struct detok_out {
	char *p;
	size_t n, cap;
};

static void detok_emit(struct detok_out *o, const void *s, size_t n)
{
	if (o->n + n > o->cap) /* cannot happen with cap >= toast_detok_cap() */
		n = o->cap - o->n;
	memcpy(o->p + o->n, s, n);
	o->n += n;
}

static void detok_bytes(struct toast_detok *d, const unsigned char *s, size_t n, struct detok_out *o)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char x = s[i];
		if (d->n_pending) {
			if (detok_fits(d, x)) {
				d->pending[d->n_pending++] = x;
				if (d->n_pending == detok_need(d->pending[0])) {
					detok_emit(o, d->pending, (size_t)d->n_pending);
					d->n_pending = 0;
				}
				continue;
			}
			detok_emit(o, "\xEF\xBF\xBD", 3); /* the maximal invalid prefix */
			d->n_pending = 0;
		}
		if (x < 0x80)
			detok_emit(o, &x, 1);
		else if (detok_need(x))
			d->pending[d->n_pending++] = x;
		else
			detok_emit(o, "\xEF\xBF\xBD", 3);
	}
}

size_t toast_detok_push(struct toast_detok *d, const struct toast_tokenizer *tok, int32_t id, char *out, size_t cap)
{
	size_t len;
	const char *p = toast_tok_piece(tok, id, &len);
	struct detok_out o = {out, 0, cap};
	if (p)
		detok_bytes(d, (const unsigned char *)p, len, &o);
	return o.n;
}

size_t toast_detok_flush(struct toast_detok *d, char *out, size_t cap)
{
	struct detok_out o = {out, 0, cap};
	if (d->n_pending)
		detok_emit(&o, "\xEF\xBF\xBD", 3);
	d->n_pending = 0;
	return o.n;
}

enum toast_status toast_tok_decode(const struct toast_tokenizer *tok, const int32_t *ids, int n, char **text,
				   size_t *len, struct toast_error *err)
{
	*text = NULL;
	*len = 0;
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		size_t l;
		if (!toast_tok_piece(tok, ids[i], &l))
			return toast_err_set(err, TOAST_ERR_INVALID, "token id %d is not in the vocabulary (%d ids)", ids[i],
					     tok->n_vocab);
		total += l;
	}
	/* each invalid byte may grow to 3 */
	struct detok_out o = {malloc(total * 3 + 4), 0, total * 3 + 4};
	if (!o.p)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory decoding %d tokens", n);
	struct toast_detok d;
	toast_detok_init(&d);
	for (int i = 0; i < n; i++) {
		size_t l;
		const char *p = toast_tok_piece(tok, ids[i], &l);
		detok_bytes(&d, (const unsigned char *)p, l, &o);
	}
	if (d.n_pending)
		detok_emit(&o, "\xEF\xBF\xBD", 3);
	o.p[o.n] = 0;
	*text = o.p;
	*len = o.n;
	return TOAST_OK;
}
