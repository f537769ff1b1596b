#!/usr/bin/env bash
# Issue 13's serving-path figures on the H200, part 2: the Qwen3-0.6B shape, benchmarks 1, 3 and 4,
# engine beside HTTP (one device call, ~4 minutes):  bash bench/gpu.sh bash bench/serving_gpu_qwen3.sh
set -o pipefail
O=${OUT:-bench/out}
mkdir -p "$O"
timeout 400 python3 -m bouquet bench --model qwen3-0.6b --system engine --system http --benchmarks 1,3,4 \
  --device cuda --lat-lengths 128,512 --thr-lengths 512 --concurrency 1,16 --seconds 3 --gateway-workers 12 \
  --out "$O/qwen3" --models-root /tmp/models 2>&1 | grep -v 'httpx: HTTP Request' | tail -40
