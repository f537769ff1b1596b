"""Split-K GEMM for small batches: y = x · Wᵀ with K cut into ranges, one fp32 partial sum per range.

At batch 1 the projections back to the hidden size (attention output, MLP down) have too few output
tiles for cuBLAS to keep the SMs streaming weights. Here every (output tile, K range) pair is a
program of ``kernels.splitk_gemm_kernel``, and the parts are not reduced by a pass of their own:
the add + norm kernel that reads the output next anyway (``ops.add_rms_norm``,
``ops.add_layer_norm``) adds them up as it loads a row (``fp8_rows.PartialRows``): CUTLASS's
split-K ("sliced-K") decomposition with the reduction moved into the consumer. Tile plans and the
token limit: plan.py (``splitk_plan``); measurements: docs/decisions.md, "the kernel plan".

What this module does not own: which projections may return parts (linear/base.py: only those whose
every reader is an add + norm kernel) or when (plan.py, linear.select.assign_methods).
"""
from __future__ import annotations

import torch

from bouquet.engine.kernels.rows import PartialRows
from bouquet.engine.kernels.pdl import launch_options
from bouquet.engine.plan import SplitPlan, profile_of, splitk_plan

_DTYPES = (torch.float16, torch.bfloat16)


def usable(x: torch.Tensor) -> bool:
    """Whether ``x`` [T, K] can take the split-K kernel: CUDA, fp16/bf16, rows contiguous, Triton present."""
    if not (x.is_cuda and x.dtype in _DTYPES and x.dim() == 2 and x.stride(1) == 1):
        return False
    from bouquet.engine.kernels.ops import triton_kernels
    return triton_kernels() is not None


def splitk_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  plan: SplitPlan | None = None) -> "PartialRows | None":
    """x [T, K] fp16/bf16 (CUDA, ``usable``) · weight [N, K]ᵀ (+ bias [N], added by the reader) →
    PartialRows with ``plan.parts`` fp32 parts [parts, T, N]; None when no plan fits (the caller
    runs ``F.linear``). ``plan``: a fixed plan (tests); default ``plan.splitk_plan``'s."""
    T, K = x.shape
    N = weight.shape[0]
    plan = plan or splitk_plan(T, N, K, profile_of(x.device).sms)
    if plan is None or not plan.fits(T, N, K) or not weight.is_contiguous():
        return None
    from bouquet.engine.kernels.ops import triton_kernels
    parts = torch.empty((plan.parts, T, N), dtype=torch.float32, device=x.device)
    if T:
        k = triton_kernels()
        grid = (N // plan.bn, -(-T // plan.bm), plan.parts)
        k_split = K // plan.parts
        k.splitk_gemm_kernel[grid](x, weight, parts, T, N, K, x.stride(0), K_SPLIT=k_split, BM=plan.bm, BN=plan.bn,
                                   BK=plan.bk, num_warps=plan.warps, num_stages=plan.stages,
                                   **launch_options(x, "splitk", grid[0] * grid[1] * grid[2], weight))
    return PartialRows(parts, bias, x.dtype)
