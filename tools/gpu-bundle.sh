#!/bin/sh
# Build the CUDA-enabled binaries here (in build-gpu, for sm_90a alone: the H100/H200 run
# that, and it halves the bytes) and collect them with the shared libraries the GPU machine
# may lack (jansson, pcre2, utf8proc, nettle) into carry/gpu, which a device run carries (see
# bench/gpu.sh). CUDA libraries come from the GPU machine itself. The binaries travel
# xz-compressed (a run carries at most 64 MiB with the tree); bench/gpu.sh unpacks them.
# carry/gpu/ab (an older toasted for bench/gpu.sh ab) is left as it is. TIMELINE=1: also
# toasted-tl, the build bench/timeline.sh runs. BINS="toasted toast test_ops": only those
# (a run carries 64 MiB: the full set and a base binary in carry/gpu/ab come near it).
set -eu
cd "$(dirname "$0")/.."
G=build-gpu
make -j2 CUDA=1 BUILD=$G CUDA_ARCH=-gencode=arch=compute_90a,code=sm_90a \
	$G/toasted $G/toast $G/tests/test_ops $G/tests/test_cache $G/tests/test_smollm $G/bench/decode_probe \
	$G/bench/k4_probe $G/bench/read_probe $G/bench/libcupti_trace.so >/dev/null
rm -rf carry/gpu/bin carry/gpu/lib
mkdir -p carry/gpu/lib carry/gpu/bin
for b in ${BINS:-toasted toast test_ops test_cache test_smollm decode_probe k4_probe read_probe}; do
	for d in $G $G/tests $G/bench; do
		[ -f $d/$b ] && cp $d/$b carry/gpu/bin/ && break
	done
	[ -f carry/gpu/bin/$b ] || { echo "gpu-bundle: no $b"; exit 1; }
done
strip carry/gpu/bin/*
for b in carry/gpu/bin/*; do
	ldd "$b" | awk '/=> \//{print $3}' | grep -E 'jansson|pcre2|utf8proc|nettle' | while read -r l; do cp -L "$l" carry/gpu/lib/; done
done
cp $G/bench/libcupti_trace.so carry/gpu/lib/
if [ "${TIMELINE:-0}" = 1 ]; then # bench/timeline.sh's build: block timestamps at every dependent-launch wait
	make -j2 CUDA=1 BUILD=build-tl CUDA_ARCH="-gencode=arch=compute_90a,code=sm_90a -DTOAST_TIMELINE" \
		build-tl/toasted >/dev/null
	cp build-tl/toasted carry/gpu/bin/toasted-tl && strip carry/gpu/bin/toasted-tl
fi
xz -9e -T2 carry/gpu/bin/*
du -sh carry/gpu
