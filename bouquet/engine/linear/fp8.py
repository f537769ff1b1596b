"""fp8 (e4m3) linear layers: weights quantized at load, activations quantized per token by the
kernel that produces them (``--quantization fp8``).

The scheme (the "dynamic per-token activations, per-channel weights" FP8 recipe of vLLM's
``fp8`` / ``FBGEMM_FP8`` and of ``torch._scaled_mm``'s row-wise mode):

- weight W [N, K] → Wq [N, K] float8_e4m3fn and a scale per output channel s_w [1, N] float32,
  s_w[n] = max_k |W[n, k]| / 448 (448: e4m3's largest finite value), Wq = W / s_w. Computed from
  the bf16/fp32 checkpoint at load (``Fp8Weight.quantize``).
- activation x [T, K] → xq [T, K] e4m3 and s_x [T, 1] float32 the same way per row (token), at run
  time. The norm / activation kernel that writes x writes xq and s_x instead (ops.add_rms_norm,
  ops.add_layer_norm, ``act_quant``), so no separate cast pass reads x again; only the attention
  output (written by FlashAttention / cuDNN) is quantized by a pass of its own (``quantize_rows``).
- y = (xq · Wqᵀ) · s_x · s_w + bias. Where the kernel that reads y next can apply the scales (a
  ``linear.Linear`` whose ``readers`` are an add + norm or an activation kernel), the GEMM runs with unit scales (``torch._scaled_mm`` with one scale per
  tensor, cuBLASLt's fastest fp8 kernel at every size measured) and returns ``ScaledRows``; that
  consumer multiplies by s_x · s_w and adds the bias as it loads each element. Elsewhere one
  ``_scaled_mm`` call applies row-wise scales and bias in its epilogue (CUTLASS on Hopper), slower.
  On the CPU both forms are fp32 products of the e4m3 values (``scaled_mm``), and the consumers
  ``materialize``.

What stays in the model dtype, and why: embeddings, norms, rotary, attention (its inputs come
straight from the qkv GEMM; fp8 attention would need its own kernel and scales), pooling and
every head (a few rows per sequence: no time to win). Only the four matmuls of each layer (qkv,
attention output, MLP up/gate, MLP down: ~all weight bytes and FLOPs) run in fp8.

Rounding order follows the bf16 path: the kernels round to the model dtype where HF does (the
normed row, the activation), then quantize that rounded value, as ``quantize_rows`` would.

Measurements behind the defaults: docs/decisions.md, "the kernel plan".

What this module does not own: which form a layer's input comes in (``linear.Linear.reads_fp8``:
from ``plan.FP8_MIN_TOKENS`` tokens, every step) or the load-time accuracy check (engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


from bouquet.engine.linear.fp8_checkpoint import StoredFp8, stored_rows_for
from bouquet.engine.kernels.rows import FP8, FP8_MAX, QRows, ScaledRows, TINY
from bouquet.engine.linear.base import Linear, LinearMethod, linears
from bouquet.engine.plan import DeviceProfile, profile_of


@dataclass
class Fp8Weight:
    """weight [N, K] float8_e4m3fn (row-major: its transpose is the column-major operand
    ``_scaled_mm`` wants), scale [1, N] float32 per output channel."""

    weight: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def quantize(cls, w: torch.Tensor) -> "Fp8Weight":
        """w [N, K] float → per-channel e4m3 (amax / 448 per row of w)."""
        wf = w.detach().float()
        scale = wf.abs().amax(dim=1, keepdim=True).clamp(min=TINY) / FP8_MAX  # [N, 1]
        return cls((wf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous(), scale.t().contiguous())


class Fp8Linear(LinearMethod):
    """fp8 GEMMs for a ``linear.Linear`` fed QRows: built from the layer's weight at load
    (``stored``: e4m3 rows [N, K] and scales [N] a checkpoint already holds, used as they are).
    Deferred scales (a GEMM with unit scales returning ScaledRows) where every reader of the
    layer's output applies them (``readers`` "norm" or "act") and the model is bf16 or fp32 (an fp16
    GEMM output with unit scales could overflow fp16's range); else one row-wise scaled GEMM with the
    bias in its epilogue. The layer's activation (if any) follows (``Linear.activate``)."""

    name = "fp8"

    def __init__(self, stored: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> None:
        self.stored = stored  # dropped once the weights are built
        self.from_checkpoint = stored is not None  # fp8 rows taken from the checkpoint as stored (fp8_checkpoint.py)
        self.weight: Fp8Weight | None = None
        self._one: torch.Tensor | None = None  # [] float32 1.0 on the device: the unit scale, when deferred

    @property
    def deferred(self) -> bool:
        return self._one is not None

    def process_weights_after_loading(self, layer: Linear) -> None:
        s = self.stored
        self.weight = Fp8Weight.quantize(layer.weight) if s is None else Fp8Weight(s[0], s[1][None, :])
        self.stored = None
        if layer.readers != "any" and layer.weight.dtype in (torch.bfloat16, torch.float32):
            self._one = torch.ones((), dtype=torch.float32, device=layer.weight.device)

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False
              ) -> "torch.Tensor | QRows | ScaledRows":
        assert isinstance(x, QRows) and self.weight is not None
        out_dtype = layer.weight.dtype
        w = self.weight
        if self._one is not None:  # unit scales: the consumer applies x.scale · w.scale and the bias
            raw = scaled_mm(x.values, w.weight.t(), self._one, self._one, None, out_dtype)
            y: "torch.Tensor | ScaledRows" = ScaledRows(raw, x.scale, w.scale, layer.bias, out_dtype)
        else:  # _scaled_mm's row-wise mode wants bf16 output on CUDA; fp32 models (CPU) get fp32
            y = scaled_mm(x.values, w.weight.t(), x.scale, w.scale, layer.bias, out_dtype)
        return layer.activate(y, quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        how = "deferred scales" if layer.readers != "any" and layer.weight.dtype != torch.float16 else "row-wise scales"
        return ("fp8 (fp32 emulation)" if profile.kind == "cpu" else "fp8 _scaled_mm") + f", {how}"


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: "torch.Tensor | None", out_dtype: torch.dtype) -> torch.Tensor:
    """(a · b) · scale_a · scale_b + bias → [M, N] ``out_dtype``: a [M, K] and b [K, N] (column-major)
    float8_e4m3fn, scales [] (one per tensor) or [M, 1] / [1, N] float32 (``torch._scaled_mm``'s
    contract). On CUDA that call; on the CPU the e4m3 values, exact in fp32, multiplied as fp32 by
    BLAS: PyTorch's CPU ``_scaled_mm`` took ~1.5 s for one [151, 384] × [384, 1,536] product on the
    2-core CI machine (torch 2.13), ~10⁴× the fp32 matmul, so the CPU fp8 tests ran past their limit.
    Both accumulate in fp32; only the summation order differs."""
    if a.device.type == "cuda":
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)
    y = (a.float() @ b.float()) * scale_a * scale_b
    return (y if bias is None else y + bias.float()).to(out_dtype)


