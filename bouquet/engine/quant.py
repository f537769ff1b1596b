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
  projection built with ``defer=True`` by a model that knows its consumer: add + norm, or the
  gated activation), the GEMM runs with unit scales (``torch._scaled_mm`` with one scale per
  tensor, cuBLASLt's fastest fp8 kernel at every size measured) and returns ``ScaledRows``; that
  consumer multiplies by s_x · s_w and adds the bias as it loads each element. Elsewhere one
  ``_scaled_mm`` call applies row-wise scales and bias in its epilogue (CUTLASS on Hopper), slower
  (bench/results/h200-2026-11-30e/call1-gemm.json) and, below ~1,024 tokens, slower than bf16.
  On the CPU both forms are fp32 products of the e4m3 values (``scaled_mm``), and the consumers
  ``materialize``.

What stays in the model dtype, and why: embeddings, norms, rotary, attention (its inputs come
straight from the qkv GEMM; fp8 attention would need its own kernel and scales), pooling and
every head (a few rows per sequence: no time to win). Only the four matmuls of each layer (qkv,
attention output, MLP up/gate, MLP down: ~all weight bytes and FLOPs) run in fp8.

Rounding order follows the bf16 path: the kernels round to the model dtype where HF does (the
normed row, the activation), then quantize that rounded value, as ``quantize_rows`` would.

What this module does not own: when a forward pass uses fp8 (the layers ask
``Projection.use_fp8(T)``; ``FP8_MIN_TOKENS`` in config.py: every step) or the load-time accuracy
check (engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


from bouquet.engine import fused_gemms, splitk
from bouquet.engine.cpu_linear import CpuLinear
from bouquet.engine.fp8_checkpoint import StoredFp8, stored_rows_for
from bouquet.engine.fp8_rows import FP8, FP8_MAX, PartialRows, QRows, ScaledRows, TINY


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


class Projection:
    """One linear layer as the engine runs it: ``weight`` [N, K] and ``bias`` [N] | None in the
    model dtype, plus an ``Fp8Weight`` once ``quantize`` ran. Called with model-dtype rows it is
    ``F.linear``; called with ``QRows`` it is the fp8 GEMM. Output [T, N] in the model dtype.

    ``defer``: every reader of this projection's output accepts ``ScaledRows`` (the model says so
    when it builds the projection), so in fp8 it returns them instead of applying the scales.
    ``split_k``: every reader is an add + norm kernel, which also accepts ``PartialRows``, so a
    small model-dtype batch runs the split-K GEMM (splitk.py) where it has a plan. ``small_gemm``
    (set by the engine): small model-dtype steps run ``fused_gemms.small_linear`` instead of cuBLAS.

    Not an nn.Module: the parameters stay registered (by their Hugging Face names) on the modules
    they came from; this holds views of them."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str, defer: bool = False,
                 split_k: bool = False) -> None:
        self.weight, self.bias = weight, bias
        self.kind = kind  # one of KINDS: which matmul of the layer this is
        self.defer = defer
        self.split_k = split_k  # the engine turns it off for all (Engine(split_k=False))
        self.small_gemm = False  # the engine's choice (qkv, Engine(small_gemms=...)): small steps' Triton GEMM
        self.fp8: Fp8Weight | None = None
        self.fp8_stored = False  # fp8 rows taken from the checkpoint as stored (fp8_checkpoint.py)
        self.fp8_min_tokens: int | None = None
        self._one: torch.Tensor | None = None  # [] float32 1.0 on the device: the unit scale, when deferred
        self.cpu: "CpuLinear | None" = None  # the engine's CPU kernel for model-dtype rows (cpu_linear.attach)

    @classmethod
    def of(cls, linear: nn.Linear, kind: str, defer: bool = False, split_k: bool = False) -> "Projection":
        return cls(linear.weight, linear.bias, kind, defer, split_k)

    @property
    def deferred(self) -> bool:
        """Whether fp8 calls return ScaledRows: ``defer`` and a bf16 or fp32 model (an fp16 GEMM
        output with unit scales could overflow fp16's range)."""
        return self._one is not None

    def quantize(self, min_tokens: int, stored: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> None:
        """Build the fp8 weights (``stored``: e4m3 rows [N, K] and scales [N] a checkpoint already
        holds, used as they are; else quantized from the weight); forward passes of at least
        ``min_tokens`` tokens use them."""
        self.fp8 = Fp8Weight.quantize(self.weight) if stored is None else Fp8Weight(stored[0], stored[1][None, :])
        self.fp8_stored = stored is not None
        if self.defer and self.weight.dtype in (torch.bfloat16, torch.float32):
            self._one = torch.ones((), dtype=torch.float32, device=self.weight.device)
        self.fp8_min_tokens = min_tokens

    def use_fp8(self, tokens: int) -> bool:
        """Whether a forward pass of ``tokens`` (static per CUDA-graph bucket) runs this in fp8."""
        return self.fp8_min_tokens is not None and tokens >= self.fp8_min_tokens

    def __call__(self, x: "torch.Tensor | QRows") -> "torch.Tensor | ScaledRows | PartialRows":
        if not isinstance(x, QRows):
            if self.cpu is not None:
                return self.cpu.apply(x)
            if self.split_k and x.shape[0] <= splitk.MAX_TOKENS and splitk.usable(x):
                parts = splitk.splitk_linear(x, self.weight, self.bias)
                if parts is not None:
                    return parts
            if self.small_gemm:
                y = fused_gemms.small_linear(x, self.weight, self.bias)  # None above its token limit
                if y is not None:
                    return y
            return F.linear(x, self.weight, self.bias)
        assert self.fp8 is not None, "fp8 activations reached a layer without fp8 weights"
        out_dtype = self.weight.dtype
        if self._one is not None:  # unit scales: the consumer applies x.scale · fp8.scale and the bias
            raw = scaled_mm(x.values, self.fp8.weight.t(), self._one, self._one, None, out_dtype)
            return ScaledRows(raw, x.scale, self.fp8.scale, self.bias, out_dtype)
        # _scaled_mm's row-wise mode wants bf16 output on CUDA; fp32 models (CPU) get fp32
        return scaled_mm(x.values, self.fp8.weight.t(), x.scale, self.fp8.scale, self.bias, out_dtype)


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


def projections(model: nn.Module, defaults_only: bool = False) -> Iterable[Projection]:
    """Every Projection the model's layers hold (modules with a ``projections()`` method); with
    ``defaults_only`` the kinds each layer class runs in fp8 by default (its ``FP8_KINDS``)."""
    for m in model.modules():
        fn = getattr(m, "projections", None)
        if callable(fn):
            yield from (p for p in fn() if not defaults_only or p.kind in m.FP8_KINDS)


KINDS = ("qkv", "o", "up", "down")  # a layer's matmuls: q/k/v, attention output, MLP in (gate + up), MLP out


def enable_fp8(model: nn.Module, device: torch.device, min_tokens: int, kinds: tuple[str, ...] | None = None,
               stored: "StoredFp8 | None" = None) -> int:
    """Quantize the Projections of ``model`` (after ``fuse``) whose kind is in ``kinds`` (None: each
    layer class's ``FP8_KINDS``); steps of ``min_tokens`` tokens or more then run them in fp8.
    ``stored``: the e4m3 rows of a checkpoint stored in fp8 (fp8_checkpoint.py); a projection whose
    every part is there uses them as they are. Returns how many were quantized.

    Raises ValueError when the model has none (an architecture without an fp8 path), when a
    matmul's sizes are not multiples of 16 (``_scaled_mm``'s rule), or on a CUDA device without
    fp8 tensor cores (compute capability below 8.9: Ada, Hopper and later have them). On the CPU
    the same numbers come from fp32 products of the e4m3 values (``scaled_mm``), without any speed-up."""
    projs = list(projections(model))
    if not projs:
        raise ValueError(f"--quantization fp8 is not supported for {type(model).__name__}: "
                         "only the BERT-family encoders and the decoders have an fp8 path")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"--quantization fp8 needs fp8 tensor cores (compute capability 8.9+); {name} has "
                         f"{torch.cuda.get_device_capability(device)}")
    for p in projs:
        n, k = p.weight.shape
        if n % 16 or k % 16:
            raise ValueError(f"--quantization fp8: a [{n}, {k}] weight is not a multiple of 16 in both sizes")
    chosen = list(projections(model, defaults_only=True)) if kinds is None else [p for p in projs if p.kind in kinds]
    for p in chosen:
        p.quantize(min_tokens, stored_rows_for(model, p.weight, stored) if stored is not None else None)
    return len(chosen)


def set_fp8_min_tokens(model: nn.Module, min_tokens: int | None, kinds: tuple[str, ...] = KINDS) -> None:
    """Move the fp8 threshold of the quantized Projections of these kinds (None: never fp8); for
    the load check and the probes."""
    for p in projections(model):
        if p.fp8 is not None and p.kind in kinds:
            p.fp8_min_tokens = min_tokens


def use_rowwise_scales(model: nn.Module, min_tokens: int) -> None:
    """Run every quantized Projection as before deferred scales: row-wise scaled GEMMs, from
    ``min_tokens`` tokens on. For benchmarks (``engine-fp8-rowwise``: the baseline beside the default)."""
    for p in projections(model):
        if p.fp8 is not None:
            p._one = None
            p.fp8_min_tokens = min_tokens


def output_cosines(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Agreement of two [B, D] float outputs, as a float64 array: per-row cosine when D ≥ 8 (embeddings),
    else per-column cosine over the batch (a scorer's logits)."""
    x, y = a.double().cpu(), b.double().cpu()
    if x.shape[1] < 8:
        x, y = x.t(), y.t()
    return F.cosine_similarity(x, y, dim=1, eps=1e-30).numpy()
