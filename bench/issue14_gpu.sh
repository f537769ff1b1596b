#!/usr/bin/env bash
# One device call for issue 14's attention and batch-1 work (session of 2026-12-01), bundled as $OUT/r.tgz:
#   tests  GPU tests: tests/test_gpu_attention.py (Triton varlen kernel), test_gpu_fastpath.py
#          (graph == eager for every bucket), test_gpu_fp8.py;
#   bench  `bouquet bench` engine (Triton kernel for unequal lengths) beside engine-fa2 (FlashAttention-2,
#          the previous path) and engine-fp8, Qwen3-0.6B and bge-base, benchmarks 1, 2, 3, mixed;
#   nopdl  the same bench, benchmarks 1 and 2 only, with programmatic dependent launch off
#          (bench/probes/no_pdl.py; SYSTEMS_NOPDL, default "engine engine-fp8"): PDL's baseline;
#   kinds  bench/probes/fp8_kinds_probe.py: cosine and step time per set of fp8 matmuls;
#   prof   bench/probes/profile_gpu.py --variants fused: kernels per batch-1 replay, top kernels;
#   probe  bench/probes/issue14_probe.py --parts tattn step (attention tiles, mixed-step kernel split).
# Run through the wrapper: bash bench/gpu.sh bash bench/issue14_gpu.sh  (carry .whl, .carry/minilm-bf16, COMMIT)
# STEPS (default "tests bench prof") picks a subset; SYSTEMS overrides the bench systems.
set -u
R="$OUT/r"
mkdir -p "$R"
STEPS=${STEPS:-tests bench prof}
M=/tmp/bench-models
has() { [[ " $STEPS " == *" $1 "* ]]; }
bundle() { tar czf "$OUT/r.tgz" -C "$OUT" r; }  # after every step: a call cut off at its limit still returns what ran
if has tests; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_attention.py tests/test_gpu_fastpath.py \
    tests/test_gpu_fp8.py > "$R/gpu-tests.txt" 2>&1
  tail -5 "$R/gpu-tests.txt"
  bundle
fi
if has bench; then
  sys=""
  for s in ${SYSTEMS:-engine engine-fa2 engine-fp8}; do sys="$sys --system $s"; done
  timeout 480 python3 -m bouquet bench --model qwen3-0.6b --model bge-base $sys \
    --device cuda --models-root $M --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --lat-lengths 128,512 \
    --thr-lengths 512,1024 --score-batches 5,25 --benchmarks 1,2,3,mixed --out "$R/bench" > "$R/bench.log" 2>&1
  grep -h "^| \|cosine" "$R/bench/results.md" | head -70
  bundle
fi
if has nopdl; then
  sys=""
  for s in ${SYSTEMS_NOPDL:-engine engine-fp8}; do sys="$sys --system $s"; done
  timeout 300 python3 bench/probes/no_pdl.py bench --model qwen3-0.6b --model bge-base $sys \
    --device cuda --models-root $M --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --lat-lengths 128,512 \
    --score-batches 5,25 --benchmarks 1,2 --out "$R/nopdl" > "$R/nopdl.log" 2>&1
  grep -h "^| b" "$R/nopdl/results.md" | head -30
  bundle
fi
if has kinds; then
  timeout 200 python3 bench/probes/fp8_kinds_probe.py "$R/kinds.json" --models-root $M > "$R/kinds.log" 2>&1
  tail -n 20 "$R/kinds.log"
  bundle
fi
if has prof; then
  timeout 200 python3 bench/probes/profile_gpu.py "$R/prof" --shapes qwen3-0.6b bge-base --variants fused --models-root $M > "$R/prof.log" 2>&1
  grep -h "kernels\|emb_per_s\|replay_gpu" "$R/prof/profile.txt" | head -30
  bundle
fi
if has probe; then
  timeout 200 python3 bench/probes/issue14_probe.py "$R/probe.json" --parts tattn step --models-root $M > "$R/probe.log" 2>&1
  tail -c 3000 "$R/probe.log"
  bundle
fi
bundle
