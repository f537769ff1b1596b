"""The forms a GEMM's output or an fp8 activation travels in between the engine's kernels.

- ``QRows``: activations quantized per row (token) to e4m3, as the next fp8 GEMM reads them;
  ``quantize_reference`` is the rule the kernels follow (per-row amax / 448).
- ``ScaledRows``: an fp8 GEMM's output whose per-row and per-column scales are applied by the
  kernel that reads it next (ops.add_rms_norm, ops.add_layer_norm, ops.act_quant);
  ``materialize`` applies them in PyTorch where no such kernel runs.
- ``PartialRows``: a split-K GEMM's output (splitk.py, small batches): K-range partial sums that the
  add + norm kernel reading it next adds up as it loads each element.

What this module does not own: computing any of them on the device (ops.py, triton_kernels.py) or which
matmuls produce them (linear/fp8.py).
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
    """An fp8 GEMM's output before its scales (quant.Fp8Linear with deferred scales): the true
    value at row i, column j is ``raw[i, j] · row_scale[i] · col_scale[j] (+ bias[j])``, rounded to
    ``dtype`` as a GEMM writing the model dtype would round it.

    raw [T, N]: the GEMM run with unit scales, in ``dtype`` (bf16 on CUDA, float32 on the CPU);
    row_scale [T, 1] float32 (the input's per-token scale); col_scale [1, N] float32 (the weight's
    per-channel scale); bias [N] in ``dtype`` or None.

    Why: a GEMM with one scale per tensor is faster than the same GEMM scaling rows and columns in
    its epilogue (docs/decisions.md, "the kernel plan"), and the kernel
    that reads the output next touches every element anyway, so the two multiplies cost it nothing."""

    raw: torch.Tensor
    row_scale: torch.Tensor
    col_scale: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.raw.shape


@dataclass
class PartialRows:
    """A split-K GEMM's output before its parts are added: the true value at row i, column j is
    ``sum_s parts[s, i, j] (+ bias[j])``, rounded to ``dtype`` as a GEMM writing the model dtype
    would round it.

    parts [S, T, N] float32 (S ≥ 2 K ranges); bias [N] in ``dtype`` or None; dtype fp16/bf16.

    Why: at batch 1 a projection to the hidden size (attention output, MLP down) has too few
    output tiles to keep the SMs streaming weights; split over K it has enough, and the add + norm kernel that
    reads the output anyway sums the parts (a few MB, still in L2) instead of a reduce pass."""

    parts: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


def materialize(x: "torch.Tensor | ScaledRows | PartialRows") -> torch.Tensor:
    """The true model-dtype rows of ``x`` (ScaledRows: scales and bias applied; PartialRows: parts
    added; in PyTorch)."""
    if isinstance(x, PartialRows):
        y = x.parts.sum(0)
        return (y if x.bias is None else y + x.bias.float()).to(x.dtype)
    if not isinstance(x, ScaledRows):
        return x
    y = x.raw.float() * x.row_scale * x.col_scale
    if x.bias is not None:
        y = y + x.bias.float()
    return y.to(x.dtype)


def unscale_args(x: "torch.Tensor | ScaledRows") -> tuple[torch.Tensor, dict[str, object]]:
    """(the tensor a kernel reads, its scale/bias arguments) for a kernel input that may be
    ScaledRows; plain tensors pass themselves as never-read placeholders. Raises TypeError for
    PartialRows (only the add + norm kernels read them: ``norm_input_args``)."""
    if isinstance(x, PartialRows):
        raise TypeError("PartialRows reached a kernel that does not add split-K parts")
    if not isinstance(x, ScaledRows):
        return x, dict(rs_ptr=x, cs_ptr=x, xb_ptr=x, SCALED=False, XBIAS=False)
    return x.raw, dict(rs_ptr=x.row_scale, cs_ptr=x.col_scale, xb_ptr=x.raw if x.bias is None else x.bias,
                       SCALED=True, XBIAS=x.bias is not None)


def norm_input_args(x: "torch.Tensor | ScaledRows | PartialRows") -> tuple[torch.Tensor, torch.dtype, dict[str, object]]:
    """``unscale_args`` for the add + norm kernels, which also read PartialRows: (the [T, N] tensor
    the kernel reads first — a PartialRows' part 0 —, the true values' dtype, the kernel's
    SCALED/XBIAS/PARTS arguments: PARTS parts ``part_stride`` elements apart)."""
    if not isinstance(x, PartialRows):
        raw, args = unscale_args(x)
        return raw, x.dtype if isinstance(x, ScaledRows) else raw.dtype, dict(args, PARTS=1, part_stride=0)
    p = x.parts
    return p[0], x.dtype, dict(rs_ptr=p, cs_ptr=p, xb_ptr=p if x.bias is None else x.bias, SCALED=False,
                               XBIAS=x.bias is not None, PARTS=p.shape[0], part_stride=p.stride(0))


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
