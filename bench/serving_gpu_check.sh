#!/usr/bin/env bash
# A short confirmation of issue 13's online-query figures on the H200 (one device call, ~4 minutes):
#   bash bench/gpu.sh bash bench/serving_gpu_check.sh
# MiniLM (real weights) at 1/64/256 clients with 2 and 4 replica processes, the no-op engine at 64
# clients in three layouts, bge-base benchmark 1 (batch 1, pre-tokenized) engine beside HTTP.
set -o pipefail
O=${OUT:-bench/out}
mkdir -p "$O"
timeout 170 python3 bench/queries_sweep.py --device cuda --layout 12:2:auto --layout 12:4:auto --clients 1,64,256 \
  --seconds 4 --out "$O/minilm" 2>&1 | grep '^|'
timeout 80 python3 bench/queries_sweep.py --engine noop --device cuda --layout 4:1:auto --layout 12:2:auto \
  --layout 12:4:auto --clients 64 --seconds 3 --out "$O/noop" 2>&1 | grep '^|'
timeout 100 python3 -m bouquet bench --model bge-base --system engine --system http --benchmarks 1 \
  --device cuda --lat-lengths 128 --seconds 3 --gateway-workers 12 \
  --out "$O/bge-b1" --models-root /tmp/models 2>&1 | grep -A6 '^### '
