"""Small-M linear layers as a split-K Triton GEMM (``kernels.splitk_linear_kernel``).

At batch 1 a forward pass multiplies a few hundred tokens by every weight once: the GEMMs are
weight-streaming, and those with few output tiles leave most SMs idle. cuBLAS's picks for Qwen3-0.6B's
o_proj [1024 × 2048] and down_proj [1024 × 3072] at 128 tokens run at 0.7–0.8 TB/s of weights (plus
a separate split-K reduction kernel for down_proj). Splitting K over S programs per output tile
fills the GPU; the last program of each tile sums the partials itself, so there is no reduction
kernel, no memset (the per-tile counters reset themselves) and the caller's contract is
``F.linear``'s. Measured on the H200 per 28-layer stack (bench/results/h200-2026-12-01/, call 2, the
kernel's partial-sum store only): o_proj 0.171 → 0.128 ms, down_proj 0.227 → 0.148 ms at 128 tokens;
at 512 tokens cuBLAS is faster, and so it is for K < 2048 (bge-base's o_proj), so those keep
``F.linear``.

Used by ``quant.Projection`` for CUDA fp16/bf16 rows of at most ``MAX_TOKENS`` tokens when
``eligible``. Graph-safe: shapes and the grid depend only on host ints; the counters are allocated
once per projection, outside any capture (``enable``). Steps run in stream order (graphs.py), so
no two calls share the counters at once.
"""
from __future__ import annotations

import torch

MAX_TOKENS = 128  # measured wins at 16 and 128 tokens; cuBLAS wins at 512
MIN_K = 2048  # K = 768 (bge-base o_proj): cuBLAS was as fast
_BN, _BK = 64, 128
# (BLOCK_M, SPLIT_K, warps, stages) by token count; the probe's best tiles (call 2)
_CONFIGS = ((16, (16, 8, 4, 4)), (MAX_TOKENS, (64, 4, 4, 4)))
_TILES = -(-MAX_TOKENS // 16)  # row tiles of the smallest BLOCK_M at MAX_TOKENS


def eligible(weight: torch.Tensor) -> bool:
    """Whether a [N, K] weight takes the split-K path for small steps (CUDA, fp16/bf16, K ≥ 2048
    and divisible by every configuration's SPLIT_K · BLOCK_K)."""
    K = weight.shape[1]
    return (weight.is_cuda and weight.dtype in (torch.float16, torch.bfloat16) and K >= MIN_K
            and all(K % (s * _BK) == 0 for _, (_, s, _, _) in _CONFIGS))


def new_counters(weight: torch.Tensor) -> torch.Tensor:
    """The per-tile counters of one weight: int32 zeros, one per output tile of the largest grid."""
    return torch.zeros(_TILES * -(-weight.shape[0] // _BN), dtype=torch.int32, device=weight.device)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, counters: torch.Tensor) -> torch.Tensor:
    """x [M, K] (M ≤ MAX_TOKENS, contiguous) @ weight [N, K]ᵀ + bias [N] → [M, N] in x's dtype;
    fp32 accumulation, the bias added in fp32 before the one rounding (as cuBLASLt's epilogue)."""
    from bouquet.engine import kernels

    M, K = x.shape
    N = weight.shape[0]
    bm, s, warps, stages = next(c for top, c in _CONFIGS if M <= top)
    y = x.new_empty((M, N))
    part = torch.empty((s, M, N), dtype=torch.float32, device=x.device)
    grid = (-(-M // bm), -(-N // _BN), s)
    kernels.splitk_linear_kernel[grid](x, weight, bias if bias is not None else weight, part, counters, y, M, N, K,
                                       HAS_BIAS=bias is not None, S=s, BM=bm, BN=_BN, BK=_BK,
                                       num_warps=warps, num_stages=stages)
    return y
