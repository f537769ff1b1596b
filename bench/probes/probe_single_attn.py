"""Attention for one non-causal sequence padded to its graph bucket (bge-base heads: 12 × 64).

A single-slot graph bucket of T tokens holds one sequence of n ≤ T tokens and T − n padding rows.
Today it runs FlashAttention-2 varlen with cu_seqlens = [0, n, n]. The candidate: SDPA on
[1, H, T, D] with a boolean key mask (keys ≥ n masked), which lets cuDNN's fused kernel run, as the
causal single-slot buckets already do without a mask. Measures ms per call for each backend, checks
the real rows against varlen, and checks that each candidate can be captured in a CUDA graph.

Usage (GPU): python3 bench/probes/probe_single_attn.py OUT_JSON
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.varlen import varlen_attn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402


def graph_ms(fn) -> float | str:  # type: ignore[no-untyped-def]
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return gpu_ms(g.replay, reps=200)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"{type(e).__name__}: {str(e)[:200]}"


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    H, D = 12, 64
    for T, n in ((128, 128), (128, 100), (512, 512), (512, 400)):
        torch.manual_seed(0)
        q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0, n, n], dtype=torch.int32, device="cuda")
        mask = (torch.arange(T, device="cuda") < cu[1]).view(1, 1, 1, T)  # device-side: graph-safe
        qp, kp, vp = (x.view(1, T, H, D).transpose(1, 2) for x in (q, k, v))

        def varlen() -> torch.Tensor:
            return varlen_attn(q, k, v, cu, cu, T, T, window_size=(-1, -1))

        def sdpa(backend):  # type: ignore[no-untyped-def]
            def f() -> torch.Tensor:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask).transpose(1, 2).reshape(T, H, D)
            return f

        ref = varlen()[:n].float()
        case: dict = {"T": T, "n": n, "varlen_ms": gpu_ms(varlen, reps=200), "varlen_graph_ms": graph_ms(varlen)}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("flash", SDPBackend.FLASH_ATTENTION)):
            f = sdpa(be)
            try:
                got = f()[:n].float()
                case[f"{name}_max_abs_err"] = round(float((got - ref).abs().max()), 5)
                case[f"{name}_ms"] = gpu_ms(f, reps=200)
                case[f"{name}_graph_ms"] = graph_ms(f)
            except Exception as e:  # noqa: BLE001
                case[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print(case, flush=True)
        out["cases"].append(case)
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
