"""CPU linear layers: oneDNN with prepacked weights (fp32 / bf16) and int8 with dynamic per-token
activation scales, plus the CPU's dtype choice (``--dtype auto`` on the CPU).

Each kernel class holds one projection's weight [N, K] and bias [N] | None in the form its kernel
reads, built once at load (``prepare``), and computes ``apply(x [T, K]) → [T, N]`` in x's dtype.
``CpuMethod`` is the linear method (linear/base.py) that runs one of them, then the layer's
activation: the kernel plan gives every fp32 / bf16 projection on the CPU a ``OneDnnMethod``
(``select.method_for``), and ``--quantization int8`` swaps in ``Int8Linear`` kernels (runtime/cpu_plan.py).

Why these kernels (issue 42; 2-core AVX-512 machine with AVX512-BF16 and VNNI, torch 2.13, 10th
percentile of 200 calls, all-MiniLM-L6-v2's shapes; docs/decisions.md has the table):
- ``OneDnnLinear``: ``torch.ops.mkldnn._linear_pointwise`` over a weight reordered once into
  oneDNN's blocked layout (``_reorder_linear_weight``), the kernel inductor's CPU backend emits for
  linears. At 14 tokens it beats ``F.linear`` (MKL sgemm / oneDNN with a reorder per call):
  q/k/v 122 → 75 µs fp32, 67 → 45 µs bf16; bulk (2,048 tokens) is on par.
- ``Int8Linear``: int8 × int8 → int32 products with VNNI (``torch._int_mm``, oneDNN), weights
  per output channel, activations per token (row), symmetric, both scaled to ±127. Per token, so
  a text's vector never depends on the batch it was stepped with (torch's
  ``quantized.linear_dynamic`` scales a whole batch by one factor: faster at 14 tokens, but a
  long outlier text in the batch would change every other text's rounding).

What this module does not own: which projections run int8 and the load-time accuracy gate
(runtime/cpu_plan.py), the CPU's flags (read by the engine at load, passed in here).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch
import torch.nn.functional as F

from bouquet.engine.linear.base import Linear, LinearMethod, Out
from bouquet.engine.plan import DeviceProfile

# CPU flags (Linux /proc/cpuinfo names) with native bf16 dot products: AVX512-BF16 (Cooper Lake,
# Sapphire Rapids, Zen 4+) and AMX-BF16 (Sapphire Rapids+). Without them bf16 GEMMs convert in
# software and run slower than fp32.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Hugging Face activation name → oneDNN's GELU post-op algorithm (erf: "none", tanh approximation: "tanh")
GELU_POST_OPS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
INT8_SCALE = 127.0  # symmetric int8: |q| ≤ 127 (−128 unused, so −x rounds to −q)
UNPADDED_MAX_ROWS = 16  # row counts a CPU kernel runs as they come (padded_rows)
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength: the paper's default for encoder-sized models


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's ``flags`` line of /proc/cpuinfo as a set; empty where the file is
    absent or has none (not Linux): the dtype choice then falls back to fp32."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_dtype(flags: Iterable[str]) -> str:
    """``--dtype auto`` on the CPU: "bfloat16" where the CPU has native bf16 dot products
    (``BF16_FLAGS``), else "float32". Pure: the caller reads the flags (``cpu_flags``)."""
    return "bfloat16" if BF16_FLAGS & set(flags) else "float32"


class CpuLinear(Protocol):
    """One projection on the CPU: ``apply(x [T, K]) → [T, N]`` in x's dtype."""

    def apply(self, x: torch.Tensor) -> torch.Tensor: ...


