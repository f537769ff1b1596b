#!/usr/bin/env bash
# One device call for issue 14 (fp8, batch 1, mixed lengths), bundled as $OUT/r.tgz:
#   1. GPU tests: tests/test_gpu_fp8.py (kernels, GEMM, models, graph == eager) + test_gpu_fastpath.py;
#   2. bench/probes/fp8_gemm_probe.py: the linears alone, bf16 vs fp8 (row-/tensor-wise) by token count;
#   3. `bouquet bench` engine vs engine-fp8, Qwen3-0.6B and bge-base, benchmarks 1, 2, 3, mixed;
#   4. bench/fp8_accuracy_gpu.py: real MiniLM on STSb (bf16, fp8 vs sentence-transformers fp32),
#      random full-size Qwen3-0.6B / bge-base fp8 vs bf16;
#   5. bench/probes/profile_gpu.py --variants fused fp8: kernels per batch-1 replay, top kernels.
# Run through the wrapper: bash bench/gpu.sh bash bench/fp8_gpu_check.sh  (carry .whl, .carry/minilm-bf16)
# STEPS (default "tests gemm bench acc prof") picks a subset.
set -u
R="$OUT/r"
mkdir -p "$R"
STEPS=${STEPS:-tests gemm bench acc prof}
M=/tmp/bench-models
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has tests; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fp8.py tests/test_gpu_fastpath.py > "$R/gpu-tests.txt" 2>&1
  tail -5 "$R/gpu-tests.txt"
fi
if has gemm; then
  timeout 150 python3 bench/probes/fp8_gemm_probe.py "$R/gemm.json" > "$R/gemm.log" 2>&1; tail -16 "$R/gemm.log"
fi
if has bench; then
  timeout 420 python3 -m bouquet bench --model qwen3-0.6b --model bge-base --system engine --system engine-fp8 \
    --device cuda --models-root $M --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --lat-lengths 128,512 \
    --thr-lengths 512,1024 --score-batches 5,25 --benchmarks 1,2,3,mixed --out "$R/bench" > "$R/bench.log" 2>&1
  grep -h "^| \|cosine\|fp8" "$R/bench/results.md" | head -60
fi
if has acc; then
  timeout 200 python3 bench/fp8_accuracy_gpu.py "$R/accuracy.json" $M/qwen3-0.6b $M/bge-base > "$R/accuracy.log" 2>&1
  tail -30 "$R/accuracy.log"
fi
if has prof; then
  timeout 200 python3 bench/probes/profile_gpu.py "$R/prof" --shapes qwen3-0.6b bge-base --variants fused fp8 --models-root $M > "$R/prof.log" 2>&1
  grep -h "kernels\|emb_per_s\|replay_gpu" "$R/prof/profile.txt" | head -30
fi
tar czf "$OUT/r.tgz" -C "$OUT" r
