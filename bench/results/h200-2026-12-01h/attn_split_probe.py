"""One sequence's attention with its keys split into chunks (attention.SINGLE_SPLIT, issue 14).

Usage (GPU): python3 bench/probes/attn_split_probe.py OUT.json [--models-root DIR] [--lengths 128,256,512,1024]
[--splits 0,2,3,4,6] [--parts kernel,engines]

1. ``kernel``: ``attention.triton_varlen`` on one sequence (Qwen3-0.6B heads 16 / 8 × 128 causal,
   bge-base heads 12 × 64 bidirectional), 28 calls on 28 layers' q/k/v in one CUDA graph (µs per
   call) for every ``--splits`` value (0: no split), the largest difference to split 0, and to an
   fp32 reference.
2. ``engines``: Qwen3-0.6B and bge-base batch-1 engines (random weights) captured with split 0
   and with each other value, in turn, twice, one engine alive at a time: GPU ms per graph replay,
   ``step().wait()`` p50, and the cosine of the vectors to split 0's.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms, graph_us  # noqa: E402
from bouquet.engine import attention  # noqa: E402

HEADS = {"qwen3": (16, 8, 128, True), "bge": (12, 12, 64, False)}


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    T, H, D = q.shape
    g = H // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = torch.einsum("thd,shd->hts", q.float(), kk) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), vv)


def kernel_part(lengths: list[int], splits: list[int]) -> dict:
    R: dict = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (H, Hk, D, causal) in HEADS.items():
        for L in lengths:
            qs = [torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(28)]
            ks = [torch.randn(L, Hk, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(28)]
            vs = [torch.randn(L, Hk, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(28)]
            cu = torch.tensor([0, L], dtype=torch.int32, device="cuda")
            ref = reference(qs[0], ks[0], vs[0], causal)
            base = attention.triton_varlen(qs[0], ks[0], vs[0], cu, L, causal, split=0).float()
            row: dict = {"ref_maxdiff_split0": round((base - ref).abs().max().item(), 5)}
            for sp in splits:
                out = attention.triton_varlen(qs[0], ks[0], vs[0], cu, L, causal, split=sp).float()
                row[f"split{sp}_us"] = round(graph_us(
                    lambda i, sp=sp: attention.triton_varlen(qs[i], ks[i], vs[i], cu, L, causal, split=sp)), 2)
                row[f"split{sp}_maxdiff_vs0"] = round((out - base).abs().max().item(), 5)
                row[f"split{sp}_maxdiff_ref"] = round((out - ref).abs().max().item(), 5)
            R[f"{name}/L{L}"] = row
            print(name, L, json.dumps(row), flush=True)
    cnt = attention._counter_bufs.get(torch.device("cuda", 0))
    R["counters_zero_after"] = None if cnt is None else int(cnt.abs().sum().item()) == 0
    return R


def engines_part(lengths: list[int], splits: list[int], models_root: str) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    keep = attention.SINGLE_SPLIT
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(models_root))))
        outs: dict = {}
        order = [s for _ in range(2) for s in splits]
        for sp in order:
            attention.SINGLE_SPLIT = sp  # read at capture: the engine's graphs keep it
            eng = Engine(spec, "cuda", "bfloat16", spin_wait=True)  # the bench's engine
            eng.warmup()
            for L in (n for n in lengths if n <= spec.max_seq_length):
                batch = Batch.pack([np.random.default_rng(L).integers(1000, 30000, size=L, dtype=np.int32)])
                for _ in range(3):
                    out = eng.step(batch).wait()
                outs.setdefault(L, {})[sp] = out
                gr = next(v for bk, v in eng.graphs.lazy.graphs.items() if bk.seqs == 1 and bk.tokens >= L)
                R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append([sp, round(gpu_ms(gr.replay, 200), 4)])
                took = []
                for _ in range(300):
                    t0 = time.perf_counter()
                    eng.step(batch).wait()
                    took.append(time.perf_counter() - t0)
                R.setdefault(f"{name}/b1_L{L}_step_p50_ms", []).append([sp, round(float(np.median(took[50:])) * 1e3, 4)])
            del eng
            torch.cuda.empty_cache()
        for L, o in outs.items():
            x = np.asarray(o[0], dtype=np.float64)
            for sp, y in o.items():
                y = np.asarray(y, dtype=np.float64)
                R[f"{name}/b1_L{L}_cosine_split{sp}_vs0"] = float((x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y))
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    attention.SINGLE_SPLIT = keep
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--lengths", default="128,256,512,1024")
    ap.add_argument("--splits", default="0,2,3,4,6")
    ap.add_argument("--engine-splits", default="0,2,4")
    ap.add_argument("--parts", default="kernel,engines")
    a = ap.parse_args()
    lengths = [int(v) for v in a.lengths.split(",")]
    parts = a.parts.split(",")
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if "kernel" in parts:
        R["kernel"] = kernel_part(lengths, [int(v) for v in a.splits.split(",")])
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    if "engines" in parts:
        R["engines"] = engines_part(lengths, [int(v) for v in a.engine_splits.split(",")], a.models_root)
        Path(a.out_json).write_text(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
