#!/usr/bin/env bash
# Issue 13's serving-path figures on the H200, part 1 (one device call, ~8 minutes). Through the
# wrapper:  bash bench/gpu.sh bash bench/serving_gpu.sh     (carry: see bench/gpu.sh)
# MiniLM (real weights, bf16 copy): queries at 1/64/256 clients and bulk 8 × 256 texts; the no-op
# engine at 4 and 12 gateway workers (Unix-socket IPC) and over gRPC; bge-base shape: benchmarks
# 1, 3, mixed, 4 and 5, engine beside HTTP. Part 2 (Qwen3) is serving_gpu_qwen3.sh.
set -o pipefail
O=${OUT:-bench/out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$O/nvidia-smi.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py 2>&1 | tail -3 | tee "$O/gpu-tests.txt"
timeout 160 python3 bench/queries_sweep.py --device cuda --layout 12:2:auto --layout 12:1:auto --clients 1,64,256 \
  --seconds 4 --out "$O/minilm" 2>&1 | grep -v '^{'
timeout 60 python3 bench/queries_sweep.py --device cuda --layout 12:2:auto --clients 8 --batch 256 --seconds 4 \
  --out "$O/minilm-bulk" 2>&1 | grep -v '^{'
timeout 150 python3 bench/queries_sweep.py --engine noop --device cuda --layout 4:1:auto --layout 12:1:auto \
  --layout 12:2:auto --layout 12:1:grpc --clients 1,64,256 --seconds 3 --out "$O/noop" 2>&1 | grep -v '^{'
timeout 200 python3 -m bouquet bench --model bge-base --system engine --system http --benchmarks 1,3,mixed,4,5 \
  --device cuda --lat-lengths 128,512 --thr-lengths 512 --concurrency 1,16 --query-clients 64,256 --seconds 3 \
  --gateway-workers 12 --out "$O/bge" --models-root /tmp/models 2>&1 | grep -v 'httpx: HTTP Request' | tail -40
