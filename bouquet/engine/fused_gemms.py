"""Triton GEMMs whose epilogue does the next elementwise pass, for large decoder steps and for batch 1, on Hopper.

``gate_up_act``: the gated MLP's gate/up projection with act(gate) · up in the epilogue. What runs
otherwise for x [T, h]: cuBLAS writes gate_up [T, 2i], then ``ops.silu_mul`` (or ``gelu_tanh_mul``)
reads it back and writes [T, i] — at 16,384 tokens of Qwen3-0.6B a 300 MB round trip per layer
(~72 µs at 4.2 TB/s) after a ~316 µs GEMM. The kernel (``gemm_kernels.gate_up_act_kernel``)
computes the gate and up tiles of the same columns side by side (one x tile, two accumulators)
and writes only the product, rounding where the two-kernel path rounds (gate and up, the
activation, the product), so outputs differ only by the GEMM's summation order. Measured on the H200 (bench/probes/fused_gemms_probe.py,
bench/results/h200-2026-12-01e), the engine's tile against cuBLAS + the activation kernel: 383 → 369 and 373 →
355 µs per layer at 16,384 tokens (two runs), 47.2 → 43.1 at 2,048; the sweep's best tiles were
slower at 512 (13.6 → 14.9) and 1,024 (23.7 → 25.4): Triton's GEMM reaches ~580 TFLOP/s where
cuBLAS reaches ~650–670, and below ~2,048 tokens the saved pass is smaller than that difference, hence
``MIN_TOKENS``. Whole steps (the engine with it off and on, in one process): Qwen3-0.6B 32 × 512
30.7 → 30.1 ms, EmbeddingGemma-300m 11.3–11.8 → 11.0–11.2; but EmbeddingGemma's 8 × 256 (2,048
tokens, i = 1,152: 144 output tiles, 1.1 waves of the H200's 132 SMs, the second nearly empty)
2.1–2.3 → 2.3–2.6 ms, hence ``MIN_WAVES`` too (Qwen3-0.6B at 2,048 tokens: 384 tiles, 2.9 waves).

Tried and not adopted: the qkv projection with ``ops.qk_norm_rope`` (q/k RMSNorm + rotary) in its
epilogue, one program per row tile and head with the head's rotary halves as two [BM, 64]
accumulators (the kernel is in the probe): 308.8 µs per layer against cuBLAS + qk_norm_rope's
263.9 at 16,384 tokens, 32.0 against 32.4 at 2,048; whole Qwen3-0.6B 32 × 512 steps 30.0 → 33.8 ms.
Its 64-wide wgmma tiles (one head's half) run far below the 128 × 128 ones cuBLAS picks.

``small_linear`` / ``small_gate_up_act``: steps of at most ``SMALL_MAX_TOKENS`` tokens (batch 1): one
Triton GEMM per projection (many narrow output tiles, the whole K range each) with the bias, the
activation or the gated product in its epilogue (``gemm_kernels.small_gemm_kernel``); the projections
back to the hidden size stay split-K (splitk.py). Alone such a GEMM is 0–25% slower than cuBLAS
(bench/results/h200-2026-12-01f, section 4: Qwen3-0.6B qkv 5.32 → 6.74 µs at 128 tokens), but it
launches with programmatic dependent launch (pdl.py), which cuBLAS's kernels do not, and the gated
one saves the activation's launch: batch-1 graph replays (bench/results/h200-2026-12-01h, call 4)
Qwen3-0.6B 0.966 → 0.926 ms at 16 tokens, 0.975 → 0.933 at 64, but 1.090 → 1.124 at 128; bge-base
0.350 → 0.345, 0.357 → 0.352, 0.389 → 0.375. So the plain (non-gated) one runs only for outputs
of at most ``SMALL_MAX_OUTPUTS`` elements (T·N): Qwen3's qkv at 128 tokens (T·N = 524,288) stays on
cuBLAS, bge-base's qkv and up (≤ 393,216) do not.
Row tiles stay 64 high at 65–128 tokens: 128-row tiles (bench/probes/small_tiles_probe.py) made the
replays 18% (Qwen3-0.6B) and 11% (bge-base) slower at 128 tokens (bench/results/h200-2026-12-02c, section 4).

What this module does not own: whether a layer may use it (``models/decoder.py``: bf16/fp16
steps whose MLP does not run in fp8; ``models/bert.py``'s up; ``quant.Projection.small_gemm`` for
qkv) or whether the engine does (``Engine(fused_gemms=...)``, ``Engine(small_gemms=...)``).
"""
from __future__ import annotations

