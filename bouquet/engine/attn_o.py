"""Attention with the output projection (o_proj) in its epilogue, for small steps (batch 1) on Hopper.

At batch 1 a layer is a chain of short kernels whose cost is mostly per kernel, not per byte
(bench/results/h200-2026-12-01, item 2: every GEMM ≥ 4–6 µs whatever its size). Two links of that
chain are the attention kernel and the o projection, a split-K GEMM there (splitk.py) whose fp32
parts the next add + norm kernel sums. ``attend_o`` makes them one kernel
(``attn_kernels.attn_o_kernel``): each program computes the attention output of one query block for
a group of heads, rounds it to the model dtype as the attention kernel would have written it, and
multiplies it by those heads' columns of the o weight for a chunk of output columns. That is the
same split-K decomposition with the K ranges cut at head boundaries — one fp32 part per head group,
``PartialRows`` for the same readers — so the GEMM's launch and the attention output's round trip
go; what it costs is attention recomputed by every column chunk's program (a few key blocks at
≤ ``MAX_TOKENS`` tokens, in parallel) and a reader that sums ``H / heads-per-program`` parts.

Padding rows of a CUDA-graph bucket (rows in no sequence) get no part written, as the attention
kernel leaves their output rows unwritten: their values are garbage either way, and no kernel lets
them reach a real row (GEMMs and norms are per row; attention reads rows of its sequence only).

What this module does not own: whether a projection may take it (``quant.Projection.fused_attention``,
set by the engine: ``Engine(fused_o=...)``, only for o projections whose readers take split-K
parts) or the attention routing of other steps (attention.py).
"""
from __future__ import annotations

import torch

from bouquet.engine.fp8_rows import PartialRows
from bouquet.engine.pdl import launch_options

MAX_TOKENS = 128  # steps of at most this many rows (static per CUDA-graph bucket)
NC = 64  # output columns per program
MAX_PARTS = 8  # heads per program grow until the parts (head groups) are at most this many
_DTYPES = (torch.float16, torch.bfloat16)


Tile = tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages) of the attention kernel


def plan(n_heads: int, n_kv: int, tile: Tile | None) -> tuple[int, int, int, int, int, int] | None:
    """(BM, BN, warps, stages, PACK, LOOPS) for these heads: the attention kernel's ``tile`` for their
    head dim (attention.py passes ``TRITON_ATTN_CONFIGS``), PACK heads per row block as
    ``attention.triton_varlen`` packs them, and the fewest LOOPS passes of PACK heads that leave at
    most ``MAX_PARTS`` parts; None without a tile."""
    if tile is None or n_heads % n_kv:
        return None
    bm, bn, warps, stages = tile
    group = n_heads // n_kv
    pack = group if group > 1 and bm % group == 0 and bm // group >= 16 else 1
    packs = n_heads // pack
    loops = next(n for n in range(1, packs + 1) if packs % n == 0 and packs // n <= MAX_PARTS)
    return bm, bn, warps, stages, pack, loops


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, tile: Tile | None) -> bool:
    """Whether ``attend_o`` runs for q [T, H, D], k/v [T, Hkv, D] and weight [N, H·D]: CUDA, fp16/bf16
    throughout, head dims contiguous, at most ``MAX_TOKENS`` rows, N a multiple of ``NC``, a plan
    for the heads with ``tile``, Triton present."""
    T, H, D = q.shape
    if not (q.is_cuda and q.dtype in _DTYPES and k.dtype == q.dtype and v.dtype == q.dtype and weight.dtype == q.dtype):
        return False
    if T > MAX_TOKENS or q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        return False
    if weight.dim() != 2 or weight.shape[1] != H * D or weight.shape[0] % NC or not weight.is_contiguous():
        return False
    if plan(H, k.shape[1], tile) is None:
        return False
    from bouquet.engine.ops import triton_kernels
    return triton_kernels() is not None


def attend_o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
             causal: bool, weight: torch.Tensor, bias: torch.Tensor | None, tile: Tile | None) -> PartialRows | None:
    """o_proj(attention(q, k, v)) for q [T, H, D], k/v [T, Hkv, D] (packed sequences, cu_seqlens [B+1]
    int32, ``max_seqlen`` ≥ every length: a host int sizing the grid) and weight [N, H·D] (+ bias [N],
    added by the reader) → PartialRows: fp32 parts [H / (PACK·LOOPS), T, N], one per head group, in
    the model dtype once summed. Attention as ``attention.triton_varlen`` computes it (scale 1/√D)
    with ``tile``; None where ``usable`` says no (the caller runs attention, then the projection)."""
    if not usable(q, k, v, weight, tile):
        return None
    from bouquet.engine import attn_kernels
    T, H, D = q.shape
    N = weight.shape[0]
    bm, bn, warps, stages, pack, loops = plan(H, k.shape[1], tile)  # type: ignore[misc]
    n_parts = H // (pack * loops)
    parts = torch.empty((n_parts, T, N), dtype=torch.float32, device=q.device)
    if T:
        grid = ((N // NC) * n_parts, -(-max_seqlen // (bm // pack)), cu_seqlens.shape[0] - 1)
        attn_kernels.attn_o_kernel[grid](
            q, k, v, weight, parts, cu_seqlens, D ** -0.5 * 1.4426950408889634, T, N, weight.stride(0),  # log2(e)
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            GROUP=H // k.shape[1], PACK=pack, LOOPS=loops, CAUSAL=causal, D=D, BM=bm, BN=bn, NC=NC,
            num_warps=warps, num_stages=stages,
            **launch_options(q, "attn_o", grid[0] * grid[1] * grid[2], weight))
    return PartialRows(parts, bias, q.dtype)
