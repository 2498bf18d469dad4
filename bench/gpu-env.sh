# Sourced by the device-side scripts (gpu.sh, ncu-*.sh) from the repository root: unpacks the
# binaries that tools/gpu-bundle.sh put in carry/gpu into $B (always: a warm machine may still
# hold the previous run's) and points the loader at the bundled and the machine's libraries.
B=/tmp/gpu-bin
mkdir -p $B
for f in carry/gpu/bin/*.xz; do
	python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" >"$B/$(basename "$f" .xz)"
done
chmod +x $B/*
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/carry/gpu/lib:/usr/local/cuda/lib64:${CUBLAS_DIR:-}:${LD_LIBRARY_PATH:-}
