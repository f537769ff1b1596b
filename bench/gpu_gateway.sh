#!/usr/bin/env bash
# Issue #4 on a lent H200, from the device checkout's root with carry [".carry/gpu", ".whl"]
# (tree from `bash bench/prepare_carry.sh`):
#   bash .carry/gpu/bench/gpu_gateway.sh [tokens] [options]   # (b): text through the gateway vs the
#        bare engine, bench/gateway_tokens_gpu.py → $OUT/g/gateway-tokens.{json,log}, ~1.5 min
#   bash .carry/gpu/bench/gpu_gateway.sh overhead [options]    # (a) on the host's CPUs (no GPU
#        used): bench/gateway_overhead.py → $OUT/g/gateway-overhead-host.{json,md}, ~1 min
set -o pipefail
source "$(dirname "$0")/gpu_setup.sh"
mkdir -p "$OUT/g"
cp COMMIT "$OUT/g/COMMIT.txt" 2>/dev/null
mode=${1:-tokens}
[ $# -gt 0 ] && shift
if [ "$mode" = overhead ]; then
  timeout ${GATEWAY_S:-140} python3 bench/gateway_overhead.py --random-model --seconds 5 --warmup 1 \
    --out "$OUT/g/gateway-overhead-host" "$@" 2>&1 | tail -40 | tee "$OUT/g/gateway-overhead-host.log"
else
  timeout ${GATEWAY_S:-140} python3 bench/gateway_tokens_gpu.py "$OUT/g/gateway-tokens.json" --work-dir /tmp/gw-tokens "$@" \
    2>&1 | tail -60 | tee "$OUT/g/gateway-tokens.log"
  cp /tmp/gw-tokens/serve.log "$OUT/g/serve.log" 2>/dev/null
fi
exit 0
