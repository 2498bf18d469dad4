/* strmap.c - string -> int hash map (linear probing, power-of-two capacity, load <= 1/2). */
#include "util/strmap.h"

#include <stdlib.h>
#include <string.h>

static int strmap_alloc(struct toast_strmap *m, size_t cap)
{
	m->keys = calloc(cap, sizeof(*m->keys));
	m->lens = calloc(cap, sizeof(*m->lens));
	m->vals = calloc(cap, sizeof(*m->vals));
	m->cap = cap;
	m->n = 0;
	if (!m->keys || !m->lens || !m->vals) {
		toast_strmap_deinit(m);
		return -1;
	}
	return 0;
}

int toast_strmap_init(struct toast_strmap *m, size_t expected)
{
	size_t cap = 16;
	while (cap < expected * 2)
		cap *= 2;
	return strmap_alloc(m, cap);
}

void toast_strmap_deinit(struct toast_strmap *m)
{
	free(m->keys);
	free(m->lens);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

static size_t strmap_slot(const struct toast_strmap *m, const char *key, size_t n)
{
	size_t mask = m->cap - 1;
	size_t i = (size_t)toast_fnv1a(key, n, TOAST_FNV_OFFSET) & mask;
	while (m->keys[i] && !(m->lens[i] == n && memcmp(m->keys[i], key, n) == 0))
		i = (i + 1) & mask;
	return i;
}

int toast_strmap_put(struct toast_strmap *m, const char *key, size_t n, int val)
{
	if ((m->n + 1) * 2 > m->cap) {
		struct toast_strmap old = *m;
		if (strmap_alloc(m, old.cap * 2) != 0) {
			*m = old;
			return -1;
		}
		for (size_t i = 0; i < old.cap; i++)
			if (old.keys[i])
				toast_strmap_put(m, old.keys[i], old.lens[i], old.vals[i]);
		toast_strmap_deinit(&old);
	}
	size_t i = strmap_slot(m, key, n);
	if (!m->keys[i]) {
		m->keys[i] = key;
		m->lens[i] = n;
		m->n++;
	}
	m->vals[i] = val;
	return 0;
}

int toast_strmap_get(const struct toast_strmap *m, const char *key, size_t n)
{
	if (!m->cap)
		return -1;
	size_t i = strmap_slot(m, key, n);
	return m->keys[i] ? m->vals[i] : -1;
}
