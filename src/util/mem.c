/* mem.c - checked allocation helpers. */
#include "util/mem.h"

#include <stdio.h>
#include <string.h>

char *toast_strdup(const char *s)
{
	if (!s)
		return NULL;
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

void *toast_aalloc(size_t n_bytes)
{
	void *p = NULL;
	size_t n = (n_bytes + 63) & ~(size_t)63;
	if (n < n_bytes || posix_memalign(&p, 64, n ? n : 64) != 0)
		return NULL;
	memset(p, 0, n ? n : 64);
	return p;
}

void toast_afree(void *p)
{
	free(p);
}

size_t toast_mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return 0;
	char line[256];
	unsigned long long kb = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (size_t)kb << 10;
}
