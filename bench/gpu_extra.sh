#!/usr/bin/env bash
# Second call of a GPU session (after bench/gpu_run.sh): the full-size model check against
# transformers, the batch-embedding job vs the bare engine, and 1 vs 2 replicas (needs 2 GPUs).
# Run from the device checkout's root with carry [".carry/gpu", ".whl"]:
#   bash .carry/gpu/bench/gpu_extra.sh        → $OUT/x/*.json, *.log
set -o pipefail
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/x"
cp COMMIT "$OUT/x/COMMIT.txt" 2>/dev/null
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUT/x/nvidia-smi.txt"
timeout ${MODELS_S:-150} python3 bench/gpu_models_check.py "$OUT/x/models-check.json" 2>&1 | tail -40 | tee "$OUT/x/models-check.log"
timeout ${EMBED_S:-180} python3 bench/embed_gpu.py "$OUT/x/embed-gpu.json" --tokenizer-threads 4 2>&1 | tail -40 | tee "$OUT/x/embed-gpu.log"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  timeout ${REPLICAS_S:-200} python3 bench/replicas_gpu.py "$OUT/x/replicas-gpu.json" --seconds 20 --warmup 10 2>&1 | tail -40 | tee "$OUT/x/replicas-gpu.log"
fi