def fp8_linears(model: nn.Module) -> list[Linear]:
    """The Linears of ``model`` that run in fp8 (after ``enable_fp8``)."""
    return [p for p in linears(model) if p.fp8_method is not None]


def _default_kinds(model: nn.Module) -> Iterable[Linear]:
    """Each layer class's fp8 projections by default (its ``FP8_KINDS``)."""
    for m in model.modules():
        fn = getattr(m, "linears", None)
        if callable(fn):
            yield from (p for p in fn() if p.kind in m.FP8_KINDS)


KINDS = ("qkv", "o", "up", "down")  # a layer's matmuls: q/k/v, attention output, MLP in (gate + up), MLP out


def enable_fp8(model: nn.Module, device: torch.device, min_tokens: int, kinds: tuple[str, ...] | None = None,
               stored: "StoredFp8 | None" = None) -> int:
    """Quantize the Linears of ``model`` (after ``fuse``) whose kind is in ``kinds`` (None: each
    layer class's ``FP8_KINDS``); steps of ``min_tokens`` tokens or more then run them in fp8.
    ``stored``: the e4m3 rows of a checkpoint stored in fp8 (fp8_checkpoint.py); a projection whose
    every part is there uses them as they are. Returns how many were quantized.

    Raises ValueError when the model has none (an architecture without an fp8 path), when a
    matmul's sizes are not multiples of 16 (``_scaled_mm``'s rule), or on a CUDA device without
    fp8 tensor cores (compute capability below 8.9: Ada, Hopper and later have them). On the CPU
    the same numbers come from fp32 products of the e4m3 values (``scaled_mm``), without any speed-up."""
    projs = list(linears(model))
    if not projs:
        raise ValueError(f"--quantization fp8 is not supported for {type(model).__name__}: "
                         "it has no engine linear layers")
    profile = profile_of(device)
    if not profile.fp8_tensor_cores:
        raise ValueError(f"--quantization fp8 needs fp8 tensor cores (compute capability 8.9+); {profile.name} has "
                         f"{profile.capability}")
    for p in projs:
        n, k = p.weight.shape
        if n % 16 or k % 16:
            raise ValueError(f"--quantization fp8: a [{n}, {k}] weight is not a multiple of 16 in both sizes")
    chosen = list(_default_kinds(model)) if kinds is None else [p for p in projs if p.kind in kinds]
    for p in chosen:
        quantize_linear(p, min_tokens, stored_rows_for(model, p.weight, stored) if stored is not None else None)
    return len(chosen)


