"""Measure one sequence's attention choices in whole engines: the tile above 128 tokens
(attention.TRITON_SINGLE_CONFIGS) and cuDNN for a causal one above CUDNN_SINGLE_MIN_TOKENS rows.

Usage (GPU): python3 bench/probes/attn_single_probe.py OUT.json [--models-root DIR] [--lengths 16,128,512,2048]

The tile sweeps of bench/results/h200-2026-12-01 (calls 3 and 9) timed the attention kernel alone:
for one sequence, 64-key blocks beat the shipped 32-key ones for every model at 128 and 512 tokens.
Here Qwen3-0.6B and bge-base engines (random weights) are built as before both ("before": the
multi-sequence tiles for one sequence too, the Triton kernel at every length) and as now ("single"),
alternately, twice, in one process: batch-1 graph replays (GPU ms) and end-to-end step p50 (pack, copy in, replay, copy out),
the vectors of both compared.
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
from bouquet.engine import attention  # noqa: E402


def main() -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--lengths", default="16,128,512,2048,4096", help="batch-1 lengths (bge-base: those ≤ 512)")
    a = ap.parse_args()
    lengths = [int(v) for v in a.lengths.split(",")]
    single, cudnn_min = dict(attention.TRITON_SINGLE_CONFIGS), attention.CUDNN_SINGLE_MIN_TOKENS
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "single": str(single),
               "before": str(attention.TRITON_ATTN_CONFIGS)}
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root))))
        outs: dict = {}
        for tag in ("before", "single", "before", "single"):
            attention.TRITON_SINGLE_CONFIGS.clear()
            attention.TRITON_SINGLE_CONFIGS.update(single if tag == "single" else attention.TRITON_ATTN_CONFIGS)
            attention.CUDNN_SINGLE_MIN_TOKENS = cudnn_min if tag == "single" else 1 << 30
            eng = Engine(spec, "cuda", "bfloat16", spin_wait=True)  # the bench's engine
            eng.warmup()
            for L in (n for n in lengths if n <= spec.max_seq_length):
                out, replay, step, _ = b1_timings(eng, L)
                outs.setdefault(L, {})[tag] = out
                R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append([tag, replay])
                R.setdefault(f"{name}/b1_L{L}_step_p50_ms", []).append([tag, step])
            del eng
            torch.cuda.empty_cache()
        for L, o in outs.items():
            x, y = np.asarray(o["before"], dtype=np.float64), np.asarray(o["single"], dtype=np.float64)
            R[f"{name}/b1_L{L}_cosine"] = float((x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y))
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    attention.TRITON_SINGLE_CONFIGS.clear()
    attention.TRITON_SINGLE_CONFIGS.update(single)
    attention.CUDNN_SINGLE_MIN_TOKENS = cudnn_min


if __name__ == "__main__":
    main()
