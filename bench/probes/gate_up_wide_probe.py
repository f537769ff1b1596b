"""Measure before building: the gated MLP's gate/up GEMM + act(gate) · up as ONE wide wgmma per K step.

The engine's ``gemm_kernels.gate_up_act_kernel`` runs two [BM, BN] dots per K step (gate tile, up
tile, one shared x tile) and reaches ~550 TFLOP/s at 51k-102k tokens of Qwen3-0.6B, where cuBLAS runs
the plain projections at ~710 (bench/results/h200-2026-12-02e, call 3). Hopper's fastest GEMM tiles
are one 128 × 256 accumulator per program (two warpgroups, wgmma N = 256). Two ways to get there with
the gate and up columns of the same outputs in one tile:

- ``il``: the weight stored block-interleaved, [gate rows of tile j; up rows of tile j] per 2·BN rows
  (a copy made here; the engine would store it so), one [2·BN, BK] TMA load and one dot;
- ``w3``: the weight as it is, viewed [2, I, K], one 3-D TMA box [2, BN, BK] reshaped to [2·BN, BK]
  (no copy: whether Triton keeps the reshape a shared-memory view is what this finds out).

The epilogue splits the [BM, 2·BN] accumulator into gate and up and rounds as the engine's kernel does.
Times (GPU µs per call, 4 distinct weights round-robin over 28 calls in one CUDA graph) against cuBLAS +
the activation kernel and the engine's kernel; outputs compared with cuBLAS + activation.

    python bench/probes/gate_up_wide_probe.py OUT.json [--tokens 16384,26864,51200,102400] [--shape 1024,3072]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import graph_us  # noqa: E402
from bouquet.engine import fused_gemms, ops  # noqa: E402
from bouquet.engine.kernels import _act  # noqa: E402


@triton.jit
def _tile(pid, M, I, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    n_n = tl.cdiv(I, BN)
    per_group = GROUP_M * n_n
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(tl.cdiv(M, BM) - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _store(acc, o_desc, pm, pn, BM: tl.constexpr, BN: tl.constexpr, ACT: tl.constexpr):
    dt = o_desc.dtype
    g, u = acc.reshape(BM, 2, BN).permute(0, 2, 1).split()
    g = g.to(dt).to(tl.float32)
    u = u.to(dt).to(tl.float32)
    a = _act(g, ACT).to(dt).to(tl.float32)
    o_desc.store([pm * BM, pn * BN], (a * u).to(dt))


@triton.jit(do_not_specialize=["M"])
def gate_up_wide_kernel(x_desc, w_desc, o_desc, M, I, K: tl.constexpr, ACT: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, THREE_D: tl.constexpr):
    # THREE_D: w_desc is the weight as it is, viewed [2, I, K] (box [2, BN, BK]); else the interleaved copy
    pm, pn = _tile(tl.program_id(0), M, I, BM, BN, GROUP_M)
    acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
    for k in range(0, K, BK):
        if THREE_D:
            w = w_desc.load([0, pn * BN, k]).reshape(2 * BN, BK)
        else:
            w = w_desc.load([pn * 2 * BN, k])
        acc = tl.dot(x_desc.load([pm * BM, k]), w.T, acc)
    _store(acc, o_desc, pm, pn, BM, BN, ACT)


def interleave(w: torch.Tensor, bn: int) -> torch.Tensor:
    """[gate; up] [2I, K] → per output tile j: [gate rows j·bn..; up rows j·bn..] [2I, K]."""
    two_i, k = w.shape
    return w.view(2, two_i // 2 // bn, bn, k).permute(1, 0, 2, 3).reshape(two_i, k).contiguous()


def launch(kind: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: dict) -> None:
    T, K = x.shape
    I = out.shape[1]
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    xd = TensorDescriptor.from_tensor(x, [bm, bk])
    od = TensorDescriptor.from_tensor(out, [bm, bn])
    if kind == "il":
        wd = TensorDescriptor.from_tensor(w, [2 * bn, bk])
    else:
        wd = TensorDescriptor.from_tensor(w.view(2, I, K), [2, bn, bk])
    grid = (triton.cdiv(T, bm) * triton.cdiv(I, bn),)
    gate_up_wide_kernel[grid](xd, wd, od, T, I, K, ACT=1, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["G"], THREE_D=kind == "w3",
                              num_warps=cfg["warps"], num_stages=cfg["stages"])


CONFIGS = [dict(BM=128, BN=128, BK=64, G=8, warps=8, stages=3), dict(BM=128, BN=128, BK=64, G=8, warps=8, stages=4),
           dict(BM=128, BN=64, BK=64, G=8, warps=4, stages=4), dict(BM=128, BN=64, BK=64, G=8, warps=8, stages=4),
           dict(BM=256, BN=64, BK=64, G=8, warps=8, stages=3), dict(BM=128, BN=128, BK=128, G=8, warps=8, stages=2)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", default="16384,26864,51200,102400")
    ap.add_argument("--shape", default="1024,3072", help="hidden, intermediate (Qwen3-0.6B)")
    a = ap.parse_args()
    h, i = (int(v) for v in a.shape.split(","))
    dev, dt = "cuda", torch.bfloat16
    ws = [torch.randn(2 * i, h, device=dev, dtype=dt) * 0.03 for _ in range(4)]
    res: list[dict] = []
    for T in (int(t) for t in a.tokens.split(",")):
        x = torch.randn(T, h, device=dev, dtype=dt)
        out = torch.empty(T, i, device=dev, dtype=dt)
        ref = ops.silu_mul(F.linear(x, ws[0]))
        flops = 2 * T * 2 * i * h
        row: dict = {"tokens": T, "shape": [h, i]}

        def put(name: str, us: float, got: torch.Tensor | None = None) -> None:
            row[name] = {"us": round(us, 1), "tflops": round(flops / us / 1e6, 1)}
            if got is not None:
                row[name]["max_abs_diff"] = float((got.float() - ref.float()).abs().max())
            print(T, name, row[name], flush=True)

        put("cublas_act", graph_us(lambda j: ops.silu_mul(F.linear(x, ws[j % 4]))))
        if fused_gemms.gate_up_act(x, ws[0], "silu") is not None:
            put("engine", graph_us(lambda j: fused_gemms.gate_up_act(x, ws[j % 4], "silu")),
                fused_gemms.gate_up_act(x, ws[0], "silu"))
        for cfg in CONFIGS:
            tag = "{BM}x{BN}x{BK}_w{warps}_s{stages}".format(**cfg)
            for kind in ("il", "w3"):
                wk = [interleave(w, cfg["BN"]) for w in ws] if kind == "il" else ws
                try:
                    launch(kind, x, wk[0], out, cfg)
                    got = out.clone()
                    put(f"{kind}_{tag}", graph_us(lambda j: launch(kind, x, wk[j % 4], out, cfg)), got)
                except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit is a result too
                    row[f"{kind}_{tag}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    print(T, kind, tag, row[f"{kind}_{tag}"], flush=True)
        res.append(row)
        del x, out
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
