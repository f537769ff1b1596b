#!/usr/bin/env bash
# GPU profile call: fast-path tests, bench/profile_gpu.py (fused vs unfused), full-size models check.
# From the device checkout root with carry [".carry/gpu", ".whl"]: bash .carry/gpu/bench/gpu_prof.sh → $OUT/p/
set -o pipefail
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/p"
cp COMMIT "$OUT/p/COMMIT.txt"
(timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -15) | tee "$OUT/p/gpu-tests.txt"
timeout 200 python3 bench/profile_gpu.py "$OUT/p" 2>&1 | tail -60 > "$OUT/p/profile.log"
timeout ${MODELS_S:-150} python3 bench/gpu_models_check.py "$OUT/p/models-check.json" 2>&1 | tail -30 > "$OUT/p/models-check.log"
