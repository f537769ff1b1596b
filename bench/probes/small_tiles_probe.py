"""Row tiles of the batch-1 Triton GEMMs (fused_gemms.small_linear / small_gate_up_act) above 64 tokens.

Usage (GPU): python3 bench/probes/small_tiles_probe.py OUT.json [--parts gemm,engines] [--models-root DIR]
             [--lengths 64,128] [--variants default,bm128,default,bm128,bm128w8,bm128qkv]

``fused_gemms._small_tiles`` gives every step 64-row tiles, so a 65–128-token step runs two row tiles and
each program of the second streams the same weight slab again (from L2): per SM twice the bytes of one
128-row tile. The 12-01f sweep (small_gemms_probe.py at 3043250) had no 128-row tile. ``gemm``: GPU µs per
call (28 distinct weights in one CUDA graph, plain launches) of cuBLAS (+ the activation), the engine's
tile and 128-row tiles, at 100 and 128 tokens, for Qwen3-0.6B's / bge-base's / all-MiniLM-L6-v2's qkv and
MLP-in shapes. ``engines``: whole engines (random full-size weights, bf16), one at a time per variant in
the order given: "default"; "bm128" (128-row tiles above 64 tokens, the column rule unchanged); "bm128w8"
(the same with 8 warps); "bm128qkv" (bm128, and Qwen3's qkv at 128 tokens in Triton too, which
``SMALL_MAX_OUTPUTS`` keeps on cuBLAS): batch-1 replay GPU ms, step p50, cosine against the first default.
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
from bench.probes.probe_kernels import b1_timings, graph_us  # noqa: E402
from bouquet.engine import fused_gemms, gemm_kernels  # noqa: E402
from bouquet.engine.ops import linear_gelu, silu_mul  # noqa: E402

# (name, N (output columns; gated: i), K, bias, act, gated)
SHAPES = [("qwen3-0.6b/qkv", 4096, 1024, False, None, False), ("qwen3-0.6b/gate_up+silu", 3072, 1024, False, "silu", True),
          ("bge-base/qkv", 2304, 768, True, None, False), ("bge-base/up+gelu", 3072, 768, True, "gelu", False),
          ("minilm/qkv", 1152, 384, True, None, False), ("minilm/up+gelu", 1536, 384, True, "gelu", False)]
# (BM, BN, BK, stages, warps)
TILES = [(128, 16, 128, 3, 4), (128, 32, 128, 3, 4), (128, 16, 64, 4, 4), (128, 32, 64, 4, 4), (128, 32, 128, 3, 8),
         (128, 16, 128, 3, 8), (128, 64, 64, 3, 8)]
_ORIG_TILES = fused_gemms._small_tiles
_ORIG = (dict(fused_gemms.SMALL_LAUNCH), fused_gemms.SMALL_MAX_OUTPUTS)


def _tiles_128(T: int, N: int, K: int, sms: int) -> tuple[int, int, int] | None:
    # the engine's rule with 128-row tiles above 64 tokens
    if T <= 64:
        return _ORIG_TILES(T, N, K, sms)
    bn = 32 if -(-T // 128) * (N // 32) >= sms and N % 32 == 0 else 16
    if N % bn or K % 64:
        return None
    return 128, bn, 128 if K % 128 == 0 else 64


def _set(variant: str) -> None:
    launch, max_out = _ORIG
    fused_gemms._small_tiles = _ORIG_TILES if variant == "default" else _tiles_128
    fused_gemms.SMALL_LAUNCH = dict(launch, num_warps=8) if variant == "bm128w8" else dict(launch)
    fused_gemms.SMALL_MAX_OUTPUTS = 128 * 4096 if variant == "bm128qkv" else max_out


def _launch(x, w, b, n, act, gated, tile):  # type: ignore[no-untyped-def]
    bm, bn, bk, stages, warps = tile
    T, K = x.shape
    out = x.new_empty((T, n))
    gemm_kernels.small_gemm_kernel[(n // bn, -(-T // bm))](x, w, b if b is not None else w, out, T, n, K, x.stride(0),
                                                           HAS_BIAS=b is not None, ACT=act, GATED=gated, BM=bm, BN=bn,
                                                           BK=bk, num_warps=warps, num_stages=stages)
    return out


def gemm_part(sizes: tuple[int, ...]) -> dict:
    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, n, K, bias, act, gated in SHAPES:
        rows = 2 * n if gated else n
        ws = [(torch.randn(rows, K, device="cuda", generator=g) * 0.03).to(torch.bfloat16) for _ in range(28)]
        bs = [torch.randn(rows, device="cuda", generator=g).to(torch.bfloat16) if bias else None for _ in range(28)]
        lin = torch.nn.Linear(K, n, device="cuda", dtype=torch.bfloat16)
        code = fused_gemms._SMALL_ACTS[act]
        for T in sizes:
            x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)

            def now(j: int) -> torch.Tensor:
                if gated:
                    return silu_mul(F.linear(x, ws[j]))
                if act:
                    lin.weight.data, lin.bias.data = ws[j], bs[j]
                    return linear_gelu(x, lin, act)
                return F.linear(x, ws[j], bs[j])

            engine = _ORIG_TILES(T, n, K, sms)
            row: dict = {"engine_tile": engine, "cublas": round(graph_us(now), 2)}
            want = now(0).float()
            for tile in ([engine + (3, 4)] if engine else []) + TILES:
                if n % tile[1] or K % tile[2]:
                    continue
                got = _launch(x, ws[0], bs[0], n, code, gated, tile).float()
                key = "x".join(map(str, tile)) + (" (engine)" if engine and tile == engine + (3, 4) else "")
                row[key] = round(graph_us(lambda j, t=tile: _launch(x, ws[j], bs[j], n, code, gated, t)), 2)
                row["max_abs_diff"] = max(row.get("max_abs_diff", 0.0), (got - want).abs().max().item())
            R[f"{name}/T{T}"] = row
            print(name, T, row, flush=True)
    return R


def engines_part(root: Path, lengths: list[int], variants: list[str], models: list[str]) -> dict:
    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in models:
        spec = load_spec(str(make_model_dir(MODEL_SHAPES[name], root)))
        ref: dict[int, np.ndarray] = {}
        for tag in variants:
            _set(tag)
            eng = Engine(spec, "cuda", "bfloat16", spin_wait=True)
            eng.warmup()
            for L in lengths:
                out, replay, step, _ = b1_timings(eng, L)
                x = np.asarray(out, dtype=np.float64).ravel()
                ref.setdefault(L, x)
                cos = float(x @ ref[L] / np.linalg.norm(x) / np.linalg.norm(ref[L]))
                R.setdefault(f"{name}/L{L}", []).append({"variant": tag, "replay_ms": replay, "step_p50_ms": step,
                                                         "cosine": round(cos, 6)})
            del eng
            torch.cuda.empty_cache()
            print(name, tag, json.dumps({k: v[-1] for k, v in R.items() if k.startswith(name)}), flush=True)
    _set("default")
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--parts", default="gemm,engines")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--lengths", default="64,128")
    ap.add_argument("--variants", default="default,bm128,default,bm128,bm128w8,bm128qkv")
    ap.add_argument("--models", default="qwen3-0.6b,bge-base")
    a = ap.parse_args()
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    out = Path(a.out_json)
    if "gemm" in a.parts:
        R["gemm"] = gemm_part((100, 128))
        out.write_text(json.dumps(R, indent=1))
    if "engines" in a.parts:
        R["engines"] = engines_part(Path(a.models_root), [int(v) for v in a.lengths.split(",")],
                                    a.variants.split(","), a.models.split(","))
        out.write_text(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
