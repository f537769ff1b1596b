#!/usr/bin/env bash
# Issue 13's serving-path figures on the H200, part 2 (one device call, ~6 minutes):
#   bash bench/gpu.sh bash bench/serving_gpu_part2.sh
# Qwen3-0.6B shape: benchmarks 1, 3 and 4, engine beside HTTP; bge-base: benchmark 1 again with the
# httptools benchmark client; MiniLM queries with 8 gateway workers × 2 replicas.
set -o pipefail
O=${OUT:-bench/out}
mkdir -p "$O"
timeout 300 python3 -m bouquet bench --model qwen3-0.6b --system engine --system http --benchmarks 1,3,4 \
  --device cuda --lat-lengths 128,512 --thr-lengths 512 --concurrency 1,16 --seconds 3 --gateway-workers 12 \
  --out "$O/qwen3" --models-root /tmp/models 2>&1 | grep -v 'httpx: HTTP Request' | grep -A40 '^## '
timeout 120 python3 -m bouquet bench --model bge-base --system engine --system http --benchmarks 1 \
  --device cuda --lat-lengths 128,512 --seconds 3 --gateway-workers 12 \
  --out "$O/bge-b1" --models-root /tmp/models 2>&1 | grep -v 'httpx: HTTP Request' | grep -A12 '^### '
timeout 100 python3 bench/queries_sweep.py --device cuda --layout 8:2:auto --clients 1,64,256 --seconds 4 \
  --out "$O/minilm-8w" 2>&1 | grep '^|'
