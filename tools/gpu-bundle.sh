#!/bin/sh
# Build the CUDA-enabled binaries here and collect them with the shared libraries the GPU
# machine may lack (jansson, pcre2, utf8proc) into carry/gpu, which a device run carries
# (see bench/gpu.sh). CUDA libraries come from the GPU machine itself. The binaries travel
# xz-compressed (a run carries at most 64 MiB with the tree); bench/gpu.sh unpacks them.
set -eu
cd "$(dirname "$0")/.."
make -j2 CUDA=1 build/toasted build/tests/test_ops build/tests/test_cache build/bench/decode_probe build/bench/libcupti_trace.so >/dev/null
rm -rf carry/gpu/bin carry/gpu/lib # (carry/gpu/ab, an older binary for bench/gpu.sh ab, stays)
mkdir -p carry/gpu/lib carry/gpu/bin
cp build/toasted build/tests/test_ops build/tests/test_cache build/bench/decode_probe carry/gpu/bin/ && strip carry/gpu/bin/*
for b in carry/gpu/bin/*; do
	ldd "$b" | awk '/=> \//{print $3}' | grep -E 'jansson|pcre2|utf8proc|nettle' | while read -r l; do cp -L "$l" carry/gpu/lib/; done
done
cp build/bench/libcupti_trace.so carry/gpu/lib/
xz -T2 carry/gpu/bin/*
du -sh carry/gpu
