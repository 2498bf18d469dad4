/*
 * convert.c - `toasted convert MODEL_DIR -o FILE.gguf --type TYPE`: write a Hugging Face model
 * directory as one GGUF file (models/convert.c).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "models/convert.h"
#include "models/quantize.h"

int cli_convert(int argc, char **argv)
{
	const char *dir = NULL, *out = NULL, *type = NULL;
	for (int i = 1; i < argc; i++) {
		const char *v;
		if ((v = cli_optval(argc, argv, &i, "--type"))) {
			type = v;
		} else if ((v = cli_optval(argc, argv, &i, "-o"))) {
			out = v;
		} else if (argv[i][0] == '-' || dir) {
			fprintf(stderr, "toasted convert: unexpected argument %s\n", argv[i]);
			return 2;
		} else {
			dir = argv[i];
		}
	}
	enum toast_quant_mix mix = TOAST_MIX_NONE;
	if (!dir || !out || !type || !*out || !toast_quant_mix_parse(type, &mix) || mix == TOAST_MIX_NONE) {
		fprintf(stderr, "usage: toasted convert MODEL_DIR -o FILE.gguf --type "
				"bf16|q8_0|q4_0|q4_1|q4_k_m|q5_k_m|q6_k\n");
		return 2;
	}
	struct toast_error err = {0};
	enum toast_status st = toast_convert(dir, out, mix, &err);
	if (st != TOAST_OK) {
		fprintf(stderr, "toasted convert: %s\n", err.msg);
		return cli_status_exit(st) ? cli_status_exit(st) : 1;
	}
	printf("wrote %s (%s)\n", out, toast_quant_mix_name(mix));
	return 0;
}