class OneDnnLinear:
    """x · Wᵀ + b through oneDNN with the weight reordered once (fp32 or bf16, the weight's dtype).
    ``prepare`` raises RuntimeError where torch has no mkldnn (a build without oneDNN)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed, self.bias = packed, bias

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None, tokens_hint: int = 16) -> "OneDnnLinear":
        """weight [N, K], bias [N] | None, fp32 or bf16 on the CPU. ``tokens_hint``: the row count
        the reorder is tuned for (any count works; batch 1's ~16 tokens is the latency case)."""
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), tokens_hint)
        return cls(packed, None if bias is None else bias.detach().contiguous())

    def apply(self, x: torch.Tensor, gelu: str = "") -> torch.Tensor:
        """``gelu``: "" none, "none" (erf GELU) or "tanh" (tanh GELU), as oneDNN's post-op on the
        fp32 accumulator, before the one rounding to x's dtype."""
        if gelu:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "gelu", [], gelu)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


class Int8Linear:
    """x [T, K] (fp32 / bf16) → (q(x / m) · q(W · m)ᵀ) · s_x · s_w + b [T, N] in x's dtype, with
    q(W · m) int8 per output channel (s_w[n] = max_k |W[n, k] m[k]| / 127) and q(x / m) int8 per row,
    computed per call (s_x[t] = max_k |x[t, k] / m[k]| / 127), int32 accumulation
    (``torch._int_mm``), scales and bias in fp32.

    m [K]: SmoothQuant's per-input-channel migration (Xiao et al. 2023), m[k] = a[k]^α / w[k]^(1−α)
    with a[k] the largest |x[:, k]| seen on a calibration batch, w[k] = max_n |W[n, k]|, α = 0.5:
    encoders' LayerNorm outputs carry a few channels tens of times larger than the rest, which a
    per-token scale alone spends all its levels on. Without ``act_max`` m = 1 (plain per-token /
    per-channel int8)."""

    def __init__(self, weight_t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 inv_smooth: torch.Tensor | None) -> None:
        self.weight_t, self.scale, self.bias = weight_t, scale, bias  # [K, N] int8, [N] fp32, [N] fp32 | None
        self.inv_smooth = inv_smooth  # [K] fp32: 1 / m, or None

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None, act_max: torch.Tensor | None = None,
                alpha: float = SMOOTH_ALPHA) -> "Int8Linear":
        """weight [N, K], bias [N] | None, any float dtype; act_max [K] float | None: per-channel
        max |x| of a calibration batch."""
        w = weight.detach().float()
        inv = None
        if act_max is not None:
            m = (act_max.float().clamp(min=1e-5) ** alpha / w.abs().amax(dim=0).clamp(min=1e-5) ** (1 - alpha))
            w, inv = w * m, (1.0 / m).contiguous()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / INT8_SCALE  # [N]
        q = torch.round(w / scale[:, None]).clamp(-INT8_SCALE, INT8_SCALE).to(torch.int8)
        return cls(q.t().contiguous(), scale, None if bias is None else bias.detach().float(), inv)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        # In-place passes on same-dtype tensors: at bulk sizes PyTorch's mixed-dtype ops (int32 ×
        # fp32, bf16 × fp32) and linalg.vector_norm cost 2-5× the GEMM itself (profiled, 2,048 × 384).
        xf = x.to(torch.float32, copy=True)  # [T, K]: a copy even when x is fp32 (the passes below are in place)
        if self.inv_smooth is not None:
            xf.mul_(self.inv_smooth)
        # max |x| per row from the row max and min: no [T, K] temporary (a fresh multi-MB one
        # costs its page faults on every call)
        s = torch.maximum(xf.amax(dim=1, keepdim=True), xf.amin(dim=1, keepdim=True).neg_())
        s = s.clamp_(min=1e-12).div_(INT8_SCALE)  # [T, 1]
        xq = xf.div_(s).round_().to(torch.int8)  # [T, K]
        acc = torch._int_mm(xq, self.weight_t)  # [T, N] int32 (on the CPU any T, unlike CUDA's T > 16)
        y = acc.float().mul_(s).mul_(self.scale)  # [T, N] fp32
        return (y if self.bias is None else y.add_(self.bias)).to(x.dtype)


