#!/usr/bin/env bash
# Issue #4 (b) on a lent H200: text through the HTTP gateway vs the bare engine, same tokens.
# Run from the device checkout's root with carry [".carry/gpu", ".whl"] (tree from
# `bash bench/prepare_carry.sh`):   bash .carry/gpu/bench/gpu_gateway.sh [more options]
# → $OUT/g/gateway-tokens.json, gateway-tokens.log (and the server's log on failure).
set -o pipefail
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/g"
cp COMMIT "$OUT/g/COMMIT.txt" 2>/dev/null
timeout ${GATEWAY_S:-140} python3 bench/gateway_tokens_gpu.py "$OUT/g/gateway-tokens.json" --work-dir /tmp/gw-tokens "$@" 2>&1 \
  | tail -60 | tee "$OUT/g/gateway-tokens.log"
cp /tmp/gw-tokens/serve.log "$OUT/g/serve.log" 2>/dev/null
exit 0
