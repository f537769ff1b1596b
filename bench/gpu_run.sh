#!/usr/bin/env bash
# Run `bouquet bench` on a lent H200 from the checkout root of /work/main, with this tree carried
# in .carry/gpu and the gateway's wheels in .whl (see bench/README.md). Usage:
#   bash .carry/gpu/bench/gpu_run.sh "MODEL ..." [extra bouquet-bench options]
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd .carry/gpu || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/r/nvidia-smi.txt"
models=()
for m in $1; do models+=(--model "$m"); done
shift
python3 -m bouquet bench "${models[@]}" --device cuda --out "$OUT/r" --models-root /tmp/models \
  --tokenizer bench/assets/tokenizer.json --commit "$(cat COMMIT)" "$@" 2>&1 | grep -v 'httpx: HTTP Request' | tee "$OUT/r/log.txt"
