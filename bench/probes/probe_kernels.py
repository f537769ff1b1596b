"""Measure before fusing: where bge-base's time goes on the GPU, and what candidate fusions save.

Usage (GPU): python3 bench/probes/probe_kernels.py MODEL_DIR OUT_JSON. Prints and writes ms per call.
- host overhead of Engine.step at batch 1 (return time, replay GPU time, end-to-end wait)
- bias+GELU: linear then gelu vs the cuBLASLt epilogue (torch._addmm_activation, tanh GELU)
- residual add + LayerNorm: eager vs torch.compile (dynamic shapes), plus compile seconds
- attention at 100 × 512: varlen vs SDPA cuDNN (uniform lengths, padded layout = no padding)
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def gpu_ms(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def graph_us(fn, n: int = 28, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    """GPU µs per call: ``fn(i)`` for i < n (28: a Qwen3-0.6B's layers, each with its own weights)
    captured in one CUDA graph, replayed ``reps`` times."""
    for i in range(n):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    return gpu_ms(g.replay, reps) / n * 1e3


def variant_parser(lengths: str, variants: str) -> "argparse.ArgumentParser":
    """The arguments the batch-1 variant probes share: OUT.json, --models-root, --lengths,
    --models, --variants (defaults as given)."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--lengths", default=lengths)
    ap.add_argument("--models", default="qwen3-0.6b,bge-base")
    ap.add_argument("--variants", default=variants)
    return ap


def b1_timings(eng, L: int, replay_reps: int = 200, steps: int = 300):  # type: ignore[no-untyped-def]
    """One sequence of L random tokens through a CUDA engine (its bucket captured on the way):
    (output rows [1, D] float32, GPU ms per graph replay, ``step().wait()`` p50 ms, the graph)."""
    from bouquet.engine.batch import Batch

    batch = Batch.pack([np.random.default_rng(L).integers(1000, 30000, size=L, dtype=np.int32)])
    for _ in range(3):
        out = eng.step(batch).wait()
    gr = next(v for bk, v in eng.graphs.lazy.graphs.items() if bk.seqs == 1 and bk.tokens >= L)
    replay = round(gpu_ms(gr.replay, replay_reps), 4)
    took = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step(batch).wait()
        took.append(time.perf_counter() - t0)
    return out, replay, round(float(np.median(took[50:])) * 1e3, 4), gr


def main() -> None:
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict[str, float] = {}
    eng = Engine(load_spec(sys.argv[1]), "cuda")
    eng.warmup()
    for L in (128, 512):
        batch = Batch.pack([np.full(L, 2000, np.int32)])
        for _ in range(5):
            eng.step(batch).wait()
        t_ret, t_all = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            h = eng.step(batch)
            t1 = time.perf_counter()
            h.wait()
            t2 = time.perf_counter()
            t_ret.append((t1 - t0) * 1e3)
            t_all.append((t2 - t0) * 1e3)
        g = eng.graphs.lazy.graphs[next(b for b in eng.graphs.lazy.graphs if b.tokens == L and b.seqs == 1)]
        R[f"b1_L{L}_step_return_ms"] = float(np.median(t_ret))
        R[f"b1_L{L}_step_wait_ms"] = float(np.median(t_all))
        R[f"b1_L{L}_replay_gpu_ms"] = gpu_ms(g.replay)
    dev, dt = "cuda", torch.bfloat16
    for T in (128, 51200):
        x = torch.randn(T, 768, device=dev, dtype=dt)
        w = torch.randn(3072, 768, device=dev, dtype=dt) * 0.02
        b = torch.randn(3072, device=dev, dtype=dt)
        R[f"T{T}_linear_gelu_ms"] = gpu_ms(lambda: F.gelu(F.linear(x, w, b)))
        R[f"T{T}_addmm_gelu_epilogue_ms"] = gpu_ms(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
        y = torch.randn_like(x)
        ln = torch.nn.LayerNorm(768, device=dev, dtype=dt)
        R[f"T{T}_add_ln_ms"] = gpu_ms(lambda: ln(x + y))
        fused = torch.compile(lambda a, r: F.layer_norm(a + r, (768,), ln.weight, ln.bias, 1e-12), dynamic=True)
        t0 = time.perf_counter()
        fused(x, y)
        torch.cuda.synchronize()
        R[f"T{T}_add_ln_compile_s"] = time.perf_counter() - t0
        R[f"T{T}_add_ln_compiled_ms"] = gpu_ms(lambda: fused(x, y))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn

    B, L, H, D = 100, 512, 12, 64
    q, k, v = (torch.randn(B * L, H, D, device=dev, dtype=dt) for _ in range(3))
    cu = torch.arange(0, B * L + 1, L, device=dev, dtype=torch.int32)
    R["attn_varlen_ms"] = gpu_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L))

    def cudnn() -> torch.Tensor:
        qp, kp, vp = (t.view(B, L, H, D).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qp, kp, vp).transpose(1, 2).reshape(B * L, H, D)

    R["attn_cudnn_ms"] = gpu_ms(cudnn)
    o1 = varlen_attn(q, k, v, cu, cu, L, L).float()
    R["attn_cudnn_vs_varlen_maxdiff"] = float((cudnn().float() - o1).abs().max())
    for k_, v_ in R.items():
        print(f"{k_}: {v_:.4f}")
    json.dump(R, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
