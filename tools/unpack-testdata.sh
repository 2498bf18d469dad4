#!/bin/sh
# Unpack the test fixtures: SRC/**/X.xz -> DST/**/X, SRC/**/X.link (a relative path) -> a copy of
# that file, anything else copied as is. Fails loudly on any missing or corrupt file.
set -eu
src=$1
dst=$2
command -v xz >/dev/null || { echo "unpack-testdata: xz is required (apt-get install xz-utils)" >&2; exit 1; }
find "$src" -type f | sort | while read -r f; do
	rel=${f#"$src"/}
	mkdir -p "$dst/$(dirname "$rel")"
	case "$rel" in
	*.xz) xz -dc "$f" > "$dst/${rel%.xz}.tmp" && mv "$dst/${rel%.xz}.tmp" "$dst/${rel%.xz}" ;;
	*.link) ;;
	*) cp "$f" "$dst/$rel" ;;
	esac
done
find "$src" -type f -name '*.link' | sort | while read -r f; do
	rel=${f#"$src"/}
	target=$(dirname "$dst/$rel")/$(cat "$f")
	[ -f "$target" ] || { echo "unpack-testdata: $rel points to missing $target" >&2; exit 1; }
	cp "$target" "$dst/${rel%.link}"
done