import functools

import torch

from bouquet.engine.pdl import launch_options

MIN_TOKENS = 2048  # the smallest step measured faster than cuBLAS + the activation kernel (H200)
MIN_WAVES = 2.5  # output tiles per SM below which the last wave's idle SMs cost more than the pass saved
_TILE = dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3)  # the sweep's fastest at 2,048–16,384
_ACTS = {"silu": 1, "gelu_tanh": 2}  # kernels._act's codes
_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _descriptor() -> type | None:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


@functools.lru_cache(maxsize=8)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=8)
def _big_smem_tma(device: torch.device) -> bool:
    """TMA (compute capability 9.0+, NVIDIA) and the shared memory per block the tile's three stages
    need (144 KiB: Hopper and datacenter Blackwell have 227 KiB, consumer Blackwell ~99 KiB)."""
    props = torch.cuda.get_device_properties(device)
    need = _TILE["num_stages"] * (_TILE["BM"] + 2 * _TILE["BN"]) * _TILE["BK"] * 2
    return (torch.version.hip is None and (props.major, props.minor) >= (9, 0)
            and getattr(props, "shared_memory_per_block_optin", 0) >= need)


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
    from bouquet.engine.ops import triton_kernels
    return triton_kernels() is not None and _descriptor() is not None


def usable(x: torch.Tensor, weight: torch.Tensor, act: str) -> bool:
    """Whether ``gate_up_act`` runs for x [T, h] and weight [2i, h] (``_gemm_ok``; an activation the
    epilogue has; i a multiple of 8)."""
    if act not in _ACTS or weight.shape[0] % 2 or (weight.shape[0] // 2) % 8:
        return False
    return _gemm_ok(x, weight, -(-x.shape[0] // _TILE["BM"]) * -(-(weight.shape[0] // 2) // _TILE["BN"]))


def gate_up_act(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor | None:
    """x [T, h] · weight [2i, h]ᵀ (gate rows, then up rows) → act(gate) · up [T, i] in x's dtype,
    or None when ``usable`` says no (the caller runs the GEMM and the activation kernel).
    ``act``: "silu" (Qwen, Mistral) or "gelu_tanh" (Gemma)."""
    if not usable(x, weight, act):
        return None
    from bouquet.engine import gemm_kernels
    T, K = x.shape
    I = weight.shape[0] // 2
    out = x.new_empty((T, I))
    bm, bn, bk = _TILE["BM"], _TILE["BN"], _TILE["BK"]
    desc = _descriptor()
    grid = (-(-T // bm) * -(-I // bn),)
    gemm_kernels.gate_up_act_kernel[grid](desc.from_tensor(x, [bm, bk]), desc.from_tensor(weight, [bn, bk]),
                                          desc.from_tensor(out, [bm, bn]), T, I, K, ACT=_ACTS[act], **_TILE)
    return out


SMALL_MAX_TOKENS = 128
SMALL_MAX_OUTPUTS = 128 * 3072  # T·N of a plain small GEMM: above, cuBLAS (see the module docstring)
SMALL_LAUNCH = {"num_warps": 4, "num_stages": 3}  # Triton launch options of small_gemm_kernel


def _small_tiles(T: int, N: int, K: int, sms: int) -> tuple[int, int, int] | None:
    """(BM, BN, BK) for a small step: 64-row tiles, the widest of 32 / 16 columns that still gives
    every SM a program; None when N or K do not tile."""
    bn = 32 if -(-T // 64) * (N // 32) >= sms and N % 32 == 0 else 16
    if N % bn or K % 64:
        return None
    return 64, bn, 128 if K % 128 == 0 else 64


def _small_ok(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    if not (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and x.dim() == 2 and x.stride(1) == 1):
        return False
    if bias is not None and not bias.is_contiguous():
        return False
    if x.shape[0] > SMALL_MAX_TOKENS or not weight.is_contiguous() or weight.shape[1] != x.shape[1]:
        return False
    from bouquet.engine.ops import triton_kernels
    return triton_kernels() is not None


def _small(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n: int, act: int, gated: bool
           ) -> torch.Tensor | None:
    T, K = x.shape
    tiles = _small_tiles(max(T, 1), n, K, _sms(x.device))
    if tiles is None:
        return None
    from bouquet.engine import gemm_kernels
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
    if act not in _ACTS or weight.shape[0] % 2 or not _small_ok(x, weight):
        return None
    return _small(x, weight, None, weight.shape[0] // 2, _ACTS[act], True)


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
