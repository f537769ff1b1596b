"""The gated MLP's gate/up projection with the activation in the GEMM's epilogue, for large steps.

What runs otherwise for a decoder MLP's input x [T, h]: cuBLAS writes gate_up [T, 2i], then
``ops.silu_mul`` (or ``gelu_tanh_mul``) reads it back and writes act(gate) · up [T, i] — at 16,384
tokens of Qwen3-0.6B a 300 MB round trip per layer (~72 µs at 4.2 TB/s) after a ~316 µs GEMM.
``kernels.gate_up_act_kernel`` computes the gate and up tiles of the same output columns side by
side (one x tile, two accumulators; TMA loads and store, grouped tile order) and writes only the
product. Measured on the H200 (bench/probes/fused_mlp_probe.py, 28 layers' weights in one graph,
bench/results/h200-2026-12-01e): 385 → 362 µs per layer at 16,384 tokens, 46.9 → 42.5 at 2,048, but
13.6 → 14.9 at 512 and 23.7 → 25.4 at 1,024 (Triton's GEMM reaches ~570 TFLOP/s where cuBLAS
reaches ~650; below ~2,048 tokens the saved pass is smaller than that difference), hence
``MIN_TOKENS``. Whole steps (the engine with it off and on, in one process): Qwen3-0.6B 32 × 512
30.7 → 30.1 ms, EmbeddingGemma-300m 11.3–11.8 → 11.0–11.2; but EmbeddingGemma's 8 × 256 (2,048
tokens, i = 1,152: 144 output tiles, 1.1 waves of the H200's 132 SMs, the second nearly empty)
2.1–2.3 → 2.3–2.6 ms, hence ``MIN_WAVES`` too (Qwen3-0.6B at 2,048 tokens: 384 tiles, 2.9 waves, faster).

The epilogue rounds where the two-kernel path rounds (gate and up to the model dtype, the
activation, then the product), so the outputs differ only by the GEMMs' summation order.

What this module does not own: whether a model's MLP may use it (``DecoderMLP``: bf16/fp16 steps
that do not run the MLP in fp8) or whether the engine does (``Engine(gated_gemm=...)``).
"""
from __future__ import annotations

import functools

import torch

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


def usable(x: torch.Tensor, weight: torch.Tensor, act: str) -> bool:
    """Whether x [T, h] · weight [2i, h] can take the kernel: CUDA of compute capability 9.0+ (TMA),
    fp16/bf16, contiguous rows whose byte widths are multiples of 16 (TMA strides), at least
    ``MIN_TOKENS`` tokens and ``MIN_WAVES`` output tiles per SM, an activation the epilogue has,
    Triton present."""
    if not (x.is_cuda and x.dtype in _DTYPES and weight.dtype == x.dtype and x.dim() == 2 and act in _ACTS):
        return False
    if x.shape[0] < MIN_TOKENS or not (x.is_contiguous() and weight.is_contiguous()):
        return False
    K, I = x.shape[1], weight.shape[0] // 2
    if K % 64 or I % 8 or weight.shape[0] % 2 or weight.shape[1] != K:
        return False
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return False
    tiles = -(-x.shape[0] // _TILE["BM"]) * -(-I // _TILE["BN"])
    if tiles < MIN_WAVES * _sms(x.device):
        return False
    from bouquet.engine.ops import triton_kernels
    return triton_kernels() is not None and _descriptor() is not None


def gate_up_act(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor | None:
    """x [T, h] · weight [2i, h]ᵀ (gate rows, then up rows) → act(gate) · up [T, i] in x's dtype,
    or None when ``usable`` says no (the caller runs the GEMM and the activation kernel).
    ``act``: "silu" (Qwen, Mistral) or "gelu_tanh" (Gemma)."""
    if not usable(x, weight, act):
        return None
    from bouquet.engine.ops import triton_kernels
    T, K = x.shape
    I = weight.shape[0] // 2
    out = x.new_empty((T, I))
    bm, bn, bk = _TILE["BM"], _TILE["BN"], _TILE["BK"]
    desc = _descriptor()
    grid = (-(-T // bm) * -(-I // bn),)
    triton_kernels().gate_up_act_kernel[grid](desc.from_tensor(x, [bm, bk]), desc.from_tensor(weight, [bn, bk]),
                                              desc.from_tensor(out, [bm, bn]), T, I, K, ACT=_ACTS[act], **_TILE)
    return out
