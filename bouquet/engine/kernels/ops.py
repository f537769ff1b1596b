"""Fused device kernels used by the models, each with a plain-PyTorch fallback.

- ``add_layer_norm(x, residual, ln)``: LayerNorm(x + residual) in one pass (BERT, XLM-R); the
  one pass instead of an add and a LayerNorm pass.
- ``add_layer_norm_pre(x, residual, ln)``: the same for a pre-norm encoder (ModernBERT, LayerNorm
  without bias): returns the normed rows and the new residual stream, like ``add_rms_norm``.
- ``add_rms_norm(x, residual, norm)``: the pre-norm decoder's "residual add, then RMSNorm" in one
  pass, returning both the normed rows and the new residual stream (the decoders; Gemma's
  (1 + weight) norms included).
Both take (rows, residual, norm module) in that order.
- ``qk_norm_rope(qkv, ...)``: per-head q/k RMSNorm (Qwen3, Gemma3; none for Qwen2, Mistral) and
  rotary embedding in one pass, in place in the fused QKV projection's output.
- ``silu_mul(gate_up)`` / ``gelu_tanh_mul(gate_up)`` / ``gelu_mul(gate_up)``: act(gate) · up of
  the fused gate/up projection (the gated MLPs: SiLU for Qwen/Mistral, tanh-GELU for Gemma, erf
  GELU for ModernBERT's GeGLU).
- ``linear_gelu(x, linear, act)``: BERT's intermediate dense + GELU as one cuBLASLt GEMM with a
  bias+GELU epilogue. The epilogue is the tanh form of GELU; BERT's is erf. The two differ by at
  most ~5e-4 (absolute), under one bf16 rounding step for any activation above 0.06 in size, so
  it is used only for fp16/bf16 on CUDA; fp32 and the CPU keep the exact erf form.

fp8 (``--quantization fp8``, linear/fp8.py): ``add_rms_norm``, ``add_layer_norm``, ``silu_mul`` and
``gelu_tanh_mul`` take ``fp8=True`` to write their output as ``QRows`` (e4m3 values and one float32
scale per row, amax / 448) from the same kernel; ``act_quant`` / ``quantize_rows`` do it for other
activations and for rows written elsewhere (attention output). ``quantize_reference`` is the rule.
The same four functions (and ``act_quant``) also take ``ScaledRows`` as their input ``x``: an fp8
GEMM's output whose per-row and per-column scales (and bias) are still to be applied; the kernel
applies them as it loads each element (``materialize`` is the same in PyTorch). ``add_rms_norm``
and ``add_layer_norm`` also take ``PartialRows`` (a split-K GEMM's parts, splitk.py) and add them up.

Why: unfused, a Qwen3 forward pass at batch 1 is mostly small elementwise kernels (fp32 RMSNorm,
rotary and the SiLU gate as separate passes), so the replay time is mostly their launch latency, and at large batches each is a
full memory pass over [T, hidden] in fp32.

Precision follows Hugging Face's modules (``Qwen3RMSNorm``, ``apply_rotary_pos_emb``, ``BertLayer``):
statistics in fp32; where HF rounds to the model dtype between steps (the residual sum, the
normalized row before the weight multiply, the SiLU output) the kernels round at the same place.
Rotary is computed in fp32 from fp32 cos/sin tables and rounded once (HF rounds cos/sin and each
product to bf16 first): the kernels are slightly more exact, never less.

What this module does not own: choosing to use a kernel (models call these; each falls back by
itself on the CPU, in fp32, or when Triton is missing).
"""
from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

from bouquet.engine.kernels.rows import (FP8, PartialRows, QRows, ScaledRows, materialize, norm_input_args,
                                     quantize_reference, unscale_args)
from bouquet.engine.kernels.layers import RMSNorm, activation
from bouquet.engine.kernels.pdl import launch_options

_FUSED_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def triton_kernels() -> ModuleType | None:
    """The Triton kernels (engine/kernels/triton_kernels.py), imported on first use; None without Triton."""
    try:
        from bouquet.engine.kernels import triton_kernels as kernels
    except ImportError:
        return None
    return kernels


def _fused(x: torch.Tensor, dtype: torch.dtype | None = None) -> ModuleType | None:
    """The kernels when ``x`` can use them (CUDA, fp16/bf16 — or ``dtype``, the true values'
    dtype of an fp32 PartialRows —, Triton present), else None."""
    return triton_kernels() if x.is_cuda and (dtype or x.dtype) in _FUSED_DTYPES else None


def _norm_kind(args: dict[str, object]) -> str:
    """pdl.KERNELS' name for an add + norm launch (``norm_input_args``' arguments): "norm_parts"
    when it reads split-K parts (its predecessor is our split-K kernel), else "norm"."""
    return "norm_parts" if args["PARTS"] != 1 else "norm"


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8


