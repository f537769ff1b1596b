"""The values fp8 activations travel as between the engine's kernels (``--quantization fp8``).

- ``QRows``: activations quantized per row (token) to e4m3, as the next fp8 GEMM reads them;
  ``quantize_reference`` is the rule the kernels follow (per-row amax / 448).
- ``ScaledRows``: an fp8 GEMM's output whose per-row and per-column scales are applied by the
  kernel that reads it next (ops.add_rms_norm, ops.add_layer_norm, ops.act_quant);
  ``materialize`` applies them in PyTorch where no such kernel runs.

What this module does not own: computing any of them on the device (ops.py, kernels.py) or which
matmuls produce them (quant.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value (OCP FP8 spec, E4M3)
TINY = 1e-12  # an all-zero row (padding) gets this amax: its values quantize to 0


@dataclass
class QRows:
    """Activations quantized per row: row i ≈ values[i] · scale[i].

    values [T, K] float8_e4m3fn; scale [T, 1] float32; dense [T, K] in the model dtype when the
    producing kernel also wrote the unquantized rows (a post-norm encoder's residual stream),
    else None."""

    values: torch.Tensor
    scale: torch.Tensor
    dense: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


@dataclass
class ScaledRows:
    """An fp8 GEMM's output before its scales (quant.Projection with deferred scales): the true
    value at row i, column j is ``raw[i, j] · row_scale[i] · col_scale[j] (+ bias[j])``, rounded to
    ``dtype`` as a GEMM writing the model dtype would round it.

    raw [T, N]: the GEMM run with unit scales, in ``dtype`` (bf16 on CUDA, float32 on the CPU);
    row_scale [T, 1] float32 (the input's per-token scale); col_scale [1, N] float32 (the weight's
    per-channel scale); bias [N] in ``dtype`` or None.

    Why: a GEMM with one scale per tensor is faster than the same GEMM scaling rows and columns in
    its epilogue (Qwen3-0.6B's linears on the H200, bench/results/h200-2026-11-30e/call1-gemm.json:
    0.60 vs 0.94 ms at 128 tokens, 2.17 vs 2.66 at 2,560, 43.5 vs 48.3 at 51,200), and the kernel
    that reads the output next touches every element anyway, so the two multiplies cost it nothing."""

    raw: torch.Tensor
    row_scale: torch.Tensor
    col_scale: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.raw.shape


def materialize(x: "torch.Tensor | ScaledRows") -> torch.Tensor:
    """The true model-dtype rows of ``x`` (ScaledRows: scales and bias applied, in PyTorch)."""
    if not isinstance(x, ScaledRows):
        return x
    y = x.raw.float() * x.row_scale * x.col_scale
    if x.bias is not None:
        y = y + x.bias.float()
    return y.to(x.dtype)


def unscale_args(x: "torch.Tensor | ScaledRows") -> tuple[torch.Tensor, dict[str, object]]:
    """(the tensor a kernel reads, its scale/bias arguments) for a kernel input that may be
    ScaledRows; plain tensors pass themselves as never-read placeholders."""
    if not isinstance(x, ScaledRows):
        return x, dict(rs_ptr=x, cs_ptr=x, xb_ptr=x, SCALED=False, XBIAS=False)
    return x.raw, dict(rs_ptr=x.row_scale, cs_ptr=x.col_scale, xb_ptr=x.raw if x.bias is None else x.bias,
                       SCALED=True, XBIAS=x.bias is not None)


def dense_rows(x: "torch.Tensor | QRows") -> torch.Tensor:
    """The model-dtype rows of ``x``. Raises ValueError for QRows written without them."""
    if isinstance(x, QRows):
        if x.dense is None:
            raise ValueError("these activations exist only in fp8")
        return x.dense
    return x


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] any float dtype → (values [T, K] e4m3, scale [T, 1] float32), in PyTorch: the
    definition the Triton kernels are tested against."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
