"""Split-K GEMM for small batches: y = x · Wᵀ with K cut into ranges, one fp32 partial sum per range.

At batch 1 (a few hundred tokens) the projections back to the hidden size — attention output
(Qwen3-0.6B: N = 1,024, K = 2,048) and MLP down (N = 1,024, K = 3,072) — have few output tiles, so
cuBLAS runs them on a fraction of the SMs and streams their weights at 0.7–0.8 TB/s (the other
projections of the same layer: 1.9–2.4; bench/results/h200-2026-12-01c, section 4). Here every
(output tile, K range) pair is a program of ``kernels.splitk_gemm_kernel``, enough to cover the
SMs, and the parts are not reduced by a pass of their own: the add + norm kernel that reads the
output next anyway (``ops.add_rms_norm``, ``ops.add_layer_norm``) adds them up as it loads a row
(``fp8_rows.PartialRows``). The technique is the classic split-K / "sliced-K" decomposition of
CUTLASS (``GemmSplitKParallel``) with the reduction moved into the consumer.

What was measured (H200): a split-K GEMM whose parts a separate reduction kernel, or a fenced
last program, adds up gave its gain back (bench/results/h200-2026-12-01, call 2); summed in the
reader instead, with the tiles of ``plan_for``, batch-1 graph replays of 16–128 tokens run 7–9%
faster (Qwen3-0.6B 1.11 → 1.01 ms at 16 tokens, 1.22 → 1.13 at 128; bge-base 0.40 → 0.37 and
0.44 → 0.41; bench/results/h200-2026-12-01e). From 129 to 256 tokens a wider plan (64 × 128 tiles)
does the same (bench/results/h200-2026-12-02); at 512 tokens the replays lose. Tried and not kept:
the o projection's parts computed in the attention kernel's epilogue (one kernel instead of two per
layer, split-K by heads; code at 7a30258): batch-1 replays 0.5% slower at 16 tokens, 2–20% at 64–128
(bench/results/h200-2026-12-02c, section 2) — with PDL a launch between dependent kernels costs little,
and every column chunk's program recomputed its heads' attention.

What this module does not own: which projections may return parts (the models say so through
``quant.Projection(split_k=True)``: only those whose every reader is an add + norm kernel) or
whether the engine uses it (``Engine(split_k=...)``: by default on NVIDIA Hopper GPUs).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from bouquet.engine.fp8_rows import PartialRows
from bouquet.engine.pdl import launch_options

MAX_TOKENS = 256  # above this cuBLAS (at 512 tokens split-K replays were 3–5% slower: 12-02 call 4)
NARROW_MAX_TOKENS = 128  # up to here 64 × 32 tiles (12-01e); above, the wide plan of ``plan_for``
# warm-up step lengths (Engine.warmup), one per set of compiled kernels above its 8-token step: 128
# (the small GEMMs' and split-K's tiles above 64 tokens), 256 (the wide plan)
WARM_TOKENS = (128, 256)
_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class SplitPlan:
    """Tiles of one split-K launch: output tile bm × bn, K step bk, ``parts`` K ranges; Triton's
    num_warps / num_stages."""

    bm: int
    bn: int
    bk: int
    parts: int
    warps: int = 4
    stages: int = 3

    def smem_bytes(self, elem: int = 2) -> int:
        """Shared memory the pipelined loads need (bytes): ``stages`` buffers of the x and w tiles
        (Triton on Hopper keeps num_stages − 1 in flight plus one more for a wgmma operand)."""
        return self.stages * (self.bm + self.bn) * self.bk * elem

    def fits(self, T: int, N: int, K: int) -> bool:
        """Whether the plan tiles a [T, K] · [N, K]ᵀ product exactly in N and K (T is masked)."""
        return N % self.bn == 0 and K % (self.parts * self.bk) == 0 and self.parts >= 2 and self.bm >= 16


@functools.lru_cache(maxsize=4096)
def plan_for(T: int, N: int, K: int, sms: int) -> SplitPlan | None:
    """The split-K plan for T tokens through an [N, K] weight on a GPU of ``sms`` SMs, or None
    where cuBLAS is the better choice (more than MAX_TOKENS tokens, K too short to split, sizes
    that do not tile). Up to ``NARROW_MAX_TOKENS`` tokens, parts: K ranges of at least 192 columns,
    at most 16 parts and 3 waves of ``sms`` programs; above, one wide plan (see the code)."""
    if T > MAX_TOKENS or T < 1:
        return None
    if T > NARROW_MAX_TOKENS:
        # 129–256 tokens: 64 × 128 tiles, 4 stages, K in 4 ranges: the fastest with the add + norm
        # reader in the 12-02 sweep (call 3: o and down of Qwen3-0.6B and bge-base at 256 tokens 16–22%
        # faster than cuBLAS + reader; whole batch-1 replays at 256 tokens 5–8% faster, call 4)
        # (at most 3 waves, as below: wider models than those measured get cuBLAS rather than a plan
        # whose parts outgrow the GEMM)
        plan = SplitPlan(64, 128, 64, 4, warps=4, stages=4)
        waves_ok = -(-T // plan.bm) * (N // plan.bn) * plan.parts <= 3 * sms
        return plan if plan.fits(T, N, K) and K // plan.parts >= 2 * plan.bk and waves_ok else None
    # the fastest tiles of the 12-01e sweep (Qwen3-0.6B, bge-base, all-MiniLM-L6-v2 o / down, 16–128
    # tokens): 64 × 32 output tiles and K ranges of 192–512 columns; fewer parts also mean less
    # for the reader to add up
    bm, bn = 64, 32
    parts = 1
    tiles = -(-T // bm) * -(-N // bn)
    while (K % (parts * 2) == 0 and (K // (parts * 2)) % 64 == 0 and K // (parts * 2) >= 192 and parts < 16
           and tiles * parts * 2 <= 3 * sms):
        parts *= 2
    k_split = K // parts
    bk = 128 if k_split >= 256 and k_split % 128 == 0 else 64
    plan = SplitPlan(bm, bn, bk, parts)
    return plan if plan.fits(T, N, K) else None


def usable(x: torch.Tensor) -> bool:
    """Whether ``x`` [T, K] can take the split-K kernel: CUDA, fp16/bf16, rows contiguous, Triton present."""
    if not (x.is_cuda and x.dtype in _DTYPES and x.dim() == 2 and x.stride(1) == 1):
        return False
    from bouquet.engine.ops import triton_kernels
    return triton_kernels() is not None


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def splitk_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  plan: SplitPlan | None = None) -> "PartialRows | None":
    """x [T, K] fp16/bf16 (CUDA, ``usable``) · weight [N, K]ᵀ (+ bias [N], added by the reader) →
    PartialRows with ``plan.parts`` fp32 parts [parts, T, N]; None when no plan fits (the caller
    runs ``F.linear``). ``plan``: a fixed plan (probes); default ``plan_for``'s."""
    T, K = x.shape
    N = weight.shape[0]
    plan = plan or plan_for(T, N, K, _sms(x.device))
    if plan is None or not plan.fits(T, N, K) or not weight.is_contiguous():
        return None
    from bouquet.engine.ops import triton_kernels
    parts = torch.empty((plan.parts, T, N), dtype=torch.float32, device=x.device)
    if T:
        k = triton_kernels()
        grid = (N // plan.bn, -(-T // plan.bm), plan.parts)
        k_split = K // plan.parts
        k.splitk_gemm_kernel[grid](x, weight, parts, T, N, K, x.stride(0), K_SPLIT=k_split, BM=plan.bm, BN=plan.bn,
                                   BK=plan.bk, num_warps=plan.warps, num_stages=plan.stages,
                                   **launch_options(x, "splitk", grid[0] * grid[1] * grid[2], weight))
    return PartialRows(parts, bias, x.dtype)
