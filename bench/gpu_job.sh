#!/usr/bin/env bash
# GPU call for the batch job (issue #7), optionally after the fast-path tests and the full-size
# models check (CHECKS=1). From the device checkout root with carry [".carry/gpu", ".whl"]:
#   bash .carry/gpu/bench/gpu_job.sh → $OUT/j/   (ROWS, SWEEP, EMBED_S override the defaults)
set -o pipefail
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/j"
cp COMMIT "$OUT/j/COMMIT.txt"
if [ "${CHECKS:-1}" = 1 ]; then
  (timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -15) > "$OUT/j/gpu-tests.txt"
  timeout ${MODELS_S:-100} python3 bench/gpu_models_check.py "$OUT/j/models-check.json" 2>&1 | tail -8 > "$OUT/j/models-check.log"
fi
timeout ${EMBED_S:-200} python3 bench/embed_gpu.py "$OUT/j/embed.json" --rows ${ROWS:-100000} --noop ${SWEEP:---sweep-threads 2,8,16} 2>&1 | tail -30 > "$OUT/j/embed.log"
