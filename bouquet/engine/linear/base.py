"""Linear layers as the engine runs them: a ``Linear`` per projection, and the ``LinearMethod``
that computes it, chosen once at load (``select.assign_methods``, from the kernel plan) — the shape of
vLLM's ``quant_method.apply(layer, x)``: the layer holds the weights and what its readers accept,
the method holds how. Model forwards call ``layer(x)``; they never test the device, the dtype or
the step size.

A projection's input comes in one of two forms, decided upstream by the kernel that writes it
(a norm or activation asks ``reads_fp8(T)``): model-dtype rows go to ``method``, fp8 ``QRows`` to
``fp8_method`` (linear/fp8.py, set by ``quant.enable_fp8``). Outputs: model-dtype rows, or — where
every reader accepts them (``readers``) — ``PartialRows`` (split-K) and ``ScaledRows`` (fp8 with
deferred scales), or, for a layer with an activation (``act``) or a gated activation (``gated``),
the activated rows, as ``QRows`` when ``quantize_out`` (the next projection reads fp8).

``LinearMethod.apply(layer, x, quantize_out)`` is the whole interface; ``describe(layer, T,
profile)`` names the kernel that runs for a step of T tokens (dispatch.py's table).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.linear import triton_gemms as fused_gemms
from bouquet.engine.linear import splitk
from bouquet.engine.kernels.rows import PartialRows, QRows, ScaledRows, dense_rows, materialize
from bouquet.engine.kernels.layers import activation
from bouquet.engine.kernels.ops import FP8_ACTS, act_quant, gelu_mul, gelu_tanh_mul, linear_gelu, quantize_rows, silu_mul
from bouquet.engine.plan import (GATE_UP_MIN_TOKENS, GATE_UP_MIN_WAVES, SMALL_MAX_OUTPUTS, SMALL_MAX_TOKENS,
                                 SPLITK_MAX_TOKENS, DeviceProfile, gate_up_smem, gate_up_tiles, small_tiles,
                                 splitk_plan)

Out = "torch.Tensor | QRows | ScaledRows | PartialRows"
# act(gate) · up of a [T, 2I] gate/up output (gate columns first), by the kernels' activation name;
# all but erf GELU can write fp8 rows from the same kernel
GATED_ACTS: dict[str, Callable[..., "torch.Tensor | QRows"]] = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}
READERS = ("norm", "act", "any")  # who reads a plain projection's output: an add + norm kernel, an activation, anything


class Linear:
    """One projection: ``weight`` [N, K], ``bias`` [N] | None (views of the model's parameters,
    which stay registered under their Hugging Face names; not an nn.Module).

    kind: "qkv" | "o" | "up" | "down" (quant.KINDS); readers: what reads the output (``READERS``:
    "norm" takes PartialRows and ScaledRows, "act" ScaledRows); act: a Hugging Face activation
    name applied to the output (BERT's intermediate); gated: the kernels' activation name of a
    gate/up projection whose output is act(gate) · up (weight rows: gate, then up)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str, readers: str = "any",
                 act: str | None = None, gated: str | None = None, module: nn.Linear | None = None) -> None:
        assert readers in READERS, readers
        self.weight, self.bias, self.kind, self.readers = weight, bias, kind, readers
        self.act, self.gated, self.module = act, gated, module
        if act is not None:
            activation(act)  # unknown activations fail at load
        self.method: LinearMethod = CublasLinear()
        self.fp8_method: LinearMethod | None = None  # quant.Fp8Linear once quant.enable_fp8 ran
        self.fp8_min_tokens: int | None = None

    @classmethod
    def of(cls, linear: nn.Linear, kind: str, readers: str = "any", act: str | None = None) -> "Linear":
        return cls(linear.weight, linear.bias, kind, readers, act, module=linear)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.weight.shape
        return (n // 2 if self.gated else n), k

    def reads_fp8(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens (static per CUDA-graph bucket) feeds this layer fp8 rows."""
        return self.fp8_min_tokens is not None and tokens >= self.fp8_min_tokens

    def rows(self, x: "torch.Tensor | QRows") -> "torch.Tensor | QRows":
        """``x`` in the form this layer reads for its step: QRows (keeping the model-dtype rows as
        ``dense``) when it reads fp8, else the model-dtype rows; one quantization pass where x
        was written in the model dtype (an attention output, a first layer's input)."""
        if not self.reads_fp8(x.shape[0]):
            return dense_rows(x)
        if isinstance(x, QRows):
            return x
        q = quantize_rows(x)
        q.dense = x
        return q

    def __call__(self, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        """x [T, K] → [T, N] (act / gated: the activated rows, QRows with ``quantize_out``)."""
        if isinstance(x, QRows):
            assert self.fp8_method is not None, "fp8 activations reached a layer without fp8 weights"
            return self.fp8_method.apply(self, x, quantize_out)
        return self.method.apply(self, x, quantize_out)

    def activate(self, y: "torch.Tensor | ScaledRows", quantize_out: bool) -> Out:
        """The layer's activation on a GEMM output ``y`` (a gated one: [T, 2I] → [T, I])."""
        if self.gated is not None:
            return GATED_ACTS[self.gated](y, quantize_out) if self.gated in GATED_ACTS else _erf_gated(y, quantize_out)
        if self.act is None:
            return y
        if quantize_out:
            return act_quant(y, FP8_ACTS[self.act])
        return activation(self.act)(materialize(y))


def _erf_gated(y: "torch.Tensor | ScaledRows", quantize_out: bool) -> "torch.Tensor | QRows":
    return act_quant(y, "gelu", gated=True) if quantize_out else gelu_mul(materialize(y))


class LinearMethod:
    """How a ``Linear`` computes its output from model-dtype rows (or, quant.Fp8Linear, from QRows).

    ``process_weights_after_loading(layer)``: once, after the weights are on the device and fused
    (quantize, re-lay out); ``apply(layer, x, quantize_out)``: x [T, K] → the layer's output form
    (see the module docstring); ``describe(layer, T, profile)``: the kernel(s) a step of T tokens
    runs, for the dispatch table."""

    name = "base"

    def process_weights_after_loading(self, layer: Linear) -> None:
        pass

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        raise NotImplementedError

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        return self.name


def _cublas_out(layer: Linear, x: torch.Tensor, quantize_out: bool) -> Out:
    """cuBLAS (PyTorch) GEMM, then the layer's activation (BERT's intermediate: cuBLASLt's bias + GELU epilogue)."""
    if layer.act is not None and layer.gated is None:
        assert layer.module is not None
        g = linear_gelu(x, layer.module, layer.act)
        return quantize_rows(g) if quantize_out else g
    return layer.activate(F.linear(x, layer.weight, layer.bias), quantize_out)


def _cublas_name(layer: Linear) -> str:
    if layer.gated is not None:
        return "cuBLAS + gated act kernel"
    return "cuBLASLt bias+GELU" if layer.act is not None else "cuBLAS"


class CublasLinear(LinearMethod):
    """PyTorch's GEMM (cuBLAS on CUDA, BLAS on the CPU) and the layer's activation kernel."""

    name = "cuBLAS"

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        return _cublas_out(layer, x, quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        return "BLAS" if profile.kind == "cpu" else _cublas_name(layer)


class SplitKLinear(LinearMethod):
    """Steps of at most ``plan.SPLITK_MAX_TOKENS`` tokens: the split-K Triton GEMM (splitk.py),
    returning PartialRows for the add + norm reader; cuBLAS where no tile plan fits."""

    name = "split-K"

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        if x.shape[0] <= SPLITK_MAX_TOKENS and splitk.usable(x):
            parts = splitk.splitk_linear(x, layer.weight, layer.bias)
            if parts is not None:
                return parts
        return _cublas_out(layer, x, quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        n, k = layer.shape
        plan = splitk_plan(tokens, n, k, profile.sms)
        return f"split-K Triton ({plan.parts} parts)" if plan is not None else _cublas_name(layer)


class SmallTritonLinear(LinearMethod):
    """Steps of at most ``plan.SMALL_MAX_TOKENS`` tokens: one Triton GEMM with the bias and the
    activation in its epilogue (fused_gemms.small_linear; plain outputs up to
    ``SMALL_MAX_OUTPUTS``), launched with PDL; cuBLAS otherwise."""

    name = "small-step Triton"

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        y = fused_gemms.small_linear(x, layer.weight, layer.bias, layer.act)  # None above its limits
        if y is None:
            return _cublas_out(layer, x, quantize_out)
        return quantize_rows(y) if quantize_out else y

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        n, k = layer.shape
        ok = tokens <= SMALL_MAX_TOKENS and tokens * n <= SMALL_MAX_OUTPUTS and small_tiles(tokens, n, k, profile.sms)
        return "small-step Triton" if ok else _cublas_name(layer)


class GatedTritonLinear(LinearMethod):
    """A gate/up projection with act(gate) · up in the Triton GEMM's epilogue: small steps
    (``small``: fused_gemms.small_gate_up_act, up to ``SMALL_MAX_TOKENS``), large ones (``large``:
    fused_gemms.gate_up_act, from ``GATE_UP_MIN_TOKENS`` and enough tiles); cuBLAS + the gated
    activation kernel otherwise, and whenever the next projection reads fp8."""

    name = "gate/up Triton"

    def __init__(self, small: bool, large: bool) -> None:
        self.small, self.large = small, large

    def apply(self, layer: Linear, x: "torch.Tensor | QRows", quantize_out: bool = False) -> Out:
        small = x.shape[0] <= SMALL_MAX_TOKENS
        if (self.small if small else self.large) and not quantize_out:
            fn = fused_gemms.small_gate_up_act if small else fused_gemms.gate_up_act
            h = fn(x, layer.weight, layer.gated)  # None where it does not apply
            if h is not None:
                return h
        return _cublas_out(layer, x, quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        i, k = layer.shape
        if tokens <= SMALL_MAX_TOKENS and self.small and small_tiles(tokens, i, k, profile.sms):
            return "small-step Triton gate/up+act"
        if (tokens > SMALL_MAX_TOKENS and self.large and tokens >= GATE_UP_MIN_TOKENS and k % 64 == 0
                and i % 8 == 0 and profile.tma_smem(gate_up_smem())
                and gate_up_tiles(tokens, i) >= GATE_UP_MIN_WAVES * profile.sms):
            return "Triton gate/up+act (TMA)"
        return _cublas_name(layer)


def linears(model: nn.Module) -> Iterable[Linear]:
    """Every Linear the model's layers hold (modules with a ``linears()`` method)."""
    for m in model.modules():
        fn = getattr(m, "linears", None)
        if callable(fn):
            yield from fn()
