"""Fused device kernels used by the models, each with a plain-PyTorch fallback.

- ``add_layer_norm(x, residual, ln)``: LayerNorm(x + residual) in one pass (BERT, XLM-R); the
  H200 timings against eager add + LayerNorm are in bench/results/*run2-probe.json.
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

Why: unfused, a Qwen3 forward pass at batch 1 is mostly small elementwise kernels (fp32 RMSNorm,
rotary and the SiLU gate as separate passes; counted in bench/results/h200-2026-11-29-final/
README.md), so the replay time is mostly their launch latency, and at large batches each is a
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
from types import SimpleNamespace
import torch
import torch.nn.functional as F

from bouquet.engine.layers import RMSNorm, activation

_FUSED_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _kernels() -> SimpleNamespace | None:
    """Build the Triton kernels on first use (no import-time probing); None when unavailable."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def add_ln_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, sum_ptr, n_cols, eps,
                      HAS_BIAS: tl.constexpr, KEEP_SUM: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x += tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if KEEP_SUM:  # pre-norm: the rounded sum is the residual stream, and HF normalizes it
            s = x.to(dt)
            tl.store(sum_ptr + row * n_cols + cols, s, mask=mask)
            x = s.to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        d = tl.where(mask, x - mean, 0.0)
        var = tl.sum(d * d, axis=0) / n_cols
        y = d * tl.rsqrt(var + eps) * tl.load(w_ptr + cols, mask=mask, other=1.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n_cols + cols, y.to(dt), mask=mask)

    @triton.jit
    def add_rms_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, n_cols, eps,
                       HAS_RES: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            s = (x + tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)).to(dt)
            tl.store(sum_ptr + row * n_cols + cols, s, mask=mask)
            x = s.to(tl.float32)  # HF normalizes the rounded sum
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:  # Gemma: x · (1 + w) in fp32, rounded once
            y = x * rstd * (1.0 + w)
        else:  # Llama/Qwen: the normed row is rounded before the weight multiply
            y = (x * rstd).to(dt).to(tl.float32) * w
        tl.store(out_ptr + row * n_cols + cols, y.to(dt), mask=mask)

    @triton.jit
    def qk_norm_rope_kernel(qkv_ptr, w_ptr, cos_ptr, sin_ptr, row_stride, n_q_heads, n_heads, eps,
                            HALF: tl.constexpr, HEADS: tl.constexpr, NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr):
        # One program per token, all its q and k heads as a [HEADS, HALF] tile per half.
        t = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, HEADS)[:, None]
        cols = tl.arange(0, HALF)[None, :]
        mask = (heads < n_heads) & (cols < HALF)
        dt = qkv_ptr.dtype.element_ty
        ptr = qkv_ptr + t * row_stride + heads * (2 * HALF) + cols
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
            w = w_ptr + (heads >= n_q_heads).to(tl.int32) * (2 * HALF) + cols  # row 0: q_norm, row 1: k_norm
            w1, w2 = tl.load(w).to(tl.float32), tl.load(w + HALF).to(tl.float32)
            if UNIT_OFFSET:  # Gemma's (1 + w), in fp32 before the one rounding
                y1 = (x1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
                y2 = (x2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
            else:
                y1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                y2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        else:  # Qwen2, Mistral: rotary only
            y1, y2 = x1, x2
        c = tl.load(cos_ptr + t * HALF + cols)
        s = tl.load(sin_ptr + t * HALF + cols)
        tl.store(ptr, (y1 * c - y2 * s).to(dt), mask=mask)  # in place: this program read its token already
        tl.store(ptr + HALF, (y2 * c + y1 * s).to(dt), mask=mask)

    @triton.jit
    def gated_act_kernel(gu_ptr, out_ptr, n_cols, GELU: tl.constexpr, ERF: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = out_ptr.dtype.element_ty
        g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if ERF:  # exact GELU: 0.5·g·(1 + erf(g/√2))
            a = (0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))).to(dt).to(tl.float32)
        elif GELU:  # tanh form: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))); tanh(z) = 1 − 2/(1 + e^{2z})
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            a = (0.5 * g * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * z)))).to(dt).to(tl.float32)
        else:
            a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # HF rounds the activation first
        tl.store(out_ptr + row * n_cols + cols, (a * u).to(dt), mask=mask)

    return SimpleNamespace(add_ln=add_ln_kernel, add_rms=add_rms_kernel, qk_norm_rope=qk_norm_rope_kernel,
                           gated_act=gated_act_kernel, next_pow2=triton.next_power_of_2)


