"""Triton GEMMs whose epilogue does the next elementwise pass (kernels in gemm_kernels.py).

``gate_up_act``: the gated MLP's gate/up projection with act(gate) · up in the epilogue, for large
steps: cuBLAS would write gate_up [T, 2i] and the activation kernel read it back (a 300 MB round
trip per layer at 16,384 tokens of Qwen3-0.6B). The kernel computes the gate and up tiles of the
same columns side by side and writes only the product, rounding where the two-kernel path rounds,
so outputs differ only by the GEMM's summation order. Runs from ``plan.GATE_UP_MIN_TOKENS`` tokens
and ``plan.GATE_UP_MIN_WAVES`` output tiles per SM (below, cuBLAS's faster GEMM wins).

``small_linear`` / ``small_gate_up_act``: steps of at most ``plan.SMALL_MAX_TOKENS`` tokens: one
Triton GEMM per projection (many narrow output tiles, the whole K range each) with the bias, the
activation or the gated product in its epilogue. Alone slower than cuBLAS, they pay because they
launch with programmatic dependent launch (pdl.py) and save the activation's launch; the plain one
only up to ``plan.SMALL_MAX_OUTPUTS`` outputs. Measurements: docs/decisions.md, "the kernel plan".

What this module does not own: which projections use it, or when (linear/base.py, plan.py).
"""
from __future__ import annotations

import functools

import torch

from bouquet.engine.kernels.pdl import launch_options
from bouquet.engine.plan import (GATE_UP_MIN_TOKENS as MIN_TOKENS, GATE_UP_MIN_WAVES as MIN_WAVES, GATE_UP_TILE as _TILE,
                                 SMALL_LAUNCH, SMALL_MAX_OUTPUTS, SMALL_MAX_TOKENS, gate_up_smem, profile_of, small_tiles)

ACTS = {"silu": 1, "gelu_tanh": 2}  # the gated activations the epilogue has (kernels._act's codes)
_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _descriptor() -> type | None:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def _sms(device: torch.device) -> int:
    return profile_of(device).sms


def _big_smem_tma(device: torch.device) -> bool:
    """TMA and the shared memory per block the tile's three stages need (plan.gate_up_smem)."""
    return profile_of(device).tma_smem(gate_up_smem())


def _gemm_ok(x: torch.Tensor, weight: torch.Tensor, tiles: int) -> bool:
    """x [T, K] · weight [N, K]ᵀ can take the TMA GEMM here (``_big_smem_tma``): fp16/bf16, contiguous,
    K a multiple of 64 (the K step) and N of 16 (16-byte TMA strides), at least ``MIN_TOKENS``
    tokens and ``MIN_WAVES`` output tiles per SM, Triton present."""
    if not (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and x.dim() == 2 and weight.dim() == 2):
        return False
    if x.shape[0] < MIN_TOKENS or not (x.is_contiguous() and weight.is_contiguous()) or weight.shape[1] != x.shape[1]:
        return False
    if x.shape[1] % 64 or weight.shape[0] % 16 or not _big_smem_tma(x.device):
        return False
    if tiles < MIN_WAVES * _sms(x.device):
        return False
    from bouquet.engine.kernels.ops import triton_kernels
    return triton_kernels() is not None and _descriptor() is not None


