#!/usr/bin/env bash
# One device call that checks a change to the engine on the H200 and records it:
#   1. the GPU tests (fused ops, graph == eager, graph counters, pooling/Dense in the graph);
#   2. bench/gpu_models_check.py: every model family at full size against transformers (bf16);
#   3. `bouquet bench` (engine system, benchmarks 1, 2, 3 and mixed) on bge-base for this tree and,
#      with BASE_TREE=DIR (an exported older tree, e.g. `git archive REV | tar -x -C DIR`), for that
#      tree in the same call: the before/after figures side by side;
#   4. benchmark 3 and mixed lengths for the encoder shapes in ENCODERS (default mpnet-base,
#      modernbert-base) next to bge-base.
# Run through the wrapper, which installs the carried wheels:
#   bash bench/gpu.sh bash bench/gpu_session_check.sh        (carry .whl, .carry/minilm-bf16 [, BASE_TREE])
# Everything lands in $OUT/r (logs, JSON, results.md; model folders in /tmp) and is bundled as $OUT/r.tgz.
set -u
R="$OUT/r"
mkdir -p "$R"
B=(--device cuda --system engine --models-root /tmp/bench-models --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --lat-lengths 128,512
   --thr-lengths 512,1024 --score-batches 5,25)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fastpath.py tests/test_st_modules.py > "$R/gpu-tests.txt" 2>&1
tail -3 "$R/gpu-tests.txt"
timeout 150 python3 bench/gpu_models_check.py "$R/models.json" > "$R/models.txt" 2>&1
cat "$R/models.txt" | tail -20
timeout 90 python3 -m bouquet bench --model bge-base "${B[@]}" --benchmarks 1,2,3,mixed --out "$R/bge-new" > "$R/bge-new.log" 2>&1
if [ -n "${BASE_TREE:-}" ]; then
  (cd "$BASE_TREE" && PYTHONPATH="$BASE_TREE:/tmp/site:/tmp/shim" timeout 90 python3 -m bouquet bench --model bge-base "${B[@]}" \
     --benchmarks 1,2,3,mixed --out "$R/bge-base-tree" > "$R/bge-base-tree.log" 2>&1)
fi
for m in ${ENCODERS:-mpnet-base modernbert-base}; do
  timeout 90 python3 -m bouquet bench --model "$m" "${B[@]}" --benchmarks 3,mixed --out "$R/$m" > "$R/$m.log" 2>&1
done
for f in "$R"/*/results.md; do echo "== $f"; cat "$f"; done > "$R/results-all.md" 2>/dev/null
grep -h "^| b" "$R/results-all.md"
# Only a few files come back from a device call: one bundle of the results (no model weights).
tar czf "$OUT/r.tgz" -C "$OUT" r
