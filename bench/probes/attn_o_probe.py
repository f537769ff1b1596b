"""Attention with the o projection in its epilogue (attn_o.py) in whole engines, before / after.

Usage (GPU): python3 bench/probes/attn_o_probe.py OUT.json [--models-root DIR] [--lengths 16,64,128]
             [--variants off,on,off,on,nc128,p4] [--models qwen3-0.6b,bge-base]

Engines (random full-size weights, bf16, split-K on) are built one at a time per variant, in the
order given: "off" (attention kernel, then the split-K o GEMM), "on" (the fused kernel with the
module's NC / MAX_PARTS), "nc128" (128 output columns per program), "p4" (at most 4 parts, so
more heads per program), "p16" (at most 16). Per batch-1 length: GPU ms per graph replay, step p50,
and each variant's vector's cosine against the first "off".
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import b1_timings  # noqa: E402
from bouquet.engine import attn_o  # noqa: E402

VARIANTS = {"off": {}, "on": {}, "nc128": {"NC": 128}, "p4": {"MAX_PARTS": 4}, "p16": {"MAX_PARTS": 16}}


def main() -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--lengths", default="16,64,128")
    ap.add_argument("--variants", default="off,on,off,on,nc128,p4")
    ap.add_argument("--models", default="qwen3-0.6b,bge-base")
    a = ap.parse_args()
    lengths = [int(v) for v in a.lengths.split(",")]
    defaults = {"NC": attn_o.NC, "MAX_PARTS": attn_o.MAX_PARTS}
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "defaults": defaults}
    for name in a.models.split(","):
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root))))
        ref: dict[int, np.ndarray] = {}
        for tag in a.variants.split(","):
            for key, value in {**defaults, **VARIANTS[tag]}.items():
                setattr(attn_o, key, value)
            eng = Engine(spec, "cuda", "bfloat16", spin_wait=True, fused_o=tag != "off")  # the bench's engine
            eng.warmup()
            for L in lengths:
                out, replay, step, _ = b1_timings(eng, L)
                x = np.asarray(out, dtype=np.float64).ravel()
                if L not in ref:
                    ref[L] = x
                cos = float(x @ ref[L] / np.linalg.norm(x) / np.linalg.norm(ref[L]))
                R.setdefault(f"{name}/L{L}", []).append({"variant": tag, "replay_ms": replay, "step_p50_ms": step,
                                                         "cosine": round(cos, 6)})
            del eng
            torch.cuda.empty_cache()
            print(name, tag, json.dumps({k: v[-1] for k, v in R.items() if k.startswith(name)}), flush=True)
            Path(a.out_json).write_text(json.dumps(R, indent=1))
    for key, value in defaults.items():
        setattr(attn_o, key, value)


if __name__ == "__main__":
    main()
