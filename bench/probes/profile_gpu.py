"""Where the GPU time goes, with and without the fused kernels of ``bouquet/engine/ops.py``.

Usage (GPU): python3 bench/probes/profile_gpu.py OUT_DIR [--shapes qwen3-0.6b bge-base] [--tokenizer T]
Writes OUT_DIR/profile.json and OUT_DIR/profile.txt. For each model shape (random weights, bf16)
and for ``fused`` (Triton kernels on) and ``unfused`` (the PyTorch fallbacks, i.e. the previous
code path):
  * batch 1 at 128 / 512 tokens through ``Engine.step`` (CUDA graphs): host time until step
    returns, end-to-end wait (p50 ms), GPU time of one graph replay, kernels per replay;
  * one eager step of 32 × 512 tokens under ``torch.profiler``: GPU ms and the top kernels;
  * engine throughput at batch 100 × 512 tokens (emb/s, best of 3 passes);
and, fused only, a cProfile of 300 batch-1 steps (where the host time goes). ``--variants``
picks among fused, unfused and fp8 (fused kernels, ``--quantization fp8``).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402


def kernel_table(fn, top: int = 18) -> tuple[int, float, list[list]]:  # type: ignore[no-untyped-def]
    """(kernels launched, total kernel ms, [[name, calls, ms]]) for one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows: dict[str, list] = {}
    n = 0
    total = 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA" or "Memcpy" in e.name or "Memset" in e.name:
            continue
        us = e.device_time if hasattr(e, "device_time") else e.cuda_time
        n += 1
        total += us / 1e3
        r = rows.setdefault(e.name[:90], [e.name[:90], 0, 0.0])
        r[1] += 1
        r[2] += us / 1e3
    ranked = sorted(rows.values(), key=lambda r: -r[2])[:top]
    return n, round(total, 3), [[r[0], r[1], round(r[2], 3)] for r in ranked]


def measure(engine, fused: bool, host_profile: bool) -> dict:  # type: ignore[no-untyped-def]
    from bouquet.engine.batch import Batch
    from bouquet.engine.pooling import finalize

    R: dict = {}
    rng = np.random.default_rng(0)
    vocab = min(engine.spec.vocab_size, 30000)
    for L in (128, 512):
        batch = Batch.pack([rng.integers(1000, vocab, size=L, dtype=np.int32)])
        for _ in range(5):
            engine.step(batch).wait()
        ret, wait = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            h = engine.step(batch)
            t1 = time.perf_counter()
            h.wait()
            ret.append((t1 - t0) * 1e3)
            wait.append((time.perf_counter() - t0) * 1e3)
        g = next(v for b, v in engine.graphs.lazy.graphs.items() if b.seqs == 1 and b.tokens >= L and b.max_seqlen >= L)
        n, total, top = kernel_table(g.replay)
        R[f"b1_L{L}_top"] = top
        R[f"b1_L{L}"] = {"step_return_p50_ms": round(statistics.median(ret), 4),
                         "wait_p50_ms": round(statistics.median(wait), 4),
                         "wait_p99_ms": round(float(np.percentile(wait, 99)), 4),
                         "replay_gpu_ms": round(gpu_ms(g.replay), 4), "kernels": n, "kernel_ms": total}
        if host_profile and L == 128:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                engine.step(batch).wait()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
            R["host_profile_b1_L128"] = s.getvalue()[-6000:]
    engine.spin_wait = True
    batch = Batch.pack([rng.integers(1000, vocab, size=128, dtype=np.int32)])
    spin = []
    for _ in range(200):
        t0 = time.perf_counter()
        engine.step(batch).wait()
        spin.append((time.perf_counter() - t0) * 1e3)
    engine.spin_wait = False
    R["b1_L128_spin_wait_p50_ms"] = round(statistics.median(spin[20:]), 4)
    big = Batch.pack([rng.integers(1000, vocab, size=512, dtype=np.int32) for _ in range(32)])
    n, total, top = kernel_table(lambda: engine.forward(big))
    R["eager_32x512"] = {"gpu_ms": round(gpu_ms(lambda: engine.forward(big), 10), 3), "kernels": n,
                         "kernel_ms": total, "top": top}
    seqs = [rng.integers(1000, vocab, size=512, dtype=np.int32) for _ in range(100)]
    from bouquet.jobs.packer import Group, Packer, drain, run_pipelined

    best = 0.0
    for _ in range(3):
        packer = Packer(16384, 512)
        packer.add(Group(seqs, None, engine.out_dim))
        t0 = time.perf_counter()
        rows = sum(n for n, _ in run_pipelined(engine, drain(packer), lambda r: finalize(r, True, None), 1))
        best = max(best, rows / (time.perf_counter() - t0))
    R["b100_L512_emb_per_s"] = round(best, 1)
    R["fused"] = fused
    return R


