#!/usr/bin/env bash
# One device call for issue 14's attention and batch-1 work (session of 2026-12-01), bundled as $OUT/r.tgz:
#   tests  GPU tests: tests/test_gpu_attention.py (Triton varlen kernel), test_gpu_fastpath.py
#          (graph == eager for every bucket), test_gpu_fp8.py;
#   bench  `bouquet bench` engine (Triton kernel for unequal lengths) beside engine-fa2 (FlashAttention-2,
#          the previous path) and engine-fp8, Qwen3-0.6B and bge-base, benchmarks 1, 2, 3, mixed;
#   acc    bench/fp8_accuracy_gpu.py: the real MiniLM on STSb and random Qwen3/bge, fp8 vs references;
#   kinds  bench/probes/fp8_kinds_probe.py: cosine and step time per set of fp8 matmuls;
#   prof   bench/probes/profile_gpu.py --variants fused: kernels per batch-1 replay, top kernels;
#   probe  bench/probes/issue14_probe.py --parts tattn step (attention tiles, mixed-step kernel split);
#   aq     bench/probes/act_quant_probe.py: the activation + fp8 cast kernel now vs at 1bc3035;
#   host   bench/probes/host_step_probe.py: eager launch time vs GPU time of 16k-token steps, graphs to 16,384;
#   blas   bench/probes/blas_probe.py: cuBLAS vs cuBLASLt for the bf16 linears at small M, and batch-1 replays.
#   splitk bench/probes/splitk_probe.py: split-K Triton GEMM vs cuBLAS at batch 1 (plans, with the norm reader, engines); SPLITK_ARGS.
#   fmlp   bench/probes/fused_gemms_probe.py: Triton GEMMs with fused epilogues vs cuBLAS + the elementwise kernel; FMLP_ARGS.
#   b1fuse bench/probes/b1_fusion_probe.py: the gated activation in the split-K down GEMM's A loads vs activation + split-K; B1FUSE_ARGS.
#   single bench/probes/attn_single_probe.py: the one-sequence attention tile in whole engines, before / after.
#   long   bench/probes/attn_long_single_probe.py: one long causal sequence, Triton vs cuDNN (exact and padded).
#   b1host bench/probes/b1_host_probe.py: where a batch-1 step's host time goes (pieces of Engine.step, a trace).
#   spdl   bench/probes/small_pdl_probe.py: batch-1 layers of Triton kernels only (small qkv / MLP-in GEMMs) with PDL; SPDL_ARGS.
#   tl     bench/probes/timeline_probe.py: one batch-1 replay's kernels charged the time each adds to its end,
#          per L2-prefetch variant; TL_ARGS.
#   pdl    bench/probes/pdl_probe.py: programmatic dependent launch off / on / on + split-K prefetch, in one process; PDL_ARGS.
#   anat   bench/probes/step_anatomy_probe.py: a batch-1 step's wall time against its replay, piece by piece; ANAT_ARGS.
#   tiles  bench/probes/small_tiles_probe.py: 128-row tiles for the batch-1 Triton GEMMs above 64 tokens; TILES_ARGS.
#   ab     `bouquet bench AB_ARGS` for the tree in .carry/base.tgz (`git archive BASE | gzip`, unpacked to /tmp/base and
#          run from there) and this tree in turn, AB_ROUNDS (2) rounds: each in a process of its own (AB_TAG names the runs).
#   http   `bouquet bench` over HTTP (Qwen3-0.6B, bouquet serve with 4 gateway workers, real text in benchmark 4):
#          http beside http-cublas (serve --no-triton-gemms), benchmarks HTTP_BENCHMARKS (2,3,mixed,4).
# BENCH_MODELS / BENCH_BENCHMARKS / LAT narrow the bench step (default both models, 1,2,3,mixed; 128,512).
# TESTS overrides the GPU test files; KINDS_SHAPES the kinds probe's shapes; ACC_ARGS is appended to the
# accuracy script's arguments (e.g. --encoder-kinds qkv,up,down); HOST_SHAPES the host probe's shapes.
# Run through the wrapper: bash bench/gpu.sh bash bench/issue14_gpu.sh  (carry .whl, .carry/minilm-bf16, COMMIT)
# STEPS (default "tests bench prof") picks a subset; SYSTEMS overrides the bench systems; SEPARATE=1
# runs each system in a bench process of its own.
set -u
R="$OUT/r"
mkdir -p "$R"
STEPS=${STEPS:-tests bench prof}
M=/tmp/bench-models
has() { [[ " $STEPS " == *" $1 "* ]]; }
bundle() { tar czf "$OUT/r.tgz" -C "$OUT" r; }  # after every step: a call cut off at its limit still returns what ran
if has tests; then
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_gpu_attention.py tests/test_gpu_fastpath.py \
    tests/test_gpu_fp8.py} > "$R/gpu-tests.txt" 2>&1
  tail -5 "$R/gpu-tests.txt"
  bundle