def _fused(x: torch.Tensor) -> SimpleNamespace | None:
    """The kernels when ``x`` can use them (CUDA, fp16/bf16, Triton present), else None."""
    return _kernels() if x.is_cuda and x.dtype in _FUSED_DTYPES else None


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """x, residual [T, H] (same dtype) → LayerNorm(x + residual) [T, H], ``ln``'s weight/bias/eps.

    Fused on CUDA for fp16/bf16 (no host sync, CUDA-graph safe); eager PyTorch otherwise.
    """
    k = _fused(x)
    if k is None or ln.weight is None or ln.bias is None or x.dim() != 2 or x.shape[1] > 8192:
        return ln(x + residual)
    x, residual = x.contiguous(), residual.contiguous()
    out = torch.empty_like(x)
    if x.shape[0] == 0:
        return out
    block = k.next_pow2(x.shape[1])
    k.add_ln[(x.shape[0],)](x, residual, ln.weight, ln.bias, out, out, x.shape[1], ln.eps, HAS_BIAS=True,
                            KEEP_SUM=False, BLOCK=block, num_warps=_warps(block))
    return out


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
        k.add_ln[(x.shape[0],)](x, residual, ln.weight, bias, out, s, x.shape[1], ln.eps, HAS_BIAS=ln.bias is not None,
                                KEEP_SUM=True, BLOCK=block, num_warps=_warps(block))
    return out, s


def layer_norm_reference(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """What ``add_layer_norm`` computes, in fp32 PyTorch (for tests)."""
    return F.layer_norm(x.float() + residual.float(), ln.normalized_shape, ln.weight.float(), ln.bias.float(), ln.eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-norm step of a decoder layer: s = x + residual (or x when residual is None), then
    (RMSNorm(s) [T, H], s [T, H]), both in x's dtype. x, residual: [T, H], same dtype.

    One kernel on CUDA for fp16/bf16; the eager fallback is ``norm(s)`` (HF ``Qwen3RMSNorm``, or
    ``Gemma3RMSNorm`` when ``norm.unit_offset``).
    """
    k = _fused(x)
    if k is None or x.dim() != 2 or x.shape[1] > 8192:
        s = x if residual is None else x + residual
        return norm(s), s
    x = x.contiguous()
    out = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    if x.shape[0] == 0:
        return out, s
    block = k.next_pow2(x.shape[1])
    r = residual.contiguous() if residual is not None else x
    k.add_rms[(x.shape[0],)](x, r, norm.weight, out, s, x.shape[1], norm.eps, HAS_RES=residual is not None,
                             UNIT_OFFSET=norm.unit_offset, BLOCK=block, num_warps=_warps(block))
    return out, s


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
            k.qk_norm_rope[(T,)](qkv, qk_weight, cos, sin, qkv.stride(0), n_q, n_q + n_kv,
                                 0.0 if q_norm is None else q_norm.eps, HALF=head_dim // 2, HEADS=heads,
                                 NORM=q_norm is not None, UNIT_OFFSET=q_norm is not None and q_norm.unit_offset,
                                 num_warps=4 if heads * head_dim <= 4096 else 8)
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


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2·I] (gate rows first, then up) → SiLU(gate) · up [T, I], same dtype."""
    return _gated(gate_up, gelu=False)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2·I] (gate rows first, then up) → GELU_tanh(gate) · up [T, I], same dtype
    (Gemma's MLP, ``gelu_pytorch_tanh``)."""
    return _gated(gate_up, gelu=True)


def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2·I] (the activated half first) → GELU(first) · second [T, I], same dtype, with
    the exact erf GELU (ModernBERT's GeGLU, ``hidden_activation: gelu``)."""
    return _gated(gate_up, gelu=True, erf=True)


def _gated(gate_up: torch.Tensor, gelu: bool, erf: bool = False) -> torch.Tensor:
    k = _fused(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    if k is None or gate_up.dim() != 2:
        return (F.gelu(gate, approximate="none" if erf else "tanh") if gelu else F.silu(gate)) * up
    gate_up = gate_up.contiguous()
    T, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((T, n))
    if T:
        block = min(1024, k.next_pow2(n))
        k.gated_act[(T, -(-n // block))](gate_up, out, n, GELU=gelu, ERF=erf, BLOCK=block, num_warps=4)
    return out


_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def linear_gelu(x: torch.Tensor, linear: torch.nn.Linear, act_name: str) -> torch.Tensor:
    """x [T, in] → act(linear(x)) [T, out], same dtype. One GEMM with a GELU epilogue on CUDA
    (fp16/bf16, GELU-family ``act_name``); eager linear + activation otherwise.
    Raises ValueError for an unknown activation (from ``layers.activation``)."""
    if x.is_cuda and x.dtype in _FUSED_DTYPES and act_name in _GELUS and linear.bias is not None and x.dim() == 2:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return activation(act_name)(linear(x))
