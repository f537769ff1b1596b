"""act_quant_kernel before and after the split-row / fast-activation change (issue 14), on the GPU.

    python3 bench/probes/act_quant_probe.py OUT.json

Times ``ops.act_quant`` (the kernel as it is now) against the kernel of commit 1bc3035 (its body
kept below, with the helpers it called, which kernels.py still has: one power-of-two tile per row,
libdevice erf) on the rows the engine feeds it: Qwen3-0.6B's
gate|up GEMM output (deferred scales, [T, 2 × 3072]) and bge-base's up GEMM output (deferred
scales and bias, [T, 3072], erf-GELU), at T = 128, 2,560 and 16,384; GB/s counts bytes read and
written once. Also checks the two agree (fraction of fp8 values that differ, max scale difference),
and times the current kernel at 2, 4, 8 and 16 warps per row (``warps_ms``); every time is GPU ms per
call, 20 calls replayed from one CUDA graph (the host's launch cost left out).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402


# the helpers the kernel of 1bc3035 called are unchanged in kernels.py (the bf16 path's exact _act too)
from bouquet.engine.kernels import _act, _store_fp8, _unscale  # noqa: E402


@triton.jit
def act_quant_before(x_ptr, q_ptr, scale_ptr, rs_ptr, cs_ptr, xb_ptr, n_cols, x_stride, ACT: tl.constexpr,
                     GATED: tl.constexpr, SCALED: tl.constexpr, XBIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = x_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        g = _unscale(g, rs_ptr, cs_ptr, xb_ptr, row, cols, mask, XBIAS).to(dt).to(tl.float32)
    a = _act(g, ACT).to(dt).to(tl.float32)
    if GATED:
        u = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if SCALED:
            u = _unscale(u, rs_ptr, cs_ptr + n_cols, xb_ptr + n_cols, row, cols, mask, XBIAS).to(dt).to(tl.float32)
        a = (a * u).to(dt).to(tl.float32)
    _store_fp8(q_ptr, scale_ptr, row, n_cols, cols, mask, a)


from bouquet.engine.kernels import _fast_act  # noqa: E402


@triton.jit
def _part_rows(x_ptr, rs_ptr, cs_ptr, xb_ptr, rows, rmask, n_cols, x_stride, start, ACT: tl.constexpr,
               GATED: tl.constexpr, SCALED: tl.constexpr, XBIAS: tl.constexpr, BLOCK: tl.constexpr):
    cols = start + tl.arange(0, BLOCK)
    mask = rmask[:, None] & (cols < n_cols)[None, :]
    dt = x_ptr.dtype.element_ty
    ptr = x_ptr + rows[:, None] * x_stride + cols[None, :]
    rs = tl.load(rs_ptr + rows, mask=rmask, other=0.0)[:, None]
    g = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        g = g * rs * tl.load(cs_ptr + cols)[None, :]
        if XBIAS:
            g += tl.load(xb_ptr + cols).to(tl.float32)[None, :]
        g = g.to(dt).to(tl.float32)
    a = _fast_act(g, ACT).to(dt).to(tl.float32)
    if GATED:
        u = tl.load(ptr + n_cols, mask=mask, other=0.0).to(tl.float32)
        if SCALED:
            u = u * rs * tl.load(cs_ptr + n_cols + cols)[None, :]
            if XBIAS:
                u += tl.load(xb_ptr + n_cols + cols).to(tl.float32)[None, :]
            u = u.to(dt).to(tl.float32)
        a = (a * u).to(dt).to(tl.float32)
    return a, cols, mask


@triton.jit
def act_quant_rows(x_ptr, q_ptr, scale_ptr, rs_ptr, cs_ptr, xb_ptr, n_rows, n_cols, x_stride, ACT: tl.constexpr,
                   GATED: tl.constexpr, SCALED: tl.constexpr, XBIAS: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK1: tl.constexpr, R: tl.constexpr):
    # candidate: R rows per program as [R, BLOCK] + [R, BLOCK1] tiles
    rows = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    rmask = rows < n_rows
    a0, c0, m0 = _part_rows(x_ptr, rs_ptr, cs_ptr, xb_ptr, rows, rmask, n_cols, x_stride, 0, ACT, GATED, SCALED, XBIAS,
                            BLOCK)
    amax = tl.max(tl.abs(a0), axis=1)
    if BLOCK1 > 0:
        a1, c1, m1 = _part_rows(x_ptr, rs_ptr, cs_ptr, xb_ptr, rows, rmask, n_cols, x_stride, BLOCK, ACT, GATED, SCALED,
                                XBIAS, BLOCK1)
        amax = tl.maximum(amax, tl.max(tl.abs(a1), axis=1))
    scale = tl.maximum(amax, 1e-12) / 448.0
    tl.store(scale_ptr + rows, scale, mask=rmask)
    inv = (1.0 / scale)[:, None]
    et = q_ptr.dtype.element_ty
    tl.store(q_ptr + rows[:, None] * n_cols + c0[None, :], tl.clamp(a0 * inv, -448.0, 448.0).to(et), mask=m0)
    if BLOCK1 > 0:
        tl.store(q_ptr + rows[:, None] * n_cols + c1[None, :], tl.clamp(a1 * inv, -448.0, 448.0).to(et), mask=m1)


def graph_ms(fn, n: int = 20) -> float:  # type: ignore[no-untyped-def]
    """GPU ms per call of ``fn`` with the host out of the way: ``n`` calls captured in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return gpu_ms(g.replay, 10) / n


