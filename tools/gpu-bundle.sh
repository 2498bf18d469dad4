#!/bin/sh
# Build the CUDA-enabled binaries here and collect them with the shared libraries the GPU
# machine may lack (jansson, pcre2, utf8proc) into carry/gpu, which a device run carries
# (see bench/gpu.sh). CUDA libraries come from the GPU machine itself.
set -eu
cd "$(dirname "$0")/.."
make -j2 CUDA=1 build/toasted build/tests/test_ops >/dev/null
rm -rf carry/gpu
mkdir -p carry/gpu/lib carry/gpu/bin
cp build/toasted build/tests/test_ops carry/gpu/bin/ && strip carry/gpu/bin/*
for b in carry/gpu/bin/*; do
	ldd "$b" | awk '/=> \//{print $3}' | grep -E 'jansson|pcre2|utf8proc' | while read -r l; do cp -L "$l" carry/gpu/lib/; done
done
du -sh carry/gpu