class MaxRecorder:
    """Calibration: wraps a CpuLinear, records the per-input-channel max |x| [K] fp32 of the rows
    it sees (``act_max``), and computes as the wrapped one."""

    def __init__(self, inner: CpuLinear) -> None:
        self.inner = inner
        self.act_max: torch.Tensor | None = None

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        m = x.detach().abs().amax(dim=0).float()
        self.act_max = m if self.act_max is None else torch.maximum(self.act_max, m)
        return self.inner.apply(x)


def padded_rows(tokens: int) -> int:
    """The row count a CPU kernel runs ``tokens`` rows at: up to 16 as they are, then the next of
    32, 48, 64, then four steps per doubling (80, 96, 112, 128, 160, ...). oneDNN (the CPU linears here, and PyTorch's own
    bf16 GEMM) builds and caches a primitive per input shape, ~0.6 MB each: rows as they come (every
    batch a new count) grew a served replica's memory by ~250 MB per 400 counts per weight shape;
    51 row counts up to 16,384 keep it bounded, for at most 15 padded rows up to 64 and 25% above."""
    if tokens <= UNPADDED_MAX_ROWS:
        return tokens  # as they come: at most 16 counts, and batch 1 pays no padding op
    if tokens <= 64:
        return -(-tokens // 16) * 16
    step = 1 << (tokens - 1).bit_length() - 3  # a quarter of the power of two below
    return -(-tokens // step) * step


class CpuMethod(LinearMethod):
    """A ``CpuLinear`` kernel on model-dtype rows, then the layer's activation (BERT's
    intermediate, a gated MLP's act(gate) · up): the CPU's linear method. fp8 rows (QRows) go to
    the layer's ``fp8_method`` as on the GPU."""

    name = "CPU kernel"

    def __init__(self, kernel: CpuLinear | None = None, name: str | None = None) -> None:
        self.kernel = kernel
        if name is not None:
            self.name = name

    def apply(self, layer: Linear, x: "torch.Tensor", quantize_out: bool = False) -> Out:
        assert self.kernel is not None, "a CPU method ran before its weights were prepared"
        return layer.activate(_rows(self.kernel.apply, x), quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        return self.name


def _rows(fn: "Callable[..., torch.Tensor]", x: torch.Tensor, *args: str) -> torch.Tensor:
    """``fn(x [T, K], *args)`` → [T, N], run at ``padded_rows(T)`` rows (zero rows appended and cut off)."""
    t = x.shape[0]
    if t <= UNPADDED_MAX_ROWS:
        return fn(x, *args)
    p = padded_rows(t)
    if p == t:
        return fn(x, *args)
    return fn(F.pad(x, (0, 0, 0, p - t)), *args)[:t]


class OneDnnMethod(CpuMethod):
    """``OneDnnLinear`` over the layer's weight, prepacked once at load (a model built on the meta
    device, as the dispatch table builds one, has no weights to pack)."""

    name = "oneDNN, prepacked"
    kernel: OneDnnLinear | None
    whole: bool = False  # the GEMM alone computes the layer (no activation after it); fixed at load
    post: str = ""  # its oneDNN GELU post-op ("none": erf, "tanh"), BERT's intermediate: one pass fewer over [T, I]

    def process_weights_after_loading(self, layer: Linear) -> None:
        if not layer.weight.is_meta:
            self.kernel = OneDnnLinear.prepare(layer.weight, layer.bias)
        self.post = GELU_POST_OPS.get(layer.act or "", "") if layer.gated is None else ""
        self.whole = layer.gated is None and (layer.act is None or bool(self.post))

    def apply(self, layer: Linear, x: "torch.Tensor", quantize_out: bool = False) -> Out:
        # one call deep where the GEMM is the whole layer: a batch-1 step on 2 cores is ~2 ms for
        # 24 of these, and each Python frame on the way costs ~1 µs
        if self.whole and not quantize_out and self.kernel is not None:
            return _rows(self.kernel.apply, x, self.post)
        return super().apply(layer, x, quantize_out)

    def describe(self, layer: Linear, tokens: int, profile: DeviceProfile) -> str:
        fused = layer.gated is None and (layer.act or "") in GELU_POST_OPS
        return self.name + (" (+GELU)" if fused else "")
