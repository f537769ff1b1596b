"""Split-K Triton GEMM vs cuBLAS for the hidden-size projections at batch 1 (issue 14): which tiles,
how many K parts, and what whole batch-1 replays gain.

Usage (GPU): python3 bench/probes/splitk_probe.py OUT.json [--models-root DIR] [--quick]

1. ``gemm``: for Qwen3-0.6B's o / down, bge-base's and all-MiniLM-L6-v2's (shape only) at 16–512
   tokens, GPU µs per call of ``F.linear`` (cuBLAS) and of ``splitk.splitk_linear`` for a sweep of
   plans, plus ``splitk.plan_for``'s own choice. 28 calls over 28 different weights in one CUDA
   graph, as a forward pass meets them (the weights do not stay in L2 between calls).
2. ``pair``: the GEMM and the add + norm kernel that reads it (add_rms_norm for Qwen3, add_layer_norm
   for the encoders), cuBLAS + plain rows vs split-K + PartialRows, and the largest difference of
   the normed rows (bf16 ulps apart at most).
3. ``big``: steps of 256 / 512 tokens, above ``splitk.MAX_TOKENS``: a wider sweep (tiles to 128 × 128,
   8 warps, 4 stages), alone and the three fastest with their reader, against cuBLAS.
4. ``engines``: batch-1 graph replays (``--lengths``, default 16–512 tokens) of Qwen3-0.6B and bge-base built with
   ``split_k`` off and on, twice each in turn (random weights): GPU ms per replay, the p50 of
   ``step().wait()`` end to end, and the cosine of their outputs.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms, graph_us  # noqa: E402
from bouquet.engine import splitk  # noqa: E402
from bouquet.engine.layers import RMSNorm  # noqa: E402
from bouquet.engine.ops import add_layer_norm, add_rms_norm  # noqa: E402

# (model, projection, K, N, bias)
SHAPES = [("qwen3", "o", 2048, 1024, False), ("qwen3", "down", 3072, 1024, False),
          ("bge", "o", 768, 768, True), ("bge", "down", 3072, 768, True),
          ("minilm", "o", 384, 384, True), ("minilm", "down", 1536, 384, True)]
LAYERS = 28


def plans(T: int, N: int, K: int, quick: bool) -> list[splitk.SplitPlan]:
    out = []
    bms = (64,) if T <= 64 else (64, 128)
    bns = (64,) if quick else (32, 64, 128)
    for bm, bn, parts, stages in itertools.product(bms, bns, (2, 4, 8, 16), (3,)):
        bk = 128 if K // parts >= 256 else 64
        p = splitk.SplitPlan(bm, bn, bk, parts, 4, stages)
        if p.fits(T, N, K) and K // parts >= 2 * bk:
            out.append(p)
    return out


def gemms(quick: bool) -> dict:
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model, name, K, N, has_bias in SHAPES:
        ws = [(torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16) for _ in range(LAYERS)]
        bs = [torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if has_bias else None for _ in range(LAYERS)]
        for T in (16, 64, 128, 256, 512):
            x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
            row: dict = {"cublas": round(graph_us(lambda i: F.linear(x, ws[i], bs[i])), 2)}
            ref = (x.float() @ ws[0].float().t())
            best = None
            for p in plans(T, N, K, quick):
                us = graph_us(lambda i: splitk.splitk_linear(x, ws[i], bs[i], p))
                err = (splitk.splitk_linear(x, ws[0], None, p).parts.sum(0) - ref).abs().max().item()
                row[f"{p.bm}x{p.bn}x{p.bk}/{p.parts}/s{p.stages}"] = round(us, 2)
                if best is None or us < best[1]:
                    best = (p, us, err)
            auto = splitk.plan_for(T, N, K, sms)
            if auto is not None:
                row["plan_for"] = [str(auto), round(graph_us(lambda i: splitk.splitk_linear(x, ws[i], bs[i])), 2)]
            if best is not None:
                row["best"] = [f"{best[0].bm}x{best[0].bn}x{best[0].bk}/{best[0].parts}/s{best[0].stages}",
                               round(best[1], 2), round(row["cublas"] / best[1], 3), f"max|err| {best[2]:.2e}"]
                row["weight_TBps"] = {"cublas": round(N * K * 2 / row["cublas"] / 1e6, 2),
                                      "best": round(N * K * 2 / best[1] / 1e6, 2)}
            R[f"{model}/{name}/T{T}"] = row
            print(model, name, T, {k: row[k] for k in ("cublas", "best", "plan_for", "weight_TBps") if k in row},
                  flush=True)
    return R


def pairs() -> dict:
    """GEMM + its add + norm reader, cuBLAS vs split-K (plan_for), per call in a 28-call graph."""
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for model, name, K, N, has_bias in SHAPES:
        ws = [(torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16) for _ in range(LAYERS)]
        b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if has_bias else None
        rms = RMSNorm(N, 1e-6).cuda().to(torch.bfloat16)
        ln = torch.nn.LayerNorm(N, eps=1e-12).cuda().to(torch.bfloat16)
        for T in (16, 64, 128):
            x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
            res = torch.randn(T, N, device="cuda", generator=g).to(torch.bfloat16)

            def run(i: int, split: bool):  # type: ignore[no-untyped-def]
                y = splitk.splitk_linear(x, ws[i], b) if split else None
                y = F.linear(x, ws[i], b) if y is None else y
                return add_rms_norm(y, res, rms)[0] if model == "qwen3" else add_layer_norm(y, res, ln)

            row = {"cublas": round(graph_us(lambda i: run(i, False)), 2), "splitk": round(graph_us(lambda i: run(i, True)), 2)}
            row["max_abs_diff"] = (run(0, True).float() - run(0, False).float()).abs().max().item()
            R[f"{model}/{name}/T{T}"] = row
            print("pair", model, name, T, row, flush=True)
    return R


def big(lengths: tuple[int, ...] = (256, 512)) -> dict:
    """Steps above ``splitk.MAX_TOKENS`` (issue 14, batch-1 L512, where cuBLAS takes 64 × 64 tiles for
    the N = hidden projections): wider tiles, 8 warps and 4 stages in the sweep, each plan alone
    (28-call graph) and, for the three fastest, with the add + norm reader against cuBLAS + reader."""
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(2)
    for model, name, K, N, has_bias in SHAPES[:4]:
        ws = [(torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16) for _ in range(LAYERS)]
        b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if has_bias else None
        rms = RMSNorm(N, 1e-6).cuda().to(torch.bfloat16)
        ln = torch.nn.LayerNorm(N, eps=1e-12).cuda().to(torch.bfloat16)
        for T in lengths:
            x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
            res = torch.randn(T, N, device="cuda", generator=g).to(torch.bfloat16)
            row: dict = {"cublas": round(graph_us(lambda i: F.linear(x, ws[i], b)), 2)}
            found = []
            for bm, bn, bk, parts, warps, stages in itertools.product((64, 128), (64, 128), (64, 128), (2, 4),
                                                                       (4, 8), (3, 4)):
                p = splitk.SplitPlan(bm, bn, bk, parts, warps, stages)
                if not p.fits(T, N, K) or K // parts < 2 * bk or p.smem_bytes() > 200 * 1024:
                    continue
                us = graph_us(lambda i: splitk.splitk_linear(x, ws[i], b, p))
                found.append((us, p))
                row[f"{bm}x{bn}x{bk}/{parts}/w{warps}s{stages}"] = round(us, 2)
            found.sort(key=lambda f: f[0])

            def pair(i: int, p: "splitk.SplitPlan | None"):  # type: ignore[no-untyped-def]
                y = F.linear(x, ws[i], b) if p is None else splitk.splitk_linear(x, ws[i], b, p)
                return add_rms_norm(y, res, rms)[0] if model == "qwen3" else add_layer_norm(y, res, ln)

            row["pair_cublas"] = round(graph_us(lambda i: pair(i, None)), 2)
            for us, p in found[:3]:
                key = f"{p.bm}x{p.bn}x{p.bk}/{p.parts}/w{p.warps}s{p.stages}"
                diff = (pair(0, p).float() - pair(0, None).float()).abs().max().item()
                row[f"pair/{key}"] = [round(graph_us(lambda i: pair(i, p)), 2), f"max|diff| {diff:.2e}"]
            R[f"{model}/{name}/T{T}"] = row
            print("big", model, name, T, {k: v for k, v in row.items() if k.startswith(("cublas", "pair"))},
                  "best", [(round(u, 2), str(p)) for u, p in found[:3]], flush=True)
    return R


def engines(root: Path, lengths: tuple[int, ...] = (16, 32, 64, 128, 512)) -> dict:
    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(MODEL_SHAPES[name], root)))
        outs: dict = {}
        for split in (False, True, False, True):
            eng = Engine(spec, "cuda", "bfloat16", split_k=split, spin_wait=True)  # as the bench's engine
            eng.warmup()
            for L in lengths:
                rng = np.random.default_rng(L)
                batch = Batch.pack([rng.integers(1000, 30000, size=L, dtype=np.int32)])
                for _ in range(3):
                    out = eng.step(batch).wait()
                outs.setdefault(L, {})[split] = out
                gr = next(v for bk, v in eng.graphs.lazy.graphs.items() if bk.seqs == 1 and bk.tokens >= L)
                R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append(["splitk" if split else "cublas",
                                                                      round(gpu_ms(gr.replay, 200), 4)])
                took = []
                for _ in range(400):  # end to end as a caller sees it: pack, copy in, replay, copy out
                    t0 = time.perf_counter()
                    eng.step(batch).wait()
                    took.append(time.perf_counter() - t0)
                R.setdefault(f"{name}/b1_L{L}_step_p50_ms", []).append(
                    ["splitk" if split else "cublas", round(float(np.median(took[50:])) * 1e3, 4)])
            del eng
            torch.cuda.empty_cache()
        for L, o in outs.items():
            a, c = np.asarray(o[False], dtype=np.float64), np.asarray(o[True], dtype=np.float64)
            R[f"{name}/b1_L{L}_cosine"] = float((a * c).sum() / np.linalg.norm(a) / np.linalg.norm(c))
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--quick", action="store_true", help="one tile width (64) in the sweep")
    ap.add_argument("--parts", default="gemm,pair,engines")
    ap.add_argument("--lengths", default="16,32,64,128,512", help="engines: batch-1 lengths (tokens)")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for part in a.parts.split(","):
        res[part] = {"gemm": lambda: gemms(a.quick), "pair": pairs, "big": big, "engines": lambda: engines(Path(a.models_root), tuple(int(n) for n in a.lengths.split(",")))}[part]()
        Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
