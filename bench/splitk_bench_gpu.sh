#!/usr/bin/env bash
# Split-K on (engine, engine-fp8: the default on Hopper) beside cuBLAS (engine-cublas, engine-fp8-cublas),
# benchmark 1 (batch-1 latency) at 16 and 128 tokens, each system in a bench process of its own, plus
# the GPU tests that cover the path (graph == eager for every bucket now runs split-K by default).
# Run: bash bench/gpu.sh bash bench/splitk_bench_gpu.sh   (carry .whl, .carry/minilm-bf16, COMMIT)
set -u
R="$OUT/r"; mkdir -p "$R"; M=/tmp/bench-models
bundle() { tar czf "$OUT/r.tgz" -C "$OUT" r; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_splitk.py tests/test_gpu_fastpath.py tests/test_gpu_fp8.py \
    > "$R/gpu-tests.txt" 2>&1
  tail -3 "$R/gpu-tests.txt"; bundle
fi
for s in ${SYSTEMS:-engine engine-cublas engine-fp8 engine-fp8-cublas}; do
  timeout 200 python3 -m bouquet bench --model qwen3-0.6b --model bge-base --system $s --device cuda --models-root $M \
    --seconds "${SECONDS_PER_CASE:-2}" --warmup-seconds 0.5 --lat-lengths ${LAT:-16,128} --benchmarks 1 --out "$R/bench-$s" \
    > "$R/bench-$s.log" 2>&1
  grep -h "^| b" "$R/bench-$s/results.md" | head; bundle
done
