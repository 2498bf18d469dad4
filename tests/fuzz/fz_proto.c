/*
 * libFuzzer harness: what a client or a peer sends. The first byte picks the reader of the
 * rest: 0, an HTTP request head (`--http`); 1, a request line of the socket protocol; 2, an
 * event line as the client reads it. Build: `make fuzz`; run: build-fuzz/fz_proto
 * -max_total_time=600 DIR build-fuzz/seeds-proto.
 */
#include <stdint.h>
#include <string.h>

#include "proto/proto.h"
#include "server/srv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *p = (const char *)data + 1;
	size_t n = size - 1;
	if (data[0] % 3 == 0) {
		struct srv_http_head h;
		int status = 0;
		const char *why = NULL;
		memset(&h, 0, sizeof(h));
		srv_http_parse_head(p, n, &h, &status, &why);
	} else if (data[0] % 3 == 1) {
		struct toast_proto_req r;
		struct toast_proto_fail f;
		memset(&r, 0, sizeof(r));
		toast_proto_req_parse(p, n, &r, &f);
		toast_proto_req_deinit(&r);
	} else {
		struct toast_proto_event ev;
		struct toast_error err = {0};
		memset(&ev, 0, sizeof(ev));
		toast_proto_event_parse(p, n, &ev, &err);
		toast_proto_event_deinit(&ev);
	}
	return 0;
}