_MAX_ROW = 16384  # one program holds a whole row in registers


def row_parts(n: int) -> tuple[int, int, int]:
    """A row of ``n`` columns as at most three power-of-two tiles, largest first (0 = none), for
    ``kernels.act_quant_kernel``: the binary digits of ``n`` when it has at most three, none below
    128 (3,072 → 2,048 + 1,024; 768 → 512 + 256), else one tile of the next power of two whose
    masked tail the kernel skips."""
    bits = [1 << i for i in reversed(range(n.bit_length())) if n >> i & 1]
    if len(bits) > 3 or (len(bits) > 1 and bits[-1] < 128):
        bits = [1 << (n - 1).bit_length()]
    a, b, c = bits + [0] * (3 - len(bits))
    return a, b, c


def act_quant(x: "torch.Tensor | ScaledRows", act: str = "identity", gated: bool = False) -> QRows:
    """x [T, K] (or [T, 2K] with ``gated``: gate columns first, then up) in fp16/bf16/fp32 →
    QRows of act(x) (or act(gate) · up), [T, K]. ``act``: identity | silu | gelu_tanh | gelu (erf).
    One Triton kernel on CUDA (fp16/bf16); PyTorch otherwise, with the same rounding steps."""
    raw, scaled = unscale_args(x)
    n = raw.shape[1] // 2 if gated else raw.shape[1]
    k = _fused(raw)
    if k is None or n > _MAX_ROW or raw.stride(1) != 1:
        x = materialize(x)
        g = x[:, :n] if gated else x
        a = _ACT_FNS[act](g)
        if gated:
            a = a * x[:, n:]
        return QRows(*quantize_reference(a))
    T = raw.shape[0]
    q = torch.empty((T, n), dtype=FP8, device=raw.device)
    scale = torch.empty((T, 1), dtype=torch.float32, device=raw.device)
    if T:
        parts = row_parts(n)
        k.act_quant_kernel[(T,)](raw, q, scale, n_cols=n, x_stride=raw.stride(0), ACT=_ACT_CODES[act], GATED=gated,
                                 BLOCK=parts[0], BLOCK1=parts[1], BLOCK2=parts[2],
                                 num_warps=4 if parts[0] <= 2048 else 8 if parts[0] <= 8192 else 16, **scaled,
                                 **launch_options(raw, "act_quant", T))
    return QRows(q, scale)


def quantize_rows(x: torch.Tensor) -> QRows:
    """x [T, K] → QRows [T, K]: the one separate quantization pass (the attention output, and the
    first layer's input of a post-norm encoder)."""
    return act_quant(x, "identity")