def usable(x: torch.Tensor, weight: torch.Tensor, act: str) -> bool:
    """Whether ``gate_up_act`` runs for x [T, h] and weight [2i, h] (``_gemm_ok``; an activation the
    epilogue has; i a multiple of 8)."""
    if act not in ACTS or weight.shape[0] % 2 or (weight.shape[0] // 2) % 8:
        return False
    return _gemm_ok(x, weight, -(-x.shape[0] // _TILE["BM"]) * -(-(weight.shape[0] // 2) // _TILE["BN"]))


def gate_up_act(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor | None:
    """x [T, h] · weight [2i, h]ᵀ (gate rows, then up rows) → act(gate) · up [T, i] in x's dtype,
    or None when ``usable`` says no (the caller runs the GEMM and the activation kernel).
    ``act``: "silu" (Qwen, Mistral) or "gelu_tanh" (Gemma)."""
    if not usable(x, weight, act):
        return None
    from bouquet.engine.kernels import gemm_kernels
    T, K = x.shape
    I = weight.shape[0] // 2
    out = x.new_empty((T, I))
    bm, bn, bk = _TILE["BM"], _TILE["BN"], _TILE["BK"]
    desc = _descriptor()
    grid = (-(-T // bm) * -(-I // bn),)
    gemm_kernels.gate_up_act_kernel[grid](desc.from_tensor(x, [bm, bk]), desc.from_tensor(weight, [bn, bk]),
                                          desc.from_tensor(out, [bm, bn]), T, I, K, ACT=ACTS[act], **_TILE)
    return out


def _small_ok(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    if not (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and x.dim() == 2 and x.stride(1) == 1):
        return False
    if bias is not None and not bias.is_contiguous():
        return False
    if x.shape[0] > SMALL_MAX_TOKENS or not weight.is_contiguous() or weight.shape[1] != x.shape[1]:
        return False
    from bouquet.engine.kernels.ops import triton_kernels
    return triton_kernels() is not None


def _small(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n: int, act: int, gated: bool
           ) -> torch.Tensor | None:
    T, K = x.shape
    tiles = small_tiles(max(T, 1), n, K, _sms(x.device))
    if tiles is None:
        return None
    from bouquet.engine.kernels import gemm_kernels
    bm, bn, bk = tiles
    out = x.new_empty((T, n))
    if T:
        grid = (n // bn, -(-T // bm))
        gemm_kernels.small_gemm_kernel[grid](
            x, weight, bias if bias is not None else weight, out, T, n, K, x.stride(0), HAS_BIAS=bias is not None,
            ACT=act, GATED=gated, BM=bm, BN=bn, BK=bk, **SMALL_LAUNCH,
            **launch_options(x, "small_gated" if gated else "small_gemm", grid[0] * grid[1], weight))
    return out


_SMALL_ACTS = {None: 0, "silu": 1, "swish": 1, "gelu_tanh": 2, "gelu_new": 2, "gelu_pytorch_tanh": 2, "gelu": 3, "relu": 4}


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None = None
                 ) -> torch.Tensor | None:
    """act(x [T, K] · weight [N, K]ᵀ + bias [N]) → [T, N] in x's dtype for a step of at most
    ``SMALL_MAX_TOKENS`` tokens and ``SMALL_MAX_OUTPUTS`` outputs on CUDA (fp16/bf16, Triton); None
    where it does not apply (the caller runs cuBLAS). ``act``: None, or a Hugging Face activation name ("gelu": exact erf
    GELU; "gelu_new" / "gelu_pytorch_tanh": tanh GELU; "silu", "relu"), applied to the rounded
    GEMM output and rounded again, as ``F.linear`` then the activation round (and as Hugging Face
    computes it; the larger steps' cuBLAS epilogue, ``ops.linear_gelu``, takes tanh GELU unrounded)."""
    if act not in _SMALL_ACTS or not _small_ok(x, weight, bias) or x.shape[0] * weight.shape[0] > SMALL_MAX_OUTPUTS:
        return None
    return _small(x, weight, bias, weight.shape[0], _SMALL_ACTS[act], False)


def small_gate_up_act(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor | None:
    """``gate_up_act`` for a step of at most ``SMALL_MAX_TOKENS`` tokens: x [T, h] · weight [2i, h]ᵀ
    (gate rows, then up rows) → act(gate) · up [T, i]; None where it does not apply."""
    if act not in ACTS or weight.shape[0] % 2 or not _small_ok(x, weight):
        return None
    return _small(x, weight, None, weight.shape[0] // 2, ACTS[act], True)


def compile_now(weight: torch.Tensor, act: str) -> bool:
    """Run ``gate_up_act`` once on zeros of the fewest tokens it takes for ``weight`` [2i, h], so that
    Triton compiles it at start-up rather than in the first large request (~1 s); False when it
    would not run for this weight on this device."""
    if not weight.is_cuda:
        return False
    i = weight.shape[0] // 2
    tokens = max(MIN_TOKENS, _TILE["BM"] * -(-int(MIN_WAVES * _sms(weight.device)) // -(-i // _TILE["BN"])))
    x = torch.zeros((tokens, weight.shape[1]), dtype=weight.dtype, device=weight.device)
    return gate_up_act(x, weight, act) is not None
