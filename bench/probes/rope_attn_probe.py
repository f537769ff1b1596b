"""Measure before choosing: q/k RMSNorm + rotary inside the Triton attention kernel vs a pass first.

Usage (GPU): python3 bench/probes/rope_attn_probe.py OUT.json [--parts kernels,engines] [--models-root DIR]

What runs without it for a Qwen3 layer: ``ops.qk_norm_rope`` rewrites the q and k heads of the qkv
GEMM's output in place (~56 µs per layer at 16,384 tokens, 28 × 2.5 µs at batch 1; bench/results/
h200-2026-12-01c call 6), then the attention kernel reads them. With ``attention.QKRope`` the
kernel norms and rotates q as it loads its query block ("q": the pass rewrites only the k heads,
a third of the bytes), or k too ("qk": no pass; every key block is transformed once per query
block that reads it, so it pays only while few query blocks share a key: small steps).

``kernels``: GPU µs per layer, 28 layers' distinct qkv buffers in one CUDA graph, Qwen3-0.6B heads
(16 q / 8 kv × 128, causal, bf16), for one sequence of 16 / 128 / 512 tokens, a mixed 16–512 batch of
60 sequences and a 16-sequence one; outputs against the pass + kernel path (max abs difference).
``engines``: Qwen3-0.6B engines with ``fused_rope`` off / on / off / on in one process: batch-1
graph replays and end-to-end step p50, and GPU ms per eager step of mixed batches.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms, graph_us  # noqa: E402
from bouquet.engine.attention import QKRope, triton_varlen  # noqa: E402
from bouquet.engine.layers import RMSNorm  # noqa: E402
from bouquet.engine.ops import qk_norm_rope, rope_tables  # noqa: E402

LAYERS, NQ, NKV, D = 28, 16, 8, 128


def _lengths(case: str) -> list[int]:
    rng = np.random.default_rng(0)
    if case.startswith("b1_L"):
        return [int(case[4:])]
    return [int(n) for n in rng.integers(16, 513, size=int(case.split("_")[0][5:]))]  # "mixed60", "mixed16"


def kernels_part() -> dict:
    R: dict = {}
    qn, kn = RMSNorm(D, 1e-6).cuda(), RMSNorm(D, 1e-6).cuda()
    with torch.no_grad():
        qn.weight.uniform_(0.5, 1.5)
        kn.weight.uniform_(0.5, 1.5)
    qn, kn = qn.to(torch.bfloat16), kn.to(torch.bfloat16)
    w = torch.stack((qn.weight.detach(), kn.weight.detach()))
    for case in ("b1_L16", "b1_L128", "b1_L512", "mixed16", "mixed60"):
        lens = _lengths(case)
        T, L = sum(lens), max(lens)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
        pos = torch.cat([torch.arange(n, device="cuda") for n in lens])
        cos, sin = rope_tables(pos, D, 1e6)
        g = torch.Generator(device="cuda").manual_seed(1)
        raw = [torch.randn(T, (NQ + 2 * NKV) * D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
        bufs = [x.clone() for x in raw]  # rewritten in place by the passes while timing

        def run(j: int, mode: str | None) -> torch.Tensor:
            heads = {None: "qk", "q": "k", "qk": ""}[mode]
            q, k, v = qk_norm_rope(bufs[j], qn, kn, cos, sin, NQ, NKV, D, w, heads=heads)
            rope = None if mode is None else QKRope(cos, sin, w, 1e-6, False, mode == "qk")
            return triton_varlen(q, k, v, cu, L, True, rope=rope)

        row: dict = {"tokens": T, "seqs": len(lens)}
        outs = {}
        for mode in (None, "q", "qk"):
            bufs[0].copy_(raw[0])
            outs[mode] = run(0, mode).float()
        for mode in ("q", "qk"):
            row[f"max_abs_diff_{mode}"] = (outs[mode] - outs[None]).abs().max().item()
        for label, mode in (("pass_then_attn", None), ("k_pass_then_attn_q", "q"), ("attn_qk", "qk")):
            row[label] = round(graph_us(lambda j, m=mode: run(j, m)), 2)
        row["pass_qk_alone"] = round(graph_us(lambda j: qk_norm_rope(bufs[j], qn, kn, cos, sin, NQ, NKV, D, w)), 2)
        row["pass_k_alone"] = round(graph_us(lambda j: qk_norm_rope(bufs[j], qn, kn, cos, sin, NQ, NKV, D, w,
                                                                    heads="k")), 2)
        R[case] = row
        print(case, row, flush=True)
        del raw, bufs
        torch.cuda.empty_cache()
    return R


def engines_part(root: Path) -> dict:
    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    spec = load_spec(str(make_model_dir(MODEL_SHAPES["qwen3-0.6b"], root)))
    rng = np.random.default_rng(0)
    mixed = {n: Batch.pack([rng.integers(1000, 30000, size=int(m), dtype=np.int32) for m in rng.integers(16, 513, size=n)])
             for n in (16, 60)}
    outs: dict = {}
    for fused in (False, True, False, True):
        tag = "fused" if fused else "pass"
        eng = Engine(spec, "cuda", "bfloat16", fused_rope=fused, spin_wait=True)
        eng.warmup()
        for L in (16, 128, 512):
            batch = Batch.pack([np.random.default_rng(L).integers(1000, 30000, size=L, dtype=np.int32)])
            for _ in range(3):
                out = eng.step(batch).wait()
            outs.setdefault(f"b1_L{L}", {})[fused] = out
            gr = next(v for bk, v in eng.graphs.lazy.graphs.items() if bk.seqs == 1 and bk.tokens >= L)
            R.setdefault(f"b1_L{L}_replay_ms", []).append([tag, round(gpu_ms(gr.graph.replay, 200), 4)])
            took = []
            for _ in range(300):
                t0 = time.perf_counter()
                eng.step(batch).wait()
                took.append(time.perf_counter() - t0)
            R.setdefault(f"b1_L{L}_step_p50_ms", []).append([tag, round(float(np.median(took[50:])) * 1e3, 4)])
        for n, batch in mixed.items():
            with torch.no_grad():
                outs.setdefault(f"mixed{n}", {})[fused] = eng.step(batch).wait()
                # GPU ms of the eager forward pass alone (the graphs stop below these sizes or not: as served)
                ms = gpu_ms(lambda: eng.step(batch).wait(), 10)
            R.setdefault(f"mixed{n}_step_ms", []).append([tag, round(ms, 3)])
        del eng
        torch.cuda.empty_cache()
    for case, o in outs.items():
        a, c = np.asarray(o[False], dtype=np.float64), np.asarray(o[True], dtype=np.float64)
        cos = (a * c).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(c, axis=-1)
        R[f"{case}_min_cosine"] = float(np.min(cos))
    print(json.dumps(R), flush=True)
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--parts", default="kernels,engines")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for part in a.parts.split(","):
        res[part] = kernels_part() if part == "kernels" else engines_part(Path(a.models_root))
        Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