def add_layer_norm(x: "torch.Tensor | ScaledRows | PartialRows", residual: torch.Tensor, ln: torch.nn.LayerNorm,
                   fp8: bool = False) -> "torch.Tensor | QRows":
    """x, residual [T, H] (same dtype; x may be ScaledRows or PartialRows) → LayerNorm(x + residual) [T, H],
    ``ln``'s weight/bias/eps. With ``fp8``: QRows of that output, ``dense`` holding the output
    itself (a post-norm encoder's next residual), both written by the same kernel.

    Fused on CUDA for fp16/bf16 (no host sync, CUDA-graph safe); eager PyTorch otherwise.
    """
    if type(x) is torch.Tensor and not x.is_cuda and not fp8:
        # the CPU's case, first: its batch 1 is ~2 ms, of which the checks below were ~1%
        return F.layer_norm(x + residual, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    raw, dtype, args = norm_input_args(x)
    k = _fused(raw, dtype)
    if k is None or ln.weight is None or ln.bias is None or raw.dim() != 2 or raw.shape[1] > 8192:
        y = ln(materialize(x) + residual)
        return QRows(*quantize_reference(y), dense=y) if fp8 else y
    x, residual = raw.contiguous(), residual.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    q, scale = _fp8_out(out, fp8)
    if x.shape[0]:
        block = k.next_pow2(x.shape[1])
        k.add_ln_kernel[(x.shape[0],)](x, residual, ln.weight, ln.bias, out, out, q, scale, n_cols=x.shape[1],
                                       eps=ln.eps, HAS_BIAS=True, KEEP_SUM=False, QUANT=fp8, BLOCK=block,
                                       num_warps=_warps(block), **args,
                                       **launch_options(x, _norm_kind(args), x.shape[0]))
    return QRows(q, scale, dense=out) if fp8 else out


def _fp8_out(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Output buffers of a quantizing kernel: values [T, H] e4m3, scale [T, 1] float32 (without
    ``fp8``: x itself, a placeholder the kernel never touches)."""
    if not fp8:
        return x, x
    return torch.empty(x.shape, dtype=FP8, device=x.device), torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)


def add_layer_norm_pre(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-norm step with LayerNorm (ModernBERT): s = x + residual, then (LayerNorm(s) [T, H],
    s [T, H]), both in x's dtype; ``ln`` with or without a bias. x, residual: [T, H], same dtype.
    The sum is rounded to x's dtype before it is normalized, as HF's ``hidden + attn_output`` is.

    One kernel on CUDA for fp16/bf16 (instead of an add and a LayerNorm pass); eager otherwise.
    """
    k = _fused(x)
    if k is None or ln.weight is None or x.dim() != 2 or x.shape[1] > 8192:
        s = x + residual
        return ln(s), s
    x, residual = x.contiguous(), residual.contiguous()
    out, s = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        block = k.next_pow2(x.shape[1])
        bias = ln.weight if ln.bias is None else ln.bias  # never read without HAS_BIAS
        k.add_ln_kernel[(x.shape[0],)](x, residual, ln.weight, bias, out, s, out, out, n_cols=x.shape[1], eps=ln.eps,
                                       HAS_BIAS=ln.bias is not None, KEEP_SUM=True, QUANT=False, BLOCK=block,
                                       num_warps=_warps(block), **norm_input_args(x)[2],
                                       **launch_options(x, "norm", x.shape[0]))
    return out, s


def add_rms_norm(x: "torch.Tensor | ScaledRows | PartialRows", residual: torch.Tensor | None, norm: RMSNorm,
                 fp8: bool = False) -> "tuple[torch.Tensor | QRows, torch.Tensor]":
    """Pre-norm step of a decoder layer: s = x + residual (or x when residual is None), then
    (RMSNorm(s) [T, H], s [T, H]), both in x's dtype. x, residual: [T, H], same dtype (x may be
    ScaledRows or PartialRows). With ``fp8`` the normed rows come back as QRows only (the next GEMM is their one
    reader).

    One kernel on CUDA for fp16/bf16; the eager fallback is ``norm(s)`` (HF ``Qwen3RMSNorm``, or
    ``Gemma3RMSNorm`` when ``norm.unit_offset``).
    """
    raw, dtype, args = norm_input_args(x)
    k = _fused(raw, dtype)
    if k is None or raw.dim() != 2 or raw.shape[1] > 8192:
        x = materialize(x)
        s = x if residual is None else x + residual
        y = norm(s)
        return (QRows(*quantize_reference(y)) if fp8 else y), s
    x = raw.contiguous()
    plain = residual is None and not args["SCALED"] and args["PARTS"] == 1  # x itself is the residual stream
    s = x if plain else torch.empty(x.shape, dtype=dtype, device=x.device)
    q, scale = _fp8_out(s, fp8)
    out = s if fp8 else torch.empty_like(s)  # not written with fp8 (s: its dtype tells the kernel the model's)
    if x.shape[0]:
        block = k.next_pow2(x.shape[1])
        r = residual.contiguous() if residual is not None else x
        k.add_rms_kernel[(x.shape[0],)](x, r, norm.weight, out, s, q, scale, n_cols=x.shape[1], eps=norm.eps,
                                        HAS_RES=residual is not None, UNIT_OFFSET=norm.unit_offset, QUANT=fp8,
                                        BLOCK=block, num_warps=_warps(block), **args,
                                        **launch_options(x, _norm_kind(args), x.shape[0]))
    return (QRows(q, scale) if fp8 else out), s


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [T] int → (cos, sin) [T, head_dim/2] float32: angle p · θ^(−2j/head_dim).
    Built once per forward pass and shared by every layer (HF ``Qwen3RotaryEmbedding``)."""
    j = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.int64).float()
    inv = 1.0 / (theta ** (j / head_dim))  # [head_dim/2] fp32, HF's formula
    freqs = position_ids.float()[:, None] * inv[None, :]
    return freqs.cos(), freqs.sin()


def qk_norm_rope(qkv: torch.Tensor, q_norm: RMSNorm | None, k_norm: RMSNorm | None, cos: torch.Tensor,
                 sin: torch.Tensor, n_q: int, n_kv: int, head_dim: int, qk_weight: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused QKV rows [T, (n_q + 2·n_kv)·head_dim] → (q [T, n_q, D], k [T, n_kv, D], v [T, n_kv, D]):
    per-head RMSNorm of q and k (``q_norm``/``k_norm``; both None: no norm, as in Qwen2 and
    Mistral), then rotary embedding (rotate-half convention, cos/sin from ``rope_tables``).
    v is untouched.

    On CUDA (fp16/bf16, power-of-two head_dim) one kernel rewrites q and k in place inside
    ``qkv``, and q/k/v are views of it; ``qk_weight`` [2, D] = stacked q_norm/k_norm weights
    (built at load time; derived here when None). Elsewhere: eager PyTorch, new tensors.
    """
    T = qkv.shape[0]
    nq, nkv = n_q * head_dim, n_kv * head_dim
    k = _fused(qkv)
    if k is not None and qkv.dim() == 2 and qkv.stride(1) == 1 and head_dim >= 16 and head_dim & (head_dim - 1) == 0:
        if qk_weight is None:
            qk_weight = qkv if q_norm is None or k_norm is None else torch.stack((q_norm.weight, k_norm.weight))
        if T:
            heads = k.next_pow2(n_q + n_kv)
            k.qk_norm_rope_kernel[(T,)](qkv, qk_weight, cos, sin, qkv.stride(0), n_q, n_q + n_kv,
                                 0.0 if q_norm is None else q_norm.eps, HALF=head_dim // 2, HEADS=heads,
                                 NORM=q_norm is not None, UNIT_OFFSET=q_norm is not None and q_norm.unit_offset,
                                 num_warps=4 if heads * head_dim <= 4096 else 8,
                                 **launch_options(qkv, "qk_norm_rope", T))
        q, kk, v = qkv.split((nq, nkv, nkv), dim=-1)
        return q.view(T, n_q, head_dim), kk.view(T, n_kv, head_dim), v.view(T, n_kv, head_dim)
    q, kk, v = qkv.split((nq, nkv, nkv), dim=-1)
    c = torch.cat((cos, cos), dim=-1)[:, None, :].to(qkv.dtype)  # [T, 1, D], HF's bf16 tables
    s = torch.cat((sin, sin), dim=-1)[:, None, :].to(qkv.dtype)
    q, kk = q.reshape(T, n_q, head_dim), kk.reshape(T, n_kv, head_dim)
    if q_norm is not None and k_norm is not None:
        q, kk = q_norm(q), k_norm(kk)
    return _rotate(q, c, s), _rotate(kk, c, s), v.reshape(T, n_kv, head_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def silu_mul(gate_up: "torch.Tensor | ScaledRows", fp8: bool = False) -> "torch.Tensor | QRows":
    """gate_up [T, 2·I] (gate rows first, then up) → SiLU(gate) · up [T, I], same dtype; with
    ``fp8``: as QRows (quantized by the same kernel)."""
    return _gated(gate_up, "silu", fp8)


def gelu_tanh_mul(gate_up: "torch.Tensor | ScaledRows", fp8: bool = False) -> "torch.Tensor | QRows":
    """gate_up [T, 2·I] (gate rows first, then up) → GELU_tanh(gate) · up [T, I], same dtype
    (Gemma's MLP, ``gelu_pytorch_tanh``); with ``fp8``: as QRows."""
    return _gated(gate_up, "gelu_tanh", fp8)


def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2·I] (the activated half first) → GELU(first) · second [T, I], same dtype, with
    the exact erf GELU (ModernBERT's GeGLU, ``hidden_activation: gelu``)."""
    return _gated(gate_up, "gelu")


_ACT_CODES = {"identity": 0, "silu": 1, "gelu_tanh": 2, "gelu": 3, "relu": 4}  # kernels._act's codes
_ACT_FNS = {"identity": lambda t: t, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu": F.gelu,
            "relu": F.relu}
# config.json's ``hidden_act`` names (layers.ACTIVATIONS) → the kernels' activation names
FP8_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
            "swish": "silu"}


def _gated(gate_up: "torch.Tensor | ScaledRows", act: str, fp8: bool = False) -> "torch.Tensor | QRows":
    if fp8:
        return act_quant(gate_up, act, gated=True)
    raw, scaled = unscale_args(gate_up)
    k = _fused(raw)
    if k is None or raw.dim() != 2:
        gate, up = materialize(gate_up).chunk(2, dim=-1)
        return _ACT_FNS[act](gate) * up
    raw = raw.contiguous()
    T, n = raw.shape[0], raw.shape[1] // 2
    out = raw.new_empty((T, n))
    if T:
        block = min(1024, k.next_pow2(n))
        k.gated_act_kernel[(T, -(-n // block))](raw, out, n_cols=n, ACT=_ACT_CODES[act], BLOCK=block, num_warps=4,
                                                **scaled, **launch_options(raw, "act", T * -(-n // block)))
    return out


_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def linear_gelu(x: torch.Tensor, linear: torch.nn.Linear, act_name: str) -> torch.Tensor:
    """x [T, in] → act(linear(x)) [T, out], same dtype. One GEMM with a GELU epilogue on CUDA
    (fp16/bf16, GELU-family ``act_name``); eager linear + activation otherwise.
    Raises ValueError for an unknown activation (from ``layers.activation``)."""
    if x.is_cuda and x.dtype in _FUSED_DTYPES and act_name in _GELUS and linear.bias is not None and x.dim() == 2:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return activation(act_name)(linear(x))