def before(x, act: int, gated: bool):  # type: ignore[no-untyped-def]
    from bouquet.engine.fp8_rows import FP8, QRows, unscale_args

    raw, scaled = unscale_args(x)
    n = raw.shape[1] // 2 if gated else raw.shape[1]
    T = raw.shape[0]
    q = torch.empty((T, n), dtype=FP8, device=raw.device)
    s = torch.empty((T, 1), dtype=torch.float32, device=raw.device)
    block = triton.next_power_of_2(n)
    act_quant_before[(T,)](raw, q, s, n_cols=n, x_stride=raw.stride(0), ACT=act, GATED=gated, BLOCK=block,
                           num_warps=4 if block <= 2048 else 8 if block <= 8192 else 16, **scaled)
    return QRows(q, s)


def main() -> None:
    from bouquet.engine.fp8_rows import ScaledRows
    from bouquet.engine.ops import act_quant

    R: dict = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n, gated, act, code, bias in (("qwen3_gate_up_silu", 3072, True, "silu", 1, False),
                                            ("bge_up_gelu", 3072, False, "gelu", 3, True)):
        for T in (128, 2560, 16384):
            width = 2 * n if gated else n
            raw = torch.randn(T, width, device="cuda", generator=g).mul(40).to(torch.bfloat16)
            x = ScaledRows(raw, torch.rand(T, 1, device="cuda", generator=g) * 0.02 + 0.01,
                           torch.rand(1, width, device="cuda", generator=g) * 0.02 + 0.01,
                           torch.randn(width, device="cuda", generator=g).to(torch.bfloat16) if bias else None,
                           torch.bfloat16)
            new, old = act_quant(x, act, gated), before(x, code, gated)
            ms_new = graph_ms(lambda: act_quant(x, act, gated))
            ms_old = graph_ms(lambda: before(x, code, gated))
            nbytes = T * width * 2 + T * n + T * 4
            from bouquet.engine import kernels
            from bouquet.engine.fp8_rows import FP8, unscale_args
            from bouquet.engine.ops import _ACT_CODES, row_parts

            raw, scaled = unscale_args(x)
            q = torch.empty((T, n), dtype=FP8, device="cuda")
            sc = torch.empty((T, 1), dtype=torch.float32, device="cuda")
            parts = row_parts(n)
            warps = {}
            for w in (2, 4, 8, 16):
                def launch() -> None:
                    kernels.act_quant_kernel[(T,)](raw, q, sc, n_cols=n, x_stride=raw.stride(0), ACT=_ACT_CODES[act],
                                                   GATED=gated, BLOCK=parts[0], BLOCK1=parts[1], BLOCK2=parts[2],
                                                   num_warps=w, **scaled)
                warps[w] = round(graph_ms(launch), 4)
            rows_ms = {}
            for per in (2, 4):
                for w in (4, 8):
                    def launch_rows() -> None:
                        act_quant_rows[(-(-T // per),)](raw, q, sc, n_rows=T, n_cols=n, x_stride=raw.stride(0),
                                                        ACT=_ACT_CODES[act], GATED=gated, BLOCK=parts[0],
                                                        BLOCK1=parts[1], R=per, num_warps=w, **scaled)
                    rows_ms[f"R{per}_w{w}"] = round(graph_ms(launch_rows), 4)
                    if per == 2 and w == 4:
                        rows_ok = bool((q.float() == new.values.float()).float().mean() > 0.999)
            r = {"before_ms": round(ms_old, 4), "now_ms": round(ms_new, 4), "warps_ms": warps, "rows_ms": rows_ms,
                 "rows_match": rows_ok,
                 "before_GBps": round(nbytes / ms_old / 1e6, 1), "now_GBps": round(nbytes / ms_new / 1e6, 1),
                 "fp8_values_differing": float((new.values.float() != old.values.float()).float().mean()),
                 "scale_max_rel_diff": float(((new.scale - old.scale).abs() / old.scale).max())}
            R[f"{name}/T{T}"] = r
            print(name, T, json.dumps(r), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