fi
if has bench; then
  # SEPARATE=1: one bench process per system (a later engine in the same process measured up to
  # 0.25 ms slower at batch 1 on the same computation: bench/results/h200-2026-12-01b/README.md)
  systems=${SYSTEMS:-engine engine-fa2 engine-fp8}
  if [ "${SEPARATE:-0}" = 1 ]; then runs=$systems; else runs="all"; fi
  for run in $runs; do
    sys=""
    for s in $( [ "$run" = all ] && echo $systems || echo $run ); do sys="$sys --system $s"; done
    out="$R/bench"; [ "$run" = all ] || out="$R/bench-$run"
    models=""; for m in ${BENCH_MODELS:-qwen3-0.6b bge-base}; do models="$models --model $m"; done
    timeout 480 python3 -m bouquet bench $models $sys \
      --device cuda --models-root $M --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --lat-lengths ${LAT:-128,512} \
      --thr-lengths 512,1024 --score-batches 5,25 --benchmarks ${BENCH_BENCHMARKS:-1,2,3,mixed} --out "$out" > "$out.log" 2>&1
    grep -h "^| b\|cosine" "$out/results.md" | head -40
    bundle
  done
fi
if has kinds; then
  timeout 200 python3 bench/probes/fp8_kinds_probe.py "$R/kinds.json" --models-root $M ${KINDS_SHAPES:+--shapes $KINDS_SHAPES} > "$R/kinds.log" 2>&1
  tail -n 20 "$R/kinds.log"
  bundle
fi
if has acc; then
  timeout 200 python3 bench/fp8_accuracy_gpu.py "$R/accuracy.json" $M/qwen3-0.6b $M/bge-base ${ACC_ARGS:-} > "$R/accuracy.log" 2>&1
  tail -c 1500 "$R/accuracy.log"
  bundle
fi
if has prof; then
  timeout 200 python3 bench/probes/profile_gpu.py "$R/prof" --shapes qwen3-0.6b bge-base --variants ${PROF_VARIANTS:-fused} --models-root $M > "$R/prof.log" 2>&1
  grep -h "kernels\|emb_per_s\|replay_gpu" "$R/prof/profile.txt" | head -30
  bundle
fi
if has probe; then
  timeout 200 python3 bench/probes/issue14_probe.py "$R/probe.json" --parts tattn step --models-root $M > "$R/probe.log" 2>&1
  tail -c 3000 "$R/probe.log"
  bundle
fi
if has aq; then
  timeout 120 python3 bench/probes/act_quant_probe.py "$R/act_quant.json" > "$R/act_quant.log" 2>&1
  tail -n 8 "$R/act_quant.log"
  bundle
fi
if has host; then
  timeout 420 python3 bench/probes/host_step_probe.py "$R/host.json" --models-root $M ${HOST_SHAPES:+--shapes $HOST_SHAPES} > "$R/host.log" 2>&1
  grep -v "^ " "$R/host.log" | tail -n 30
  bundle
fi
if has blas; then
  timeout 300 python3 bench/probes/blas_probe.py "$R/blas.json" --models-root $M > "$R/blas.log" 2>&1
  tail -n 40 "$R/blas.log"
  bundle
fi
bundle
if has splitk; then
  timeout 400 python3 bench/probes/splitk_probe.py "$R/splitk.json" --models-root $M ${SPLITK_ARGS:-} > "$R/splitk.log" 2>&1
  tail -n 60 "$R/splitk.log"
  bundle
fi
if has fmlp; then
  timeout 300 python3 bench/probes/fused_gemms_probe.py "$R/fused_gemms.json" ${FMLP_ARGS:-} > "$R/fused_gemms.log" 2>&1
  tail -n 14 "$R/fused_gemms.log"
  bundle
