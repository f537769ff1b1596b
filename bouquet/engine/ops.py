"""Fused device kernels used by the models, each with a plain-PyTorch fallback.

``add_layer_norm(x, residual, ln)``: LayerNorm(x + residual) in one pass (one kernel instead of
an add and a norm). Measured on an H200 with bge-base shapes (bench/results/*run2-probe.json):
eager add + LayerNorm 0.166 ms at 51,200 × 768 bf16, a fused kernel 0.109 ms; at batch 1 it
saves a launch per use (2 per layer). The Triton kernel accumulates in fp32, as PyTorch's
LayerNorm does; the add is not rounded to bf16 first, which only makes it slightly more exact.

What this module does not own: choosing to use it (models call it; it falls back by itself on
the CPU, in fp32, or when Triton is missing).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=1)
def _triton_kernel():  # type: ignore[no-untyped-def]
    """Build the Triton kernel on first use (no import-time probing); None when unavailable."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def add_ln_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x += tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        d = tl.where(mask, x - mean, 0.0)
        var = tl.sum(d * d, axis=0) / n_cols
        y = d * tl.rsqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=1.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n_cols + cols, (y * w + b).to(out_ptr.dtype.element_ty), mask=mask)

    return add_ln_kernel, triton.next_power_of_2


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """x, residual [T, H] (same dtype) → LayerNorm(x + residual) [T, H], ``ln``'s weight/bias/eps.

    Fused on CUDA for fp16/bf16 (no host sync, CUDA-graph safe); eager PyTorch otherwise.
    """
    kernel = _triton_kernel() if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) else None
    if kernel is None or ln.weight is None or ln.bias is None or x.dim() != 2 or x.shape[1] > 8192:
        return ln(x + residual)
    fn, next_pow2 = kernel
    x, residual = x.contiguous(), residual.contiguous()
    out = torch.empty_like(x)
    if x.shape[0] == 0:
        return out
    block = next_pow2(x.shape[1])
    fn[(x.shape[0],)](x, residual, ln.weight, ln.bias, out, x.shape[1], ln.eps, BLOCK=block,
                      num_warps=4 if block <= 1024 else 8)
    return out


def layer_norm_reference(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """What ``add_layer_norm`` computes, in fp32 PyTorch (for tests)."""
    return F.layer_norm(x.float() + residual.float(), ln.normalized_shape, ln.weight.float(), ln.bias.float(), ln.eps)
