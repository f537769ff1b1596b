"""Upper bounds for issue 14's throughput rows: what a step would take if only its matmuls and its
attention ran, every other pass (norms, residual adds, rotary, activations, fp8 casts) fused away
for free.

For each (model shape, case) of the goal table, one step of the bench's 100 sequences (equal
lengths, or lengths uniform in [16, 512] from the bench's generator family, seed 0) is timed four
ways in CUDA graphs, random weights of the full size, one distinct weight per layer (no L2 reuse):

- ``gemm_bf16``: the layer's four matmuls (qkv, o, gate/up or up, down) as cuBLAS bf16 ``x @ Wᵀ``;
- ``gemm_fp8_shipped``: the matmuls that ``--quantization fp8`` runs in fp8 (the model class's
  ``FP8_KINDS``) as ``torch._scaled_mm`` with unit tensor-wise scales (the engine's deferred-scale
  form, cuBLASLt's fastest), the rest bf16;
- ``gemm_fp8_all``: all four in fp8 (beyond the accuracy bars: an upper bound of the bound);
- ``attn``: the engine's attention backend for that batch (cuDNN for equal lengths, the Triton varlen
  kernel for mixed ones), every layer.

Beside them, the engine's own eager step for the same batch, bf16 and fp8 (``Engine.forward``, the
``engine`` bench system's one step per request). ``emb_s_bound`` = sequences / (gemm + attn).
``--small``: the batch-1 and benchmark-2 rows instead (1 × 128, 1 × 512, 5 and 25 × 512), where the
bound is a chain of dependent cuBLAS launches in one graph (no PDL) and the engine's figure is the
bench's p50, not measured here.

    python bench/probes/bounds_probe.py OUT.json [--shapes qwen3-0.6b bge-base] [--models-root DIR] [--small]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench.probes.probe_kernels import gpu_ms
from bouquet.bench.models import SHAPES, make_model_dir
from bouquet.engine.attention import VarlenBackend
from bouquet.engine.batch import Batch
from bouquet.engine.engine import Engine
from bouquet.modelspec import load_spec

E4M3 = torch.float8_e4m3fn


def graph_ms(fn: Callable[[], None], reps: int = 10) -> float:
    """GPU ms of one ``fn`` replayed from a CUDA graph (mean of ``reps`` back-to-back replays)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return gpu_ms(g.replay, reps)


def eager_ms(fn: Callable[[], object], reps: int = 3) -> float:
    return gpu_ms(fn, reps)


def dims(cfg: dict) -> dict[str, int]:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads
    kv = cfg.get("num_key_value_heads") or heads
    return dict(h=h, i=cfg["intermediate_size"], layers=cfg["num_hidden_layers"], H=heads, Hkv=kv, D=d)


def linears(cfg: dict, gated: bool) -> dict[str, tuple[int, int]]:
    """kind → (N, K) of each layer's matmuls, as the engine fuses them."""
    s = dims(cfg)
    qd, kvd = s["H"] * s["D"], s["Hkv"] * s["D"]
    return {"qkv": (qd + 2 * kvd, s["h"]), "o": (s["h"], qd),
            "up": ((2 if gated else 1) * s["i"], s["h"]), "down": (s["h"], s["i"])}


