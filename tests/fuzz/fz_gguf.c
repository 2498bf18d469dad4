/*
 * libFuzzer harness: a GGUF file's header (the input, padded with 4 MiB of zeros so that
 * tensor data offsets can point somewhere) opened, its string arrays walked, its hyperparameters
 * read, its tensor directory built (names, shapes, transforms) and its tokenizer built. Build:
 * `make fuzz`; run: build-fuzz/fz_gguf -max_total_time=600 -max_len=65536 DIR
 * build-fuzz/seeds-gguf (the headers of converted test models: tests/fuzz/seeds.sh).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/tensordir.h"
#include "models/gguf_names.h"
#include "models/model.h"
#include "tokenizer/tok_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	snprintf(path, sizeof(path), "/tmp/fz-gguf-%d.gguf", (int)getpid());
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	if (fd < 0)
		abort();
	if (write(fd, data, size) != (ssize_t)size || ftruncate(fd, (off_t)size + (4 << 20)))
		abort();
	close(fd);
	struct toast_error err = {0};
	struct toast_gguf g;
	if (toast_gguf_open(&g, path, &err) == TOAST_OK) {
		for (int i = 0; i < g.n_kv; i++) {
			const struct toast_gguf_kv *kv = &g.kv[i];
			size_t pos = 0;
			for (uint64_t k = 0; kv->type == TOAST_GGUF_ARRAY && kv->arr_type == TOAST_GGUF_STRING && k < kv->n && k < 64;
			     k++) {
				const char *s;
				size_t len;
				toast_gguf_next_str(kv, &pos, &s, &len);
			}
		}
		struct toast_hparams hp;
		memset(&hp, 0, sizeof(hp));
		if (toast_hparams_from_gguf(&hp, &g, &err) == TOAST_OK) {
			struct toast_tensordir td;
			if (toast_gguf_tensordir(&g, &hp, &td, &err) == TOAST_OK)
				toast_tensordir_close(&td);
			toast_hparams_free(&hp);
		}
		struct toast_tokenizer *tok = NULL;
		if (toast_tok_from_gguf(&g, &tok, &err) == TOAST_OK)
			toast_tok_free(tok);
		toast_gguf_close(&g);
	}
	unlink(path);
	return 0;
}
