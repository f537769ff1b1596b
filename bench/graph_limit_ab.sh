#!/usr/bin/env bash
# A/B on the GPU: served bge-base throughput (bench 3 and mixed, gRPC) with CUDA graphs up to
# 8,192 tokens (default) and up to 16,384 (the GPU token budget: every batch a replay).
# From the device checkout root, carry [".carry/gpu", ".whl"]: bash .carry/gpu/bench/graph_limit_ab.sh → $OUT/ab/
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/ab"
md=$(python3 -c "from bouquet.bench.models import SHAPES, make_model_dir; from pathlib import Path; print(make_model_dir(SHAPES['bge-base'], Path('/tmp/models'), Path('bench/assets/tokenizer.json')))" 2>/dev/null | tail -1)
for limit in ${LIMITS:-16384 8192}; do
  python3 -m bouquet server --port 50099 --model "$md" --device cuda --graph-max-tokens "$limit" --log-level warning > "$OUT/ab/server-$limit.log" 2>&1 &
  pid=$!
  timeout 150 python3 -m bouquet bench --model bge-base --system grpc --grpc-address 127.0.0.1:50099 --benchmarks 3,mixed \
    --seconds "${SECONDS_PER_CASE:-3}" --device cuda --models-root /tmp/models --tokenizer bench/assets/tokenizer.json \
    --commit "$(cat COMMIT)" --out "$OUT/ab/limit-$limit" > "$OUT/ab/bench-$limit.log" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null
  echo "== graph limit $limit"; grep "^| b" "$OUT/ab/limit-$limit/results.md"
done
