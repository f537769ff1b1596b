#!/usr/bin/env bash
# The engine's Triton GEMMs on (engine, engine-fp8: the default on Hopper: split-K for steps up to 128
# tokens, gate/up + activation from 2,048) beside cuBLAS alone (engine-cublas, engine-fp8-cublas), each
# system in a bench process of its own, plus the GPU tests that cover both paths.
# Run: bash bench/gpu.sh bash bench/triton_gemms_bench_gpu.sh   (carry .whl, .carry/minilm-bf16, COMMIT)
# Env: SYSTEMS, MODELS (default "qwen3-0.6b bge-base"), BENCHMARKS (1), LAT (16,128), THR (512,1024),
# TESTS (the GPU test files; SKIP_TESTS=1 for none), SECONDS_PER_CASE (2).
set -u
R="$OUT/r"; mkdir -p "$R"; M=/tmp/bench-models
bundle() { tar czf "$OUT/r.tgz" -C "$OUT" r; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_gpu_splitk.py tests/test_gpu_fused_gemms.py \
    tests/test_gpu_fastpath.py tests/test_gpu_fp8.py} > "$R/gpu-tests.txt" 2>&1
  tail -3 "$R/gpu-tests.txt"; bundle
fi
models=""; for m in ${MODELS:-qwen3-0.6b bge-base}; do models="$models --model $m"; done
for s in ${SYSTEMS:-engine engine-cublas engine-fp8 engine-fp8-cublas}; do
  timeout 400 python3 -m bouquet bench $models --system $s --device cuda --models-root $M \
    --seconds "${SECONDS_PER_CASE:-2}" --warmup-seconds 0.5 --lat-lengths ${LAT:-16,128} --thr-lengths ${THR:-512,1024} \
    --benchmarks ${BENCHMARKS:-1} --out "$R/bench-$s" > "$R/bench-$s.log" 2>&1
  grep -h "^| b\|^| mixed" "$R/bench-$s/results.md" | head -20; bundle
done
