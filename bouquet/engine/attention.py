"""Attention over packed sequences; the backend is chosen once per engine and logged.

Models call ``backend.attend(q, k, v, meta)`` with q ``[T, H, D]`` and k/v ``[T, Hkv, D]``
(grouped-query attention when Hkv < H) and get ``[T, H, D]`` back. ``meta`` is built once per
forward pass by ``backend.prepare`` and shared by every layer.

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 varlen inside), CUDA,
  fp16/bf16. ``max_seqlen`` is a host integer that sizes the kernel grid; under CUDA graphs it
  is the bucket's upper bound (a loose bound is correct, only slower). When every sequence of an
  (eager) batch has the same length, ``prepare(..., uniform=True)`` routes attention to SDPA's
  cuDNN kernel on the packed tensor viewed as ``[B, L, H, D]`` (no padding, no copy), which is
  faster there (bench/results/h200-2026-11-29-run2-probe.json: attn_cudnn_ms vs attn_varlen_ms).
  A causal model's single-slot graph bucket takes the same path with L = the bucket's tokens:
  the padding rows sit after the one real sequence, and causal attention never lets a real row
  see a later one, so real rows are exact (padding rows are discarded by pooling).
- ``sdpa_grouped``: for the CPU (and fp32 on CUDA). Dense layers stay packed; attention groups
  the sequences by exact length and runs one unmasked SDPA call per group on ``[n, H, len, D]``
  gathered rows: no padding and no mask, so no wasted work (less than one padded, masked call
  does for mixed lengths); a batch of equal lengths (or one sequence) is a single call with no
  gather.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LengthGroup:
    """``count`` sequences of ``length`` tokens; ``index`` [count·length] int64 = their token rows
    in packed order (None: the group is the whole batch, already in order)."""

    length: int
    count: int
    index: torch.Tensor | None


@dataclass
class AttnMeta:
    """Per-forward attention metadata. cu_seqlens [B+1] int32 on the model's device."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    causal: bool
    groups: "list[LengthGroup] | None" = None  # sdpa_grouped only
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
        qp, kp, vp = (x.view(T // L, L, x.shape[1], D).transpose(1, 2) for x in (q, k, v))  # [B, heads, L, D]
        # enable_gqa: cuDNN reads the shared K/V heads itself, faster than repeating K/V first
        # (bench/results/h200-2026-11-30/README.md, the Qwen3-0.6B attention profile).
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=meta.causal, enable_gqa=k.shape[1] != H)
        return out.transpose(1, 2).reshape(T, H, D)


class SdpaGroupedBackend(AttentionBackend):
    name = "sdpa_grouped"

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False) -> AttnMeta:
        cu = cu_seqlens.to(torch.int64).cpu()
        lengths = cu[1:] - cu[:-1]
        order = torch.argsort(lengths, stable=True)
        sizes, counts = torch.unique_consecutive(lengths[order], return_counts=True)
        groups: list[LengthGroup] = []
        start = 0
        for n, c in zip(sizes.tolist(), counts.tolist()):
            seqs = order[start:start + c]
            start += c
            if n == 0:
                continue  # empty padding slots own no tokens
            idx = (cu[seqs][:, None] + torch.arange(n)[None, :]).reshape(-1)
            groups.append(LengthGroup(n, c, idx.to(cu_seqlens.device)))
        if len(groups) == 1 and groups[0].count * groups[0].length == int(cu[-1]):
            groups = [LengthGroup(groups[0].length, groups[0].count, None)]  # one run, in order
        return AttnMeta(cu_seqlens, int(max_seqlen), causal, groups=groups)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        assert meta.groups is not None
        gqa = k.shape[1] != q.shape[1]
        T, H, D = q.shape

        def run(g: LengthGroup, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            qs, ks, vs = (x.view(g.count, g.length, x.shape[1], D).transpose(1, 2) for x in xs)  # [n, H, len, D]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=meta.causal, enable_gqa=gqa)
            return o.transpose(1, 2).reshape(g.count * g.length, H, D)

        if len(meta.groups) == 1 and meta.groups[0].index is None:
            return run(meta.groups[0], (q, k, v))
        out = q.new_empty(q.shape)
        for g in meta.groups:
            assert g.index is not None
            out.index_copy_(0, g.index, run(g, tuple(x.index_select(0, g.index) for x in (q, k, v))))
        return out


def select_backend(device: torch.device, dtype: torch.dtype, override: str | None = None) -> AttentionBackend:
    """Pick the attention backend once: varlen on CUDA with fp16/bf16, length-grouped SDPA otherwise.

    Raises ValueError for an unknown override or varlen on a device/dtype it cannot run.
    """
    name = override or ("varlen" if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) else "sdpa_grouped")
    if name == "varlen":
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"varlen attention needs CUDA and fp16/bf16, got {device} {dtype}")
        backend: AttentionBackend = VarlenBackend()
    elif name == "sdpa_grouped":
        backend = SdpaGroupedBackend()
    else:
        raise ValueError(f"unknown attention backend {name!r}; choose varlen or sdpa_grouped")
    log.info("attention backend: %s (device=%s dtype=%s)", backend.name, device, dtype)
    return backend