def quantize_linear(layer: Linear, min_tokens: int, stored: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> None:
    """Give ``layer`` its fp8 method (``Fp8Linear(stored)``); steps of ``min_tokens`` tokens or more feed it fp8 rows."""
    layer.fp8_method = Fp8Linear(stored)
    layer.fp8_method.process_weights_after_loading(layer)
    layer.fp8_min_tokens = min_tokens


def set_fp8_min_tokens(model: nn.Module, min_tokens: int | None, kinds: tuple[str, ...] = KINDS) -> None:
    """Move the fp8 threshold of the quantized Linears of these kinds (None: never fp8); for
    the load check and the probes."""
    for p in fp8_linears(model):
        if p.kind in kinds:
            p.fp8_min_tokens = min_tokens


def agreement_name(out_dim: int) -> str:
    """What ``output_cosines`` measures for outputs of ``out_dim`` columns, for messages."""
    return "cosine" if out_dim >= 8 else "score cosine / correlation"


def output_cosines(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Agreement of outputs ``a`` [B, D] with reference outputs ``b`` [B, D] (float), as a float64
    array: per-row cosine when D ≥ 8 (embeddings), else per column over the batch (a scorer's
    logits) the lower of the cosine and the Pearson correlation (the cosine of the centred
    columns). A scorer's classifier bias is a constant offset on every logit: alone the cosine
    reads ~1 for scores the quantization reorders (a bias of 3 on a damaged cross-encoder read
    0.9991), while the correlation sees the ranking; the cosine still sees a shift of all scores.
    A reference column the batch barely moves (spread under 1e-6 of its size) has no ranking to
    keep: its cosine alone counts."""
    x, y = a.double().cpu(), b.double().cpu()
    if x.shape[1] >= 8:
        return F.cosine_similarity(x, y, dim=1, eps=1e-30).numpy()
    x, y = x.t(), y.t()  # [D, B]: each output over the batch
    plain = F.cosine_similarity(x, y, dim=1, eps=1e-30)
    xc, yc = x - x.mean(dim=1, keepdim=True), y - y.mean(dim=1, keepdim=True)
    flat = yc.norm(dim=1) <= 1e-6 * y.norm(dim=1)
    centred = torch.where(flat, plain, F.cosine_similarity(xc, yc, dim=1, eps=1e-30))
    return torch.minimum(plain, centred).numpy()
