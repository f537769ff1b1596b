"""cuBLAS or cuBLASLt for the engine's bf16 linears at small M (issue 14, batch 1): which is faster?

Usage (GPU): python3 bench/probes/blas_probe.py OUT.json [--models-root DIR]

PyTorch sends a bf16 ``F.linear`` without bias to cuBLAS by default and one with bias to cuBLASLt
(its bias epilogue); ``torch.backends.cuda.preferred_blas_library`` moves the first kind too. For
Qwen3-0.6B's four linears (no bias) and bge-base's (bias) at M = 128, 512, 2,560 and 16,384 tokens,
GPU ms per call with each preference (20 calls captured in one CUDA graph); then the whole batch-1
graph replay (128 and 512 tokens) of an engine built under each preference.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.act_quant_probe import graph_ms  # noqa: E402
from bench.probes.probe_kernels import gpu_ms  # noqa: E402

SHAPES = {"qwen3": [("qkv", 1024, 4096), ("o", 2048, 1024), ("gate_up", 1024, 6144), ("down", 3072, 1024)],
          "bge": [("qkv", 768, 2304), ("o", 768, 768), ("up", 768, 3072), ("down", 3072, 768)]}


def linears() -> dict:
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for model, shapes in SHAPES.items():
        for name, k, n in shapes:
            w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) * 0.02
            b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16) if model == "bge" else None
            for m in (128, 512, 2560, 16384):
                x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
                row = {}
                for lib in ("cublas", "cublaslt"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    row[lib] = round(graph_ms(lambda: F.linear(x, w, b)) * 1e3, 2)  # µs
                torch.backends.cuda.preferred_blas_library("default")
                row["weight_GBps_cublas"] = round(n * k * 2 / row["cublas"] / 1e3, 1)
                R[f"{model}/{name}/M{m}_us"] = row
                print(model, name, m, row, flush=True)
    return R


def engines(root: Path) -> dict:
    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(MODEL_SHAPES[name], root)))
        rng = np.random.default_rng(0)
        for lib in ("cublas", "cublaslt", "cublas"):
            torch.backends.cuda.preferred_blas_library(lib)
            eng = Engine(spec, "cuda", "bfloat16")
            eng.warmup()
            for L in (128, 512):
                batch = Batch.pack([rng.integers(1000, 30000, size=L, dtype=np.int32)])
                for _ in range(3):
                    eng.step(batch).wait()
                gr = next(v for b, v in eng.graphs.lazy.graphs.items() if b.seqs == 1 and b.tokens >= L)
                R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append([lib, round(gpu_ms(gr.replay, 200), 4)])
            del eng
            torch.cuda.empty_cache()
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    torch.backends.cuda.preferred_blas_library("default")
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    a = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "linears": linears()}
    Path(a.out_json).write_text(json.dumps(res, indent=1))
    res["engines"] = engines(Path(a.models_root))
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
