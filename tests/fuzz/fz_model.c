/*
 * libFuzzer harness: what a Hugging Face model directory holds. The first byte picks the reader
 * of the rest: 0, a config.json (the hyperparameters); 1, a .safetensors file's header (padded
 * with 4 MiB of zeros, as fz_gguf's); 2, the SHA256SUMS that `toasted pull` takes from a source. Build: `make fuzz`; run: build-fuzz/fz_model
 * -max_total_time=600 -max_len=65536 DIR build-fuzz/seeds-model.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "format/tensordir.h"
#include "models/model.h"
#include "pull/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	struct toast_error err = {0};
	if (data[0] % 3 == 2) {
		struct toast_manifest m;
		memset(&m, 0, sizeof(m));
		if (toast_manifest_parse(&m, (const char *)data + 1, size - 1, "SHA256SUMS", &err) == TOAST_OK)
			toast_manifest_free(&m);
		return 0;
	}
	if (data[0] % 3 == 0) {
		char *text = malloc(size);
		if (!text)
			return 0;
		memcpy(text, data + 1, size - 1);
		text[size - 1] = 0;
		struct toast_hparams hp;
		memset(&hp, 0, sizeof(hp));
		if (toast_hparams_parse(&hp, text, &err) == TOAST_OK)
			toast_hparams_free(&hp);
		free(text);
		return 0;
	}
	char path[64];
	snprintf(path, sizeof(path), "/tmp/fz-st-%d.safetensors", (int)getpid());
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	if (fd < 0)
		abort();
	if (write(fd, data + 1, size - 1) != (ssize_t)(size - 1) || ftruncate(fd, (off_t)size + (4 << 20)))
		abort();
	close(fd);
	struct toast_tensordir st;
	if (toast_st_open_file(&st, path, &err) == TOAST_OK)
		toast_tensordir_close(&st);
	unlink(path);
	return 0;
}
