#!/bin/sh
# Install what toasted's build and tests need on Debian/Ubuntu (apt-get, as root or through
# sudo). CUDA is optional: `make` builds the CUDA backend only where nvcc is installed.
set -eu
pkgs="build-essential pkg-config xz-utils rsync valgrind python3 python3-pip python3-venv
libjansson-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev nettle-dev"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
	sudo=""
elif command -v sudo >/dev/null; then
	sudo=sudo
else
	echo "deps: install these packages as root:$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086 # one word per package
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
