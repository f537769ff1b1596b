"""Batch-1 layers made of Triton kernels only, so that every launch takes programmatic dependent
launch (issue 14): the qkv and MLP-in GEMMs of small steps in Triton (``Engine(small_gemms=True)``,
fused_gemms.small_linear / small_gate_up_act) instead of cuBLAS, with and without PDL for the
kernels that follow them whatever their grid (``pdl.MAX_PROGRAMS``).

Usage (GPU): python3 bench/probes/small_pdl_probe.py OUT.json [--models-root DIR] [--lengths 16,64,128]
[--variants cublas,small,small-all]

Variants: ``cublas`` (the engine as it ships: cuBLAS qkv / MLP-in), ``small`` (Triton GEMMs, PDL
rule unchanged), ``small-all`` (Triton GEMMs, every Triton kernel with PDL: MAX_PROGRAMS huge),
``cublas-all`` (cuBLAS, every Triton kernel with PDL); a ``-nopf`` suffix: without the GEMMs'
L2 prefetch of their weights before the PDL wait (``pdl.PREFETCHES`` empty). Qwen3-0.6B and bge-base (random weights,
bf16), each variant's engine built in turn and alone, two rounds: GPU ms per batch-1 graph replay,
``step().wait()`` p50 (spin wait, as the bench's engine), kernels per replay, and the cosine of
the vectors to the first variant's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.pdl_probe import kernels_per_replay  # noqa: E402
from bench.probes.probe_kernels import b1_timings, variant_parser  # noqa: E402
from bouquet.engine import pdl  # noqa: E402


def main() -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    ap = variant_parser("16,64,128", "cublas,small,small-all")
    a = ap.parse_args()
    lengths = [int(v) for v in a.lengths.split(",")]
    variants = a.variants.split(",")
    keep, keep_pf = pdl.MAX_PROGRAMS, pdl.PREFETCHES
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "pdl": pdl.supported(0)}
    for name in a.models.split(","):
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root))))
        outs: dict = {}
        for rnd in range(2):
            for v in variants:
                pdl.MAX_PROGRAMS = 1 << 30 if "-all" in v else keep  # read at each launch (captures keep it)
                pdl.PREFETCHES = frozenset() if v.endswith("-nopf") else keep_pf
                eng = Engine(spec, "cuda", "bfloat16", spin_wait=True, small_gemms=v.startswith("small"))
                eng.warmup()
                for L in lengths:
                    out, replay, step, gr = b1_timings(eng, L, 300, 400)
                    outs.setdefault(L, {})[v] = out
                    R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append([v, replay])
                    R.setdefault(f"{name}/b1_L{L}_step_p50_ms", []).append([v, step])
                    if rnd == 0:
                        R[f"{name}/b1_L{L}_kernels/{v}"] = kernels_per_replay(gr.replay)
                del eng
                torch.cuda.empty_cache()
        for L, o in outs.items():
            x = np.asarray(o[variants[0]], dtype=np.float64)
            for v, y in o.items():
                y = np.asarray(y, dtype=np.float64)
                R[f"{name}/b1_L{L}_cosine/{v}"] = float((x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y))
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    pdl.MAX_PROGRAMS, pdl.PREFETCHES = keep, keep_pf


if __name__ == "__main__":
    main()