def attention_probe() -> dict:
    """ms per call, Qwen3-0.6B heads (16 q / 8 kv × 128), causal, 32 × 512 and 1 × 128 tokens."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn

    R: dict = {}
    for B, L in ((32, 512), (1, 128)):
        q = torch.randn(B * L, 16, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B * L, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cu = torch.arange(0, B * L + 1, L, device="cuda", dtype=torch.int32)
        qp, kp, vp = (x.view(B, L, x.shape[1], 128).transpose(1, 2) for x in (q, k, v))

        def rep() -> torch.Tensor:
            kr, vr = (x.repeat_interleave(2, dim=1) for x in (kp, vp))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qp, kr, vr, is_causal=True)

        def gqa(backend):  # type: ignore[no-untyped-def]
            def f() -> torch.Tensor:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
            return f

        variants = {"cudnn_repeat": rep, "cudnn_gqa": gqa(SDPBackend.CUDNN_ATTENTION),
                    "flash_gqa": gqa(SDPBackend.FLASH_ATTENTION),
                    "varlen": lambda: varlen_attn(q, k, v, cu, cu, L, L, window_size=(-1, 0))}
        ref = variants["varlen"]().float()
        for name, fn in variants.items():
            try:
                out = fn()
                if out.dim() == 4:
                    out = out.transpose(1, 2).reshape(B * L, 16, 128)
                R[f"{B}x{L}_{name}_ms"] = round(gpu_ms(fn, 20), 4)
                R[f"{B}x{L}_{name}_maxdiff"] = round((out.float() - ref).abs().max().item(), 4)
            except Exception as e:  # noqa: BLE001 - the probe reports what is unsupported
                R[f"{B}x{L}_{name}_error"] = str(e)[:200]
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "bge-base"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the embedded MiniLM's)")
    ap.add_argument("--models-root", default="/tmp/models")
    ap.add_argument("--variants", nargs="+", default=["fused", "unfused"], choices=["fused", "unfused", "fp8"])
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine import ops
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    real_fused = ops._fused
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": attention_probe()}
    print(json.dumps(res["attention"], indent=1), flush=True)
    for name in a.shapes:
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root), Path(a.tokenizer) if a.tokenizer else None)))
        for variant in a.variants:
            fused = variant != "unfused"
            ops._fused = real_fused if fused else (lambda x: None)  # type: ignore[assignment]
            engine = Engine(spec, "cuda", "bfloat16", quantization="fp8" if variant == "fp8" else "none", fp8_min_cosine=0.0)
            engine.warmup()
            key = f"{name}/{variant}"
            res[key] = measure(engine, fused, host_profile=variant == "fused")
            print(key, json.dumps({k: v for k, v in res[key].items() if k != "host_profile_b1_L128"}, indent=1)[:3000], flush=True)
            del engine
            torch.cuda.empty_cache()
    ops._fused = real_fused  # type: ignore[assignment]
    (out / "profile.json").write_text(json.dumps(res, indent=1))
    lines = []
    for k, v in res.items():
        if isinstance(v, dict):
            lines.append(f"== {k}")
            for kk, vv in v.items():
                lines.append(vv if kk == "host_profile_b1_L128" else f"{kk}: {json.dumps(vv)}")
    (out / "profile.txt").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