fi
if has b1fuse; then
  timeout 200 python3 bench/probes/b1_fusion_probe.py "$R/b1_fusion.json" ${B1FUSE_ARGS:-} > "$R/b1_fusion.log" 2>&1
  tail -n 8 "$R/b1_fusion.log"
  bundle
fi
if has single; then
  timeout 300 python3 bench/probes/attn_single_probe.py "$R/attn_single.json" --models-root $M > "$R/attn_single.log" 2>&1
  tail -n 4 "$R/attn_single.log"
  bundle
fi
if has b1host; then
  timeout 300 python3 bench/probes/b1_host_probe.py "$R/b1_host.json" --models-root $M ${B1HOST_ARGS:-} > "$R/b1_host.log" 2>&1
  grep -v "^Writing\|it/s" "$R/b1_host.log" | tail -c 3000
  bundle
fi
if has pdl; then
  timeout ${PDL_TIMEOUT:-400} python3 bench/probes/pdl_probe.py "$R/pdl.json" --models-root $M ${PDL_ARGS:-} > "$R/pdl.log" 2>&1
  tail -c 4000 "$R/pdl.log"
  bundle
fi
if has spdl; then
  timeout ${SPDL_TIMEOUT:-400} python3 bench/probes/small_pdl_probe.py "$R/small_pdl.json" --models-root $M ${SPDL_ARGS:-} > "$R/small_pdl.log" 2>&1
  grep -v "^Writing\|it/s" "$R/small_pdl.log" | tail -c 5000
  bundle
fi
if has tl; then
  timeout ${TL_TIMEOUT:-400} python3 bench/probes/timeline_probe.py "$R/timeline.json" --models-root $M ${TL_ARGS:-} > "$R/timeline.log" 2>&1
  grep -v "^Writing\|it/s" "$R/timeline.log" | tail -c 4000
  bundle
fi
if has long; then
  timeout 200 python3 bench/probes/attn_long_single_probe.py "$R/attn_long_single.json" > "$R/attn_long_single.log" 2>&1
  tail -n 8 "$R/attn_long_single.log"
  bundle
fi
if has http; then
  timeout 450 python3 -m bouquet bench --model qwen3-0.6b --system http --system http-cublas --device cuda --models-root $M \
    --seconds "${SECONDS_PER_CASE:-1.5}" --warmup-seconds 0.5 --score-batches 5,25 --thr-lengths 512 --concurrency 1,16 \
    --benchmarks ${HTTP_BENCHMARKS:-2,3,mixed,4} --gateway-workers 4 --out "$R/http" > "$R/http.log" 2>&1
  grep -h "^| " "$R/http/results.md" | head -40
  bundle
fi
if has anat; then
  timeout ${ANAT_TIMEOUT:-300} python3 bench/probes/step_anatomy_probe.py "$R/anatomy.json" --models-root $M ${ANAT_ARGS:-} > "$R/anatomy.log" 2>&1
  grep -v "^Writing\|it/s" "$R/anatomy.log" | tail -c 5000
  bundle
fi
if has tiles; then
  timeout ${TILES_TIMEOUT:-420} python3 bench/probes/small_tiles_probe.py "$R/small-tiles.json" --models-root $M ${TILES_ARGS:-} > "$R/small-tiles.log" 2>&1
  tail -n 24 "$R/small-tiles.log"
  bundle
fi
if has ab; then
  mkdir -p /tmp/base && tar xzf .carry/base.tgz -C /tmp/base
  for round in $(seq ${AB_ROUNDS:-2}); do
    for tree in base new; do
      out="$R/ab${AB_TAG:-}-$tree$round"
      if [ $tree = base ]; then
        (cd /tmp/base && PYTHONPATH=/tmp/base:/tmp/site:/tmp/shim timeout ${AB_TIMEOUT:-300} python3 -m bouquet bench $AB_ARGS \
          --models-root $M --out "$out" > "$out.log" 2>&1)
      else
        timeout ${AB_TIMEOUT:-300} python3 -m bouquet bench $AB_ARGS --models-root $M --out "$out" > "$out.log" 2>&1
      fi
      echo "== $tree $round"; grep -h "^| " "$out/results.md" | head -24
      bundle
    done
  done
fi