def gemm_fn(shapes: dict[str, tuple[int, int]], fp8: tuple[str, ...], layers: int, T: int) -> Callable[[], None]:
    dev = "cuda"
    ws = [{k: (torch.randn(n, kk, device=dev) * 0.02).to(E4M3 if k in fp8 else torch.bfloat16)
           for k, (n, kk) in shapes.items()} for _ in range(layers)]
    ins: dict[tuple[int, bool], torch.Tensor] = {}
    for k, (n, kk) in shapes.items():
        key = (kk, k in fp8)
        if key not in ins:
            x = torch.randn(T, kk, device=dev)
            ins[key] = x.to(E4M3) if key[1] else x.to(torch.bfloat16)
    one = torch.ones((), device=dev)

    def run() -> None:
        for w in ws:
            for k, (n, kk) in shapes.items():
                x = ins[(kk, k in fp8)]
                if k in fp8:
                    torch._scaled_mm(x, w[k].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    torch.mm(x, w[k].t())
    return run


def attn_fn(cfg: dict, lengths: list[int], causal: bool) -> Callable[[], None]:
    s = dims(cfg)
    T = sum(lengths)
    be = VarlenBackend()
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
    meta = be.prepare(cu, max(lengths), causal, uniform=len(set(lengths)) == 1)
    q = torch.randn(T, s["H"], s["D"], device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, s["Hkv"], s["D"], device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, s["Hkv"], s["D"], device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        for _ in range(s["layers"]):
            be.attend(q, k, v, meta)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "bge-base"])
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--small", action="store_true", help="the batch-1 and benchmark-2 cases instead")
    ap.add_argument("--kernels", action="store_true", help="also each engine step's top kernels (torch.profiler)")
    ap.add_argument("--cases", nargs="+", default=None, help="only these cases (e.g. L512 L1024)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    mixed = [int(n) for n in rng.integers(16, 513, size=a.batch)]
    cases = {"qwen3-0.6b": {"L512": [512] * a.batch, "L1024": [1024] * a.batch, "mixed": mixed},
             "bge-base": {"L512": [512] * a.batch, "mixed": mixed}}
    if a.small:  # the latency rows: batch 1 and benchmark 2's batches (no engine column: see below)
        cases = {"qwen3-0.6b": {"b1 L128": [128], "b1 L512": [512], "b5 L512": [512] * 5, "b25 L512": [512] * 25},
                 "bge-base": {"b1 L128": [128]}}
    res = []
    for name in a.shapes:
        shape = SHAPES[name]
        cfg = shape.config
        spec = load_spec(str(make_model_dir(shape, Path(a.models_root))))
        engines = {"bf16": Engine(spec, "cuda"), "fp8": Engine(spec, "cuda", quantization="fp8")}
        # the layer class's FP8_KINDS (decoders: gate/up and down; encoders: q/k/v)
        kinds = next(tuple(m.FP8_KINDS) for m in engines["fp8"].model.modules() if hasattr(m, "FP8_KINDS"))
        shapes = linears(cfg, shape.gated)
        vocab = min(spec.vocab_size, 30000)
        for case, lengths in cases[name].items():
            if a.cases and case not in a.cases:
                continue
            T = sum(lengths)
            row: dict = {"model": name, "case": case, "tokens": T, "seqs": len(lengths), "fp8_kinds": list(kinds)}
            for tag, fp8 in (("gemm_bf16", ()), ("gemm_fp8_shipped", kinds), ("gemm_fp8_all", tuple(shapes))):
                row[tag + "_ms"] = round(graph_ms(gemm_fn(shapes, fp8, dims(cfg)["layers"], T)), 3)
                torch.cuda.empty_cache()
            row["attn_ms"] = round(graph_ms(attn_fn(cfg, lengths, shape.causal)), 3)
            flops = 2 * T * sum(n * k for n, k in shapes.values()) * dims(cfg)["layers"]
            row["gemm_bf16_tflops"] = round(flops / row["gemm_bf16_ms"] / 1e9, 1)
            for tag in ("gemm_bf16", "gemm_fp8_shipped", "gemm_fp8_all"):
                row[f"emb_s_bound_{tag}"] = round(1000 * len(lengths) / (row[tag + "_ms"] + row["attn_ms"]), 1)
            if not a.small:  # an eager small step is host-bound: its figures are the bench's p50 (graphs)
                batch = Batch.pack([rng.integers(1000, vocab, n).astype(np.int32) for n in lengths])
                for tag, eng in engines.items():
                    row[f"engine_{tag}_ms"] = round(eager_ms(lambda: eng.forward(batch)), 3)
                    row[f"emb_s_engine_{tag}"] = round(1000 * len(lengths) / row[f"engine_{tag}_ms"], 1)
                    if a.kernels:
                        from bench.probes.profile_gpu import kernel_table
                        row[f"engine_{tag}_kernels"] = kernel_table(lambda: eng.forward(batch), top=14)
            print(json.dumps(row), flush=True)
            res.append(row)
            torch.cuda.empty_cache()
        del engines
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
