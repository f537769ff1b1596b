"""Measure before building: Triton GEMMs with fused epilogues (issue 14; bouquet/engine/fused_gemms.py).

The gated MLP's gate/up GEMM with SiLU · up in its epilogue (below), and with ``--qkv`` the
attention's qkv GEMM with q/k RMSNorm + rotary in its epilogue against cuBLAS + qk_norm_rope.


Usage (GPU): python3 bench/probes/fused_gemms_probe.py OUT.json [--sizes 16,128,...] [--shape h,i]
    [--qkv 2048,16384] [--engines qwen3-0.6b,embeddinggemma-300m]

What runs now for a decoder's MLP input x [T, h]: cuBLAS writes gate_up [T, 2i] (bf16), then
``kernels.gated_act_kernel`` reads it back and writes SiLU(gate) · up [T, i]. At 16,384 tokens
(Qwen3-0.6B) the GEMM takes ~280 µs per layer at ~735 TFLOP/s and the activation ~72 µs at ~4.2 TB/s
(bench/results/h200-2026-12-01c, call 6): the pass moves 300 MB that a GEMM with the activation
in its epilogue would not (it writes 100 MB instead of 200). Whether a Triton GEMM that computes the
gate and up tiles of the same columns side by side (two fp32 accumulators, one shared x tile) keeps
up with cuBLAS is what this times, for a sweep of tiles, against cuBLAS + the activation kernel,
28 layers' distinct weights in one CUDA graph (as a forward pass meets them). Three forms: plain
pointer loads; Hopper's TMA through host-side tensor descriptors (the engine's
``gemm_kernels.gate_up_act_kernel`` at each tile); TMA in a persistent kernel.

The epilogue rounds as the two-kernel path does (gate and up to the model dtype, the activation
to the model dtype, then the product), so outputs differ only by the GEMMs' summation order.
``engine_kernel``: the engine's kernel (bouquet/engine/fused_gemms.py). ``--engines``: whole steps
with it off and on, in one process.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import graph_us as _graph_us  # noqa: E402
from bouquet.engine import fused_gemms, gemm_kernels  # noqa: E402

LAYERS = 28


def graph_us(fn, n: int = LAYERS) -> float:  # type: ignore[no-untyped-def]
    return _graph_us(fn, n, reps=10)  # this probe's calls are long: fewer replays


@triton.jit
def _epilogue(acc_g, acc_u, out_ptr, rm, rn, M, I):
    dt = out_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    mask = (rm[:, None] < M) & (rn[None, :] < I)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * I + rn[None, :], (a * u).to(dt), mask=mask)


@triton.jit
def _tile(pid, M, I, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped order: GROUP_M row tiles share each weight tile while it is in L2
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(I, BN)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    size = tl.minimum(n_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % size
    pn = (pid % per_group) // size
    return pm, pn


@triton.jit(do_not_specialize=["M"])
def gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, I, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        GROUP_M: tl.constexpr):
    # x [M, K], w [2I, K] (gate rows, then up rows), out [M, I] = SiLU(x·w_gᵀ) · (x·w_uᵀ)
    pm, pn = _tile(tl.program_id(0), M, I, BM, BN, GROUP_M)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    g_ptrs = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]  # [BK, BN] tile of w_gᵀ, contiguous along K
    u_ptrs = g_ptrs + I.to(tl.int64) * K  # I: a runtime int32
    in_m = rm[:, None] < M
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(K // BK):
        x = tl.load(x_ptrs, mask=in_m, other=0.0)
        acc_g = tl.dot(x, tl.load(g_ptrs), acc_g)
        acc_u = tl.dot(x, tl.load(u_ptrs), acc_u)
        x_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    _epilogue(acc_g, acc_u, out_ptr, rm, rn, M, I)


@triton.jit
def _act_mul(acc_g, acc_u, dt: tl.constexpr):
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    return (a * u).to(dt)


@triton.jit(do_not_specialize=["M"])
def gate_up_silu_persistent_kernel(x_desc, w_desc, o_desc, M, I, K: tl.constexpr, BM: tl.constexpr,
                                   BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                   PROGRAMS: tl.constexpr):
    # one program per SM walks the tiles (Triton's persistent-matmul form): the tile loop and the
    # K loop flattened into one pipelined loop, so the next tile's loads overlap this one's epilogue
    tiles = tl.cdiv(M, BM) * tl.cdiv(I, BN)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pm, pn = _tile(t, M, I, BM, BN, GROUP_M)
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = x_desc.load([pm * BM, k])
            acc_g = tl.dot(x, w_desc.load([pn * BN, k]).T, acc_g)
            acc_u = tl.dot(x, w_desc.load([I + pn * BN, k]).T, acc_u)
        o_desc.store([pm * BM, pn * BN], _act_mul(acc_g, acc_u, o_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def qkv_rope_kernel(x_desc, w_desc, o_desc, b_ptr, w_norm_ptr, cos_ptr, sin_ptr, M, n_q_heads, n_rot_heads, eps,
                    K: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                    UNIT_OFFSET: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    # Program (m, h): rows [m·BM, m·BM + BM) of head h of x·wᵀ (+ bias), its two halves as two
    # accumulators; q and k heads (h < n_rot_heads) then get qk_norm_rope_kernel's per-head RMSNorm
    # and rotary, rounded where it rounds; v heads are stored as the GEMM wrote them.
    pm = tl.program_id(0)
    h = tl.program_id(1)
    lo = h * 2 * HALF
    acc1 = tl.zeros((BM, HALF), dtype=tl.float32)
    acc2 = tl.zeros((BM, HALF), dtype=tl.float32)
    for k in range(0, K, BK):
        x = x_desc.load([pm * BM, k])
        acc1 = tl.dot(x, w_desc.load([lo, k]).T, acc1)
        acc2 = tl.dot(x, w_desc.load([lo + HALF, k]).T, acc2)
    dt = o_desc.dtype
    cols = tl.arange(0, HALF)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + lo + cols).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + lo + HALF + cols).to(tl.float32)[None, :]
    x1 = acc1.to(dt).to(tl.float32)  # the GEMM's output, as cuBLAS rounds it
    x2 = acc2.to(dt).to(tl.float32)
    if h < n_rot_heads:
        if NORM:
            rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
            w = w_norm_ptr + (h >= n_q_heads).to(tl.int32) * (2 * HALF) + cols  # row 0: q_norm, row 1: k_norm
            w1, w2 = tl.load(w).to(tl.float32)[None, :], tl.load(w + HALF).to(tl.float32)[None, :]
            if UNIT_OFFSET:
                x1 = (x1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
                x2 = (x2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
            else:
                x1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                x2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        t = (pm * BM + tl.arange(0, BM)).to(tl.int64)
        in_m = t[:, None] < M
        c = tl.load(cos_ptr + t[:, None] * HALF + cols[None, :], mask=in_m, other=0.0)
        s = tl.load(sin_ptr + t[:, None] * HALF + cols[None, :], mask=in_m, other=0.0)
        x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
    o_desc.store([pm * BM, lo], x1.to(dt))
    o_desc.store([pm * BM, lo + HALF], x2.to(dt))


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, q_norm: "RMSNorm | None",
             qk_weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int,
             head_dim: int, tile: dict) -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None":
    """x [T, hidden] · weight [(n_q + 2·n_kv)·head_dim, hidden]ᵀ (+ bias) with ``ops.qk_norm_rope``
    applied → (q [T, n_q, D], k [T, n_kv, D], v [T, n_kv, D]), views of one [T, N] tensor in x's
    dtype; or None where it does not apply. ``q_norm``:
    the q norm module (its eps and unit offset; None: rotary only) with ``qk_weight`` [2, D] the
    stacked q/k norm weights; cos/sin [T, D/2] float32 (``ops.rope_tables``). Measured, not adopted:
    bouquet/engine/fused_gemms.py says why."""
    half = head_dim // 2
    t = tile
    heads = n_q + 2 * n_kv
    if half < 16 or half & (half - 1) or weight.shape[0] != heads * head_dim or (q_norm is None) != (qk_weight is None):
        return None
    if not fused_gemms._gemm_ok(x, weight, -(-x.shape[0] // t["BM"]) * heads):
        return None
    T, K = x.shape
    out = x.new_empty((T, weight.shape[0]))
    desc = fused_gemms._descriptor()
    qkv_rope_kernel[(-(-T // t["BM"]), heads)](
        desc.from_tensor(x, [t["BM"], t["BK"]]), desc.from_tensor(weight, [half, t["BK"]]),
        desc.from_tensor(out, [t["BM"], half]), out if bias is None else bias, out if qk_weight is None else qk_weight,
        cos, sin, T, n_q, n_q + n_kv, 0.0 if q_norm is None else q_norm.eps, K=K, HALF=half,
        HAS_BIAS=bias is not None, NORM=q_norm is not None, UNIT_OFFSET=q_norm is not None and q_norm.unit_offset, **t)
    q, k, v = out.split((n_q * head_dim, n_kv * head_dim, n_kv * head_dim), dim=-1)
    return q.view(T, n_q, head_dim), k.view(T, n_kv, head_dim), v.view(T, n_kv, head_dim)


def fused(x: torch.Tensor, w: torch.Tensor, cfg: tuple, mode: str) -> torch.Tensor:
    """x [T, h] · w [2i, h] → SiLU(gate) · up [T, i]; ``mode``: "ptr", "tma" or "persistent"."""
    bm, bn, bk, warps, stages, group = cfg
    T, K = x.shape
    I = w.shape[0] // 2
    out = x.new_empty((T, I))
    tiles = triton.cdiv(T, bm) * triton.cdiv(I, bn)
    opts = dict(BM=bm, BN=bn, BK=bk, GROUP_M=group, num_warps=warps, num_stages=stages)
    if mode == "ptr":
        gate_up_silu_kernel[(tiles,)](x, w, out, T, I, K, **opts)
        return out
    from triton.tools.tensor_descriptor import TensorDescriptor
    xd, wd, od = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                  TensorDescriptor.from_tensor(out, [bm, bn]))
    if mode == "tma":
        gemm_kernels.gate_up_act_kernel[(tiles,)](xd, wd, od, T, I, K, ACT=1, **opts)  # the engine's kernel, SiLU
    else:
        programs = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count)
        gate_up_silu_persistent_kernel[(programs,)](xd, wd, od, T, I, K, PROGRAMS=programs, **opts)
    return out


LARGE = [(128, 64, 64, 4, 4, 8), (128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8), (128, 128, 64, 8, 3, 4),
         (128, 128, 64, 8, 3, 16), (128, 128, 128, 8, 2, 8), (64, 128, 64, 4, 4, 8), (128, 64, 128, 8, 3, 8)]
SMALL = [(64, 32, 128, 4, 3, 1), (64, 64, 128, 4, 3, 1), (32, 32, 128, 4, 4, 1), (16, 64, 128, 4, 4, 1),
         (64, 32, 64, 4, 4, 1), (16, 32, 256, 4, 3, 1)]


def main() -> None:
    from bouquet.engine.ops import silu_mul

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--sizes", default="16,128,512,2048,16384", help="tokens per step")
    ap.add_argument("--shape", default="1024,3072", help="hidden,intermediate (Qwen3-0.6B)")
    ap.add_argument("--engines", default="", help="whole-step A/B for these bench shapes (qwen3-0.6b,embeddinggemma-300m)")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--qkv", default="", help="tokens per step for the qkv + q/k norm + rotary sweep (e.g. 2048,16384)")
    a = ap.parse_args()
    h, i = (int(v) for v in a.shape.split(","))
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "shape": [h, i]}
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [(torch.randn(2 * i, h, device="cuda", generator=g) * 0.03).to(torch.bfloat16) for _ in range(LAYERS)]
    for T in (int(v) for v in a.sizes.split(",")):
        x = torch.randn(T, h, device="cuda", generator=g).to(torch.bfloat16)
        ref = silu_mul(F.linear(x, ws[0]))
        row: dict = {"cublas_gemm": round(graph_us(lambda j: F.linear(x, ws[j])), 2)}
        gu = F.linear(x, ws[0])
        row["act"] = round(graph_us(lambda j: silu_mul(gu)), 2)
        row["cublas_plus_act"] = round(graph_us(lambda j: silu_mul(F.linear(x, ws[j]))), 2)
        flops = 2 * T * h * 2 * i
        row["cublas_gemm_TFLOPs"] = round(flops / row["cublas_gemm"] / 1e6, 1)
        best = None
        for cfg, mode in itertools.product(SMALL if T <= 128 else LARGE, ("ptr", "tma", "persistent")):
            name = f"{mode} {'x'.join(map(str, cfg[:3]))}/w{cfg[3]}/s{cfg[4]}/g{cfg[5]}"
            try:
                err = (fused(x, ws[0], cfg, mode).float() - ref.float()).abs().max().item()
                if err > 0.05:
                    row.setdefault("bad", []).append(f"{name}: max|diff| {err:.3g}")
                    continue
                us = graph_us(lambda j: fused(x, ws[j], cfg, mode))
            except Exception as e:  # noqa: BLE001 - tiles over shared memory, TMA unavailable: reported
                row.setdefault("bad", []).append(f"{name}: {type(e).__name__} {str(e)[:120]}")
                continue
            row[name] = round(us, 2)
            if best is None or us < best[1]:
                best = (name, us, err)
        from bouquet.engine.fused_gemms import gate_up_act
        if gate_up_act(x, ws[0], "silu") is not None:  # the engine's kernel (fused_gemms.py), its own tiles
            row["engine_kernel"] = round(graph_us(lambda j: gate_up_act(x, ws[j], "silu")), 2)
        if best is not None:
            row["best"] = [best[0], round(best[1], 2), round(row["cublas_plus_act"] / best[1], 3),
                           f"max|diff| {best[2]:.3g}", round(flops / best[1] / 1e6, 1)]
        R[f"T{T}"] = row
        print(T, {k: v for k, v in row.items() if not ("/" in k and isinstance(v, float))}, flush=True)
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    if a.qkv:
        R["qkv"] = qkv_part([int(v) for v in a.qkv.split(",")])
        Path(a.out_json).write_text(json.dumps(R, indent=1))
    if a.engines:
        R["engines"] = engines(Path(a.models_root), a.engines.split(","))
        Path(a.out_json).write_text(json.dumps(R, indent=1))


QKV_TILES = [dict(BM=bm, BK=bk, num_warps=w, num_stages=st) for bm, bk, w, st in
             ((128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 4), (64, 64, 4, 4), (128, 128, 8, 2), (256, 64, 8, 3),
              (64, 128, 4, 3))]


def qkv_part(sizes: list[int]) -> dict:
    """Qwen3-0.6B's qkv (16 q / 8 kv heads × 128, hidden 1,024, q/k norm): cuBLAS + qk_norm_rope vs
    the probe's qkv_rope over QKV_TILES, µs per layer (28 layers' weights in one graph)."""
    from bouquet.engine.layers import RMSNorm
    from bouquet.engine.ops import qk_norm_rope, rope_tables

    R: dict = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    nq, nkv, D, h = 16, 8, 128, 1024
    ws = [(torch.randn((nq + 2 * nkv) * D, h, device="cuda", generator=g) * 0.03).to(torch.bfloat16) for _ in range(LAYERS)]
    qn, kn = RMSNorm(D, 1e-6).cuda().to(torch.bfloat16), RMSNorm(D, 1e-6).cuda().to(torch.bfloat16)
    qkw = torch.stack((qn.weight.detach(), kn.weight.detach()))
    for T in sizes:
        x = torch.randn(T, h, device="cuda", generator=g).to(torch.bfloat16)
        cos, sin = rope_tables(torch.arange(T, device="cuda") % 512, D, 1e6)
        ref = qk_norm_rope(F.linear(x, ws[0]), qn, kn, cos, sin, nq, nkv, D, qkw)
        row: dict = {"cublas_gemm": round(graph_us(lambda j: F.linear(x, ws[j])), 2)}
        row["cublas_plus_qk_norm_rope"] = round(graph_us(
            lambda j: qk_norm_rope(F.linear(x, ws[j]), qn, kn, cos, sin, nq, nkv, D, qkw)), 2)
        for t in QKV_TILES:
            name = f"{t['BM']}x{t['BK']}/w{t['num_warps']}/s{t['num_stages']}"
            try:
                out = qkv_rope(x, ws[0], None, qn, qkw, cos, sin, nq, nkv, D, tile=t)
                if out is None:
                    row.setdefault("bad", []).append(f"{name}: not usable")
                    continue
                err = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, ref))
                if err > 0.1:
                    row.setdefault("bad", []).append(f"{name}: max|diff| {err:.3g}")
                    continue
                row[name] = round(graph_us(lambda j: qkv_rope(x, ws[j], None, qn, qkw, cos, sin, nq, nkv, D, tile=t)), 2)
            except Exception as e:  # noqa: BLE001 - tiles over shared memory: reported
                row.setdefault("bad", []).append(f"{name}: {type(e).__name__} {str(e)[:120]}")
        tiles = {k: v for k, v in row.items() if "/" in k}
        if tiles:
            best = min(tiles, key=tiles.get)
            row["best"] = [best, tiles[best], round(row["cublas_plus_qk_norm_rope"] / tiles[best], 3)]
        R[f"T{T}"] = row
        print("qkv", T, {k: v for k, v in row.items() if "/" not in k}, flush=True)
    return R


def engines(root: Path, names: list[str]) -> dict:
    """Whole steps, the engine with ``fused_gemms`` off and on, twice each in turn in this process
    (random full-size weights): ms per step (graph replays where captured; GPU-bound at these sizes)."""
    import time

    import numpy as np

    from bouquet.bench.models import SHAPES as MODEL_SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    R: dict = {}
    rng = np.random.default_rng(0)
    cases = {"32x512": [512] * 32, "8x256": [256] * 8, "mixed_16-512": list(rng.integers(16, 513, size=60))}
    batches = {case: Batch.pack([rng.integers(1000, 30000, size=int(n), dtype=np.int32) for n in lengths])
               for case, lengths in cases.items()}  # the same tokens for every engine
    for name in names:
        spec = load_spec(str(make_model_dir(MODEL_SHAPES[name], root)))
        outs: dict = {}
        for on in (False, True, False, True):
            eng = Engine(spec, "cuda", "bfloat16", fused_gemms=on)
            for case, batch in batches.items():
                for _ in range(3):  # eager, capture, replay
                    out = eng.step(batch).wait()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    eng.step(batch).wait()
                R.setdefault(f"{name}/{case}_ms", []).append(["fused" if on else "cublas",
                                                              round((time.perf_counter() - t0) / 20 * 1e3, 3)])
                outs.setdefault(case, {})[on] = out
            del eng
            torch.cuda.empty_cache()
        for case, o in outs.items():
            a, c = np.asarray(o[False], dtype=np.float64), np.asarray(o[True], dtype=np.float64)
            R[f"{name}/{case}_min_cosine"] = float(((a * c).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(c, axis=1)).min())
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    return R


if __name__ == "__main__":
    main()
