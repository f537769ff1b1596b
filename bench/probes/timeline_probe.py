"""Batch-1 replays per variant, and where a replay's time goes when kernels overlap (issue 14):
with programmatic dependent launch a kernel's programs start before its predecessor ends, so kernel durations overlap and
their sum says little. This probe takes one graph replay's kernels from the profiler (CUPTI start
and end times) in stream order and charges each kernel the time it adds to the replay's end:
``end_i − end_{i−1}``, summed per kernel name. Also the summed durations and the mean start gap.

Usage (GPU): python3 bench/probes/timeline_probe.py OUT.json [--models-root DIR] [--lengths 16,128]
[--models qwen3-0.6b,bge-base] [--variants both,none,splitk,small]

Variants choose which weight-streaming kernels prefetch their slab into L2 before the PDL wait
(``pdl.PREFETCHES``): ``both`` (as shipped), ``none``, ``splitk`` only, ``small`` (the small GEMMs)
only, ``ungated`` (all but the gated gate/up GEMM); ``+nolimit``: whatever the weight's size
(``pdl.PREFETCH_MAX_BYTES``); ``+skN``: split-K GEMMs up to N tokens (``splitk.MAX_TOKENS``).
The per-kernel timeline is taken with ``--timeline`` only (round 1).
Engines are built in turn, one alive at a time, random full-size weights, bf16, Triton GEMMs on.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import b1_timings, variant_parser  # noqa: E402
from bouquet.engine import pdl, splitk  # noqa: E402

_SETS = {"both": frozenset({"splitk", "small_gemm", "small_gated"}), "none": frozenset(),
         "splitk": frozenset({"splitk"}), "small": frozenset({"small_gemm", "small_gated"}),
         "ungated": frozenset({"splitk", "small_gemm"})}


def _short(name: str) -> str:
    for k in ("small_gemm", "splitk_gemm", "add_rms", "add_ln", "qk_norm_rope", "varlen_attn", "gated_act",
              "act_quant", "rms", "layer_norm"):
        if k in name:
            return k
    return "cublas_gemm" if ("gemm" in name or "nvjet" in name or "xmma" in name) else name[:48]


def timeline(replay) -> dict:  # type: ignore[no-untyped-def]
    """Per kernel name of one ``replay()``: [calls, µs added to the end, µs of summed durations];
    and the replay's span (µs, first start to last end)."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name))
    rows: dict[str, list] = {}
    prev_end = ks[0][0]
    gaps = []
    for start, end, name in ks:
        r = rows.setdefault(_short(name), [0, 0.0, 0.0])
        r[0] += 1
        r[1] += max(0.0, end - prev_end)
        r[2] += end - start
        gaps.append(start - prev_end)
        prev_end = max(prev_end, end)
    out = {k: [v[0], round(v[1], 2), round(v[2], 2)] for k, v in sorted(rows.items(), key=lambda kv: -kv[1][1])}
    return {"span_us": round(ks[-1][1] - ks[0][0], 2), "kernels": len(ks),
            "mean_start_gap_us": round(sum(gaps) / len(gaps), 3), "by_kernel": out}


def main() -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    ap = variant_parser("16,128", "both,none,splitk,small")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeline", action="store_true")
    a = ap.parse_args()
    keep = pdl.PREFETCHES, pdl.PREFETCH_MAX_BYTES, splitk.MAX_TOKENS
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "pdl": pdl.supported(0)}
    for name in a.models.split(","):
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root))))
        for rnd in range(a.rounds):
            for v in a.variants.split(","):
                pf, *mods = v.split("+")
                pdl.PREFETCHES = _SETS[pf]  # read at each launch; captures keep what they saw
                pdl.PREFETCH_MAX_BYTES = 1 << 40 if "nolimit" in mods else keep[1]
                splitk.MAX_TOKENS = next((int(m[2:]) for m in mods if m.startswith("sk")), keep[2])
                splitk.plan_for.cache_clear()
                eng = Engine(spec, "cuda", "bfloat16", spin_wait=True, small_gemms=True)
                eng.warmup()
                for L in (int(x) for x in a.lengths.split(",")):
                    _, replay, step, gr = b1_timings(eng, L, 300, 300)
                    R.setdefault(f"{name}/L{L}/replay_ms", []).append([v, replay])
                    R.setdefault(f"{name}/L{L}/step_p50_ms", []).append([v, step])
                    if rnd == 0 and a.timeline:
                        R[f"{name}/L{L}/timeline/{v}"] = timeline(gr.replay)
                del eng
                torch.cuda.empty_cache()
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name) and "timeline" not in k}), flush=True)
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    pdl.PREFETCHES, pdl.PREFETCH_MAX_BYTES, splitk.MAX_TOKENS = keep
    splitk.plan_for.cache_clear()


if __name__ == "__main__":
    main()
