#!/usr/bin/env bash
# `bouquet bench` on a lent H200 (see bench/README.md). Run from the device checkout's root:
#   bash .carry/gpu/bench/gpu_run.sh "MODEL ..." [more bouquet-bench options]
# Expects the gateway's wheels in ./.whl (carried) and bench/assets/tokenizer.json + COMMIT in the
# tree this script lives in (bench/prepare_carry.sh puts them there). Results: $OUT/r/.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/r/nvidia-smi.txt"
(timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -3) | tee "$OUT/r/gpu-tests.txt"
models=()
for m in $1; do models+=(--model "$m"); done
shift
python3 -m bouquet bench "${models[@]}" --device cuda --out "$OUT/r" --models-root /tmp/models \
  --tokenizer bench/assets/tokenizer.json --commit "$(cat COMMIT 2>/dev/null || echo unknown)" "$@" 2>&1 \
  | grep -v 'httpx: HTTP Request' | tee "$OUT/r/log.txt"
