/* SPDX-License-Identifier: MIT */
/* The JSON config parser (kvcached --config, mooncake.json). */
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config c;
	char err[CONFIG_ERR_MAX];
	char *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	config_init(&c);
	if (config_parse_json(&c, text, size, err, NULL) == 0 &&
	    (c.dram_size < CONFIG_MIN_DRAM_SIZE || strlen(c.protocol) == 0 ||
	     (c.protocol_asked[0] && strcmp(c.protocol, "auto") != 0)))
		__builtin_trap();
	free(text);
	return 0;
}
