"""Attention over packed sequences; the backend is chosen once per engine and logged.

Models call ``backend.attend(q, k, v, meta)`` with q ``[T, H, D]`` and k/v ``[T, Hkv, D]``
(grouped-query attention when Hkv < H) and get ``[T, H, D]`` back. ``meta`` is built once per
forward pass by ``backend.prepare`` and shared by every layer.

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 varlen inside), CUDA,
  fp16/bf16. ``max_seqlen`` is a host integer that sizes the kernel grid; under CUDA graphs it
  is the bucket's upper bound (a loose bound is correct, only slower). When every sequence of an
  (eager) batch has the same length, ``prepare(..., uniform=True)`` routes attention to SDPA's
  cuDNN kernel on the packed tensor viewed as ``[B, L, H, D]`` (no padding, no copy): measured
  0.20 vs 0.32 ms per layer at 100 × 512 bge-base shapes (bench/results/*run2-probe.json).
- ``sdpa_padded``: for the CPU (and fp32 on CUDA). Dense layers stay packed; only attention
  gathers the tokens into ``[B, H, L, D]`` with a key-padding mask, one SDPA call for the batch.
  When padding would more than double the attention work, it runs one SDPA call per sequence.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


@dataclass
class AttnMeta:
    """Per-forward attention metadata. cu_seqlens [B+1] int32 on the model's device."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    causal: bool
    # sdpa_padded only: gather index [B, L] into T, validity [B, L], additive-free bool mask
    gather_idx: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # [B, 1, L, L] or [B, 1, 1, L] bool, True = attend
    lengths: list[int] | None = None  # per-sequence path
    uniform: bool = False  # varlen only: all sequences have length max_seqlen (cuDNN SDPA path)


class AttentionBackend:
    name = "base"

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False) -> AttnMeta:
        return AttnMeta(cu_seqlens, max_seqlen, causal)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        raise NotImplementedError


class VarlenBackend(AttentionBackend):
    name = "varlen"

    def __init__(self) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self._fn = varlen_attn

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False) -> AttnMeta:
        return AttnMeta(cu_seqlens, max_seqlen, causal, uniform=uniform)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        if meta.uniform:
            return self._uniform(q, k, v, meta)
        window = (-1, 0) if meta.causal else (-1, -1)
        cu = meta.cu_seqlens
        return self._fn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, window_size=window)


    @staticmethod
    def _uniform(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        T, H, D = q.shape
        L = meta.max_seqlen
        if k.shape[1] != H:  # grouped-query: repeat K/V heads (cuDNN takes equal head counts)
            k, v = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (k, v))
        qp, kp, vp = (x.view(T // L, L, H, D).transpose(1, 2) for x in (q, k, v))  # [B, H, L, D]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=meta.causal)
        return out.transpose(1, 2).reshape(T, H, D)


class SdpaPaddedBackend(AttentionBackend):
    name = "sdpa_padded"

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False) -> AttnMeta:
        cu = cu_seqlens.to(torch.int64)
        lengths = cu[1:] - cu[:-1]
        n = int(lengths.shape[0])
        L = int(max_seqlen)
        exact = int((lengths * lengths).sum())
        tokens = int(cu[-1])
        # Padding costs B·L² score entries against Σ len² exact; fall back to one call per
        # sequence only when that waste is large both relatively and against the dense work.
        if n > 1 and n * L * L > 3 * exact + 64 * tokens:
            return AttnMeta(cu_seqlens, L, causal, lengths=lengths.tolist())
        ar = torch.arange(L, device=cu.device)
        valid = ar[None, :] < lengths[:, None]  # [B, L]
        idx = torch.where(valid, cu[:-1, None] + ar[None, :], torch.zeros_like(ar)[None, :])
        mask = valid[:, None, None, :]  # keys
        if causal:
            mask = mask & torch.ones(L, L, dtype=torch.bool, device=cu.device).tril()[None, None]
        return AttnMeta(cu_seqlens, L, causal, gather_idx=idx, valid=valid, mask=mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        gqa = k.shape[1] != q.shape[1]
        if meta.lengths is not None:
            return self._per_sequence(q, k, v, meta, gqa)
        idx, valid = meta.gather_idx, meta.valid
        assert idx is not None and valid is not None
        qp, kp, vp = (x[idx].transpose(1, 2) for x in (q, k, v))  # [B, H, L, D]
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=meta.mask, enable_gqa=gqa)
        return out.transpose(1, 2)[valid]  # [T, H, D]

    @staticmethod
    def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta, gqa: bool) -> torch.Tensor:
        outs = []
        start = 0
        assert meta.lengths is not None
        for n in meta.lengths:
            sl = slice(start, start + n)
            qs, ks, vs = (x[sl].transpose(0, 1)[None] for x in (q, k, v))  # [1, H, n, D]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=meta.causal, enable_gqa=gqa)
            outs.append(o[0].transpose(0, 1))
            start += n
        return torch.cat(outs, 0)


def select_backend(device: torch.device, dtype: torch.dtype, override: str | None = None) -> AttentionBackend:
    """Pick the attention backend once: varlen on CUDA with fp16/bf16, padded SDPA otherwise.

    Raises ValueError for an unknown override or varlen on a device/dtype it cannot run.
    """
    name = override or ("varlen" if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) else "sdpa_padded")
    if name == "varlen":
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"varlen attention needs CUDA and fp16/bf16, got {device} {dtype}")
        backend: AttentionBackend = VarlenBackend()
    elif name == "sdpa_padded":
        backend = SdpaPaddedBackend()
    else:
        raise ValueError(f"unknown attention backend {name!r}; choose varlen or sdpa_padded")
    log.info("attention backend: %s (device=%s dtype=%s)", backend.name, device, dtype)
    return backend
