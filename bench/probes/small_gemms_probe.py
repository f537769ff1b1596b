"""Measure before choosing: small steps' qkv and MLP-in GEMMs as Triton GEMMs with their epilogue.

Usage (GPU): python3 bench/probes/small_gemms_probe.py OUT.json [--parts gemm,engines] [--models-root DIR]

At ≤ 128 tokens cuBLAS runs Qwen3-0.6B's qkv in 4.4 µs (8.4 MB of weights: 1.9 TB/s) and gate/up in
5.3 µs (2.4 TB/s), then the gated activation is a kernel of its own (~1.5 µs); bge-base's qkv and
up + GELU (a cuBLASLt epilogue) are 5.2 and 5.8 µs (bench/results/h200-2026-12-01c). ``gemm``: GPU µs
per layer (28 layers' distinct weights in one CUDA graph) of what runs now against
``gemm_kernels.small_gemm_kernel`` with the engine's tiles (``fused_gemms._small_tiles``) and a
sweep of others, outputs compared. ``engines``: Qwen3-0.6B and bge-base engines with
``fused_gemms`` off / on / off / on in one process (at these sizes only the small GEMMs differ):
batch-1 graph replays and end-to-end step p50, vectors compared.
"""
from __future__ import annotations

import argparse
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
from bouquet.engine import fused_gemms, gemm_kernels  # noqa: E402
from bouquet.engine.ops import linear_gelu, silu_mul  # noqa: E402

# (name, N (output columns; gated: i), K, bias, act, gated)
SHAPES = [("qwen3-0.6b/qkv", 4096, 1024, False, None, False), ("qwen3-0.6b/gate_up+silu", 3072, 1024, False, "silu", True),
          ("bge-base/qkv", 2304, 768, True, None, False), ("bge-base/up+gelu", 3072, 768, True, "gelu", False),
          ("minilm/qkv", 1152, 384, True, None, False), ("minilm/up+gelu", 1536, 384, True, "gelu", False)]
TILES = [(64, 16, 128, 3), (64, 32, 128, 3), (64, 64, 128, 3), (64, 16, 64, 4), (64, 32, 64, 4), (16, 32, 128, 3),
         (32, 32, 128, 3)]


def _launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n: int, act: int, gated: bool,
            tile: tuple[int, int, int, int]) -> torch.Tensor:
    bm, bn, bk, stages = tile
    T, K = x.shape
    out = x.new_empty((T, n))
    gemm_kernels.small_gemm_kernel[(n // bn, -(-T // bm))](x, w, b if b is not None else w, out, T, n, K, x.stride(0),
                                                           HAS_BIAS=b is not None, ACT=act, GATED=gated, BM=bm, BN=bn,
                                                           BK=bk, num_warps=4, num_stages=stages)
    return out


def gemm_part(sizes: tuple[int, ...]) -> dict:
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, n, K, bias, act, gated in SHAPES:
        rows = 2 * n if gated else n
        ws = [(torch.randn(rows, K, device="cuda", generator=g) * 0.03).to(torch.bfloat16) for _ in range(28)]
        bs = [torch.randn(rows, device="cuda", generator=g).to(torch.bfloat16) if bias else None for _ in range(28)]
        lin = torch.nn.Linear(K, rows).cuda().to(torch.bfloat16)
        code = fused_gemms._SMALL_ACTS[act]
        for T in sizes:
            x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)

            def now(j: int) -> torch.Tensor:
                if gated:
                    return silu_mul(F.linear(x, ws[j]))
                if act:  # the engine's encoder path: cuBLASLt's GELU epilogue
                    lin.weight.data, lin.bias.data = ws[j], bs[j]
                    return linear_gelu(x, lin, act)
                return F.linear(x, ws[j], bs[j])

            engine_tile = fused_gemms._small_tiles(T, n, K, sms)
            row: dict = {"engine_tile": engine_tile, "now": round(graph_us(now), 2)}
            want = now(0).float()
            for tile in TILES + ([engine_tile + (3,)] if engine_tile else []):
                if n % tile[1] or K % tile[2]:
                    continue
                got = _launch(x, ws[0], bs[0], n, code, gated, tile).float()
                key = "x".join(map(str, tile)) + (" (engine)" if engine_tile and tile == engine_tile + (3,) else "")
                row[key] = round(graph_us(lambda j, t=tile: _launch(x, ws[j], bs[j], n, code, gated, t)), 2)
                row.setdefault("max_abs_diff", 0.0)
                row["max_abs_diff"] = max(row["max_abs_diff"], (got - want).abs().max().item())
            R[f"{name}/T{T}"] = row
            print(name, T, row, flush=True)
    return R


def engines_part(root: Path, lengths: tuple[int, ...]) -> dict:
    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(MODEL_SHAPES[name], root)))
        outs: dict = {}
        for on in (False, True, False, True):
            tag = "triton" if on else "cublas"
            eng = Engine(spec, "cuda", "bfloat16", fused_gemms=on, spin_wait=True)
            eng.warmup()
            for L in lengths:
                batch = Batch.pack([np.random.default_rng(L).integers(1000, 30000, size=L, dtype=np.int32)])
                for _ in range(3):
                    out = eng.step(batch).wait()
                outs.setdefault(L, {})[on] = out
                gr = next(v for bk, v in eng.graphs.lazy.graphs.items() if bk.seqs == 1 and bk.tokens >= L)
                R.setdefault(f"{name}/b1_L{L}_replay_ms", []).append([tag, round(gpu_ms(gr.graph.replay, 200), 4)])
                took = []
                for _ in range(400):
                    t0 = time.perf_counter()
                    eng.step(batch).wait()
                    took.append(time.perf_counter() - t0)
                R.setdefault(f"{name}/b1_L{L}_step_p50_ms", []).append([tag, round(float(np.median(took[50:])) * 1e3, 4)])
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
    ap.add_argument("--parts", default="gemm,engines")
    ap.add_argument("--sizes", default="16,64,128", help="gemm: tokens per step")
    ap.add_argument("--lengths", default="16,128", help="engines: batch-1 lengths (tokens)")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for part in a.parts.split(","):
        if part == "gemm":
            res[part] = gemm_part(tuple(int(v) for v in a.sizes.split(",")))
        else:
            res[part] = engines_part(Path(a.models_root), tuple(int(v) for v in a.lengths.split(",")))
        Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
