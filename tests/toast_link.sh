#!/bin/sh
# toast links util + proto only: no engine, tokenizer, backend or server symbol may be in it,
# and libcurl is not linked (it is loaded on demand: docs/PERF.md).
set -u
BUILD=${BUILD:-build}
bin=$BUILD/toast
[ -x "$bin" ] || { echo "toast_link: $bin is missing" >&2; exit 1; }
bad=$(nm "$bin" | grep -E ' [TtDdBbRr] (toast_(engine|session|model|backend|tok_|chat_|generate|sampler|sampling|detok|cpu|cuda|st_|server|daemon|pool)|srv_)' | head)
if [ -n "$bad" ]; then
	echo "toast_link: engine symbols in $bin:" >&2
	echo "$bad" >&2
	exit 1
fi
nm "$bin" | grep -q ' T toast_proto_chat_write' || { echo "toast_link: nm sees no symbols in $bin" >&2; exit 1; }
if ldd "$bin" | grep -q libcurl; then
	echo "toast_link: $bin links libcurl (it must dlopen it)" >&2
	exit 1
fi
echo "toast_link: toast links util + proto only, libcurl loaded on demand: OK"
