"""Measure before building: the gated activation in the split-K down projection's A loads (batch 1).

Usage (GPU): python3 bench/probes/b1_fusion_probe.py OUT.json [--sizes 16,64,128]

At batch 1 a decoder layer runs, after gate/up: ``ops.silu_mul`` (one kernel: gate_up [T, 2i] →
h [T, i]) and the down projection as a split-K GEMM (splitk.py) reading h. At ≤ 128 tokens both are
latency-bound: the activation kernel is ~1.5 µs of a Qwen3-0.6B layer (28 × 1.5 = 0.042 ms of a 1.13 ms
replay, bench/results/h200-2026-12-01c call 6) for moving a few hundred KB. Here the split-K kernel
loads gate and up tiles instead of h tiles and computes act(gate) · up as it loads them (rounded as
the activation kernel rounds: act to the model dtype, then the product), so the activation kernel
and its launch go away; each program reads twice the A bytes of its K range, a few KB at these sizes.
Timed as GPU µs per layer over 28 layers' distinct weights in one CUDA graph: activation kernel +
split-K down (what runs) against the fused kernel, same plans (``splitk.plan_for``), parts compared.

Measured (bench/results/h200-2026-12-01f, call 1): the fused kernel is 2–3× slower (Qwen3-0.6B at 128
tokens 7.66 → 22.51 µs per layer): not built into the engine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import graph_us  # noqa: E402
from bouquet.engine import splitk  # noqa: E402
from bouquet.engine.kernels import _act  # noqa: E402

LAYERS = 28
# (model, i, hidden, activation code of kernels._act, name)
SHAPES = [("qwen3-0.6b", 3072, 1024, 1, "silu"), ("embeddinggemma-300m", 1152, 768, 2, "gelu_tanh")]


@triton.jit(do_not_specialize=["M"])
def splitk_gated_kernel(gu_ptr, w_ptr, out_ptr, M, N, K, gu_stride, K_SPLIT: tl.constexpr, ACT: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # splitk_gemm_kernel with A = act(gate) · up loaded from gate_up [M, 2K] (gate columns first)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_s * K_SPLIT + tl.arange(0, BK)
    g_ptrs = gu_ptr + rm[:, None].to(tl.int64) * gu_stride + rk[None, :]
    b_ptrs = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    in_m = rm[:, None] < M
    dt = gu_ptr.dtype.element_ty
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(K_SPLIT // BK):
        g = tl.load(g_ptrs, mask=in_m, other=0.0).to(tl.float32)
        u = tl.load(g_ptrs + K, mask=in_m, other=0.0).to(tl.float32)
        a = (_act(g, ACT).to(dt).to(tl.float32) * u).to(dt)
        acc = tl.dot(a, tl.load(b_ptrs), acc)
        g_ptrs += BK
        b_ptrs += BK
    tl.store(out_ptr + pid_s.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=in_m)


def gated_down(gu: torch.Tensor, w: torch.Tensor, act: int, plan: splitk.SplitPlan) -> torch.Tensor:
    """gate_up [T, 2i] · w [N, i] → fp32 parts [parts, T, N] of (act(gate) · up) · wᵀ."""
    T, K, N = gu.shape[0], w.shape[1], w.shape[0]
    parts = torch.empty((plan.parts, T, N), dtype=torch.float32, device=gu.device)
    splitk_gated_kernel[(N // plan.bn, -(-T // plan.bm), plan.parts)](
        gu, w, parts, T, N, K, gu.stride(0), K_SPLIT=K // plan.parts, ACT=act, BM=plan.bm, BN=plan.bn, BK=plan.bk,
        num_warps=plan.warps, num_stages=plan.stages)
    return parts


def main() -> None:
    from bouquet.engine.ops import gelu_tanh_mul, silu_mul

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--sizes", default="16,64,128", help="tokens per step")
    a = ap.parse_args()
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    for model, i, h, act, name in SHAPES:
        ws = [(torch.randn(h, i, device="cuda", generator=g) * 0.02).to(torch.bfloat16) for _ in range(LAYERS)]
        act_mul = silu_mul if name == "silu" else gelu_tanh_mul
        for T in (int(v) for v in a.sizes.split(",")):
            gu = torch.randn(T, 2 * i, device="cuda", generator=g).to(torch.bfloat16)
            plan = splitk.plan_for(T, h, i, sms)
            if plan is None:
                R[f"{model}/T{T}"] = "no split-K plan"
                continue
            want = splitk.splitk_linear(act_mul(gu), ws[0], None, plan).parts.sum(0)
            got = gated_down(gu, ws[0], act, plan).sum(0)
            row = {"plan": str(plan), "max_abs_diff": (got - want).abs().max().item(),
                   "act_then_splitk": round(graph_us(lambda j: splitk.splitk_linear(act_mul(gu), ws[j], None, plan)), 2),
                   "act_alone": round(graph_us(lambda j: act_mul(gu)), 2),
                   "fused": round(graph_us(lambda j: gated_down(gu, ws[j], act, plan)), 2)}
            row["gain_us_per_layer"] = round(row["act_then_splitk"] - row["fused"], 2)
            R[f"{model}/T{T}"] = row
            print(model, T, row, flush=True)
            Path(a.out_json).write_text(json.dumps(R, indent=1))
    Path(a.out_json).write_text(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
