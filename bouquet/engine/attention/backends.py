"""Attention over packed sequences; the backend is chosen once per engine and logged.

Models call ``backend.attend(q, k, v, meta)`` with q ``[T, H, D]`` and k/v ``[T, Hkv, D]``
(grouped-query attention when Hkv < H) and get ``[T, H, D]`` back. ``meta`` is built once per
forward pass by ``backend.prepare`` and shared by every layer.

Sliding-window layers (ModernBERT's local layers, Gemma3's sliding ones) pass ``window=W``: query
i of a sequence sees key j of the same sequence only when |i − j| ≤ W (and j ≤ i when causal), the
band of transformers' ``sliding_window_bidirectional_overlay``. A window at least ``max_seqlen − 1``
wide hides nothing, so it runs as full attention. On CUDA FlashAttention-2 varlen skips the key
blocks outside the band (the window is a host int: graphs stay valid); on the CPU each length group
runs SDPA with a boolean band mask (cached per length), so a windowed layer costs what a global one does.

Layers with an additive score bias (MPNet's relative position bias) pass ``bias`` [H, L, L] in the
model dtype, L ≥ every sequence's length, bidirectional only: on the CPU each length group slices it
as its SDPA float mask; on CUDA (FlashAttention-2 takes no bias) the memory-efficient kernel's varlen
form reads it at in-sequence offsets through its strides (``_biased_varlen``).

- ``varlen``: CUDA, fp16/bf16. Ragged batches run ``triton_varlen`` (``kernels.varlen_attn_kernel``)
  for the head dims of ``plan.TRITON_ATTN_CONFIGS``; other head dims, sliding windows and a build
  without Triton run FlashAttention-2 varlen (``torch.nn.attention.varlen.varlen_attn``). Batches of
  equal lengths (``prepare(..., uniform=True)``) run cuDNN through SDPA on the packed tensor viewed
  as ``[B, L, H, D]`` (no padding, no copy), except one sequence alone and the head dims of
  ``plan.TRITON_UNIFORM_HEAD_DIMS`` (Triton). A causal sequence alone of more than
  ``plan.CUDNN_SINGLE_MIN_TOKENS`` rows runs cuDNN over all the rows, a graph bucket's padding
  included: the padding rows come after the real ones, which causal attention never lets see them,
  as long as they hold finite values (not for models mixing windowed and global layers:
  ``AttnMeta.whole_rows``). ``max_seqlen`` is a host int that sizes the grid; under CUDA graphs the
  bucket's bound (loose is correct, only slower).
- ``sdpa_grouped``: for the CPU (and fp32 on CUDA): the sequences grouped by exact length, one
  unmasked SDPA call per group on ``[n, H, len, D]`` gathered rows: no padding, no mask.

Thresholds and tiles: plan.py; measurements: docs/decisions.md, "the kernel plan".
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bouquet.engine.kernels.pdl import launch_options
from bouquet.engine.plan import (CUDNN_SINGLE_HEAD_DIMS, CUDNN_SINGLE_MIN_TOKENS, SINGLE_MIN_SEQLEN, TRITON_ATTN_CONFIGS,
                                 TRITON_SINGLE_CONFIGS, TRITON_UNIFORM_HEAD_DIMS, profile_of)

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
    # every layer computes every row it is given, padding rows included, whenever one does (False:
    # the model's layers mix windowed and global attention, and FlashAttention-2 on a windowed layer
    # leaves a graph bucket's padding rows unwritten: no kernel may then read them)
    whole_rows: bool = True


class AttentionBackend:
    name = "base"
    # prepare() reads lengths on the host and builds index tensors there (sdpa_grouped): such a
    # backend cannot be captured into a CUDA graph (no device-to-host copy during capture)
    graph_safe = True

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False,
                whole_rows: bool = True) -> AttnMeta:
        return AttnMeta(cu_seqlens, max_seqlen, causal)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta,
               window: int | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] → [T, H, D]; ``window``: sliding-window half-width W
        (see the module docstring), None = the whole sequence; ``bias`` [H, L, L]: an additive
        score bias by in-sequence positions (see the module docstring), not with ``window``."""
        raise NotImplementedError




def triton_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                  causal: bool, config: tuple[int, int, int, int] | None = None, pack_heads: bool = True) -> torch.Tensor:
    """Attention over packed sequences with the Triton kernel (``kernels.varlen_attn_kernel``):
    q [T, H, D], k/v [T, Hkv, D] (H a multiple of Hkv; row strides free, head dim contiguous),
    cu_seqlens [B+1] int32, ``max_seqlen`` ≥ every length (a host int: it sizes the grid, so a
    loose bound under CUDA graphs only launches programs that exit at once) → [T, H, D] in q's
    dtype. Scores in fp32 with softmax scale 1/√D, online softmax (FlashAttention-2's algorithm,
    Dao 2023). ``config``: (BLOCK_M, BLOCK_N, warps, stages), default by head dim
    (``TRITON_ATTN_CONFIGS``; ``TRITON_SINGLE_CONFIGS`` for one long sequence). ``pack_heads``:
    with grouped-query attention, the query heads of one kv head share a program (BLOCK_M rows =
    BLOCK_M / group tokens × group heads), so each K/V tile is read once for all of them. Raises
    KeyError for a head dim without a config."""
    from bouquet.engine.kernels import triton_kernels as kernels

    T, H, D = q.shape
    single = cu_seqlens.shape[0] == 2 and max_seqlen > SINGLE_MIN_SEQLEN and profile_of(q.device).measured_hopper  # static per bucket
    bm, bn, warps, stages = config or (TRITON_SINGLE_CONFIGS if single else TRITON_ATTN_CONFIGS)[D]
    group = H // k.shape[1]
    pack = group if pack_heads and group > 1 and bm % group == 0 and bm // group >= 16 else 1
    o = q.new_empty((T, H, D))
    grid = (-(-max_seqlen // (bm // pack)), cu_seqlens.shape[0] - 1, H // pack)
    kernels.varlen_attn_kernel[grid](
        q, k, v, o, cu_seqlens, D ** -0.5 * 1.4426950408889634,  # log2(e): the kernel uses exp2
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        GROUP=group, PACK=pack, CAUSAL=causal, D=D, BM=bm, BN=bn, num_warps=warps, num_stages=stages,
        **launch_options(q, "attention", grid[0] * grid[1] * grid[2]))
    return o


def _windowed(window: int | None, meta: AttnMeta) -> bool:
    """Whether ``window`` can hide a key from a query: some sequence is longer than W + 1."""
    return window is not None and window < meta.max_seqlen - 1


class VarlenBackend(AttentionBackend):
    """``ragged``: the kernel for batches of unequal lengths, "triton" (``triton_varlen``) or
    "flash" (FlashAttention-2 varlen: where Triton is missing, reported as ``varlen-flash``)."""

    def __init__(self, ragged: str = "triton") -> None:
        from torch.nn.attention.varlen import varlen_attn

        self._fn = varlen_attn
        self.ragged = ragged
        self.name = "varlen" if ragged == "triton" else "varlen-flash"

    def triton_takes(self, head_dim: int) -> bool:
        """Whether sequences of this head dim (unwindowed, unbiased) run the Triton kernel."""
        return self.ragged == "triton" and head_dim in TRITON_ATTN_CONFIGS

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False,
                whole_rows: bool = True) -> AttnMeta:
        return AttnMeta(cu_seqlens, max_seqlen, causal, uniform=uniform, whole_rows=whole_rows)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta,
               window: int | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None:
            return _biased_varlen(q, k, v, meta, bias)
        w = window if _windowed(window, meta) else -1
        # Equal lengths: cuDNN (it takes no window: banded layers stay on FlashAttention-2); but one
        # sequence alone runs the Triton kernel, as fast or faster, and a graph bucket's single
        # sequence takes it too, so eager and replayed steps of one sequence agree;
        # above CUDNN_SINGLE_MIN_TOKENS rows a causal one runs cuDNN again (eager and graph alike).
        triton = w < 0 and self.triton_takes(q.shape[2]) and q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
        if (triton and meta.causal and meta.whole_rows and meta.cu_seqlens.shape[0] == 2
                and q.shape[0] > CUDNN_SINGLE_MIN_TOKENS and q.shape[2] in CUDNN_SINGLE_HEAD_DIMS):
            # one long causal sequence: cuDNN over all T rows, padding included (a graph bucket's
            # rows past the sequence come after it, so causality keeps them out of its rows; their
            # values must be finite, as cuDNN multiplies masked probabilities by V: whole_rows)
            return self._dense(q, k, v, q.shape[0], True)
        if meta.uniform and w < 0 and not (triton and (meta.cu_seqlens.shape[0] == 2 or q.shape[2] in TRITON_UNIFORM_HEAD_DIMS)):
            return self._dense(q, k, v, meta.max_seqlen, meta.causal)
        if triton:
            return triton_varlen(q, k, v, meta.cu_seqlens, meta.max_seqlen, meta.causal)
        size = (w, 0) if meta.causal else (w, w)
        cu = meta.cu_seqlens
        return self._fn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, window_size=size)


    def uniform_kernel(self, head_dim: int) -> bool:
        """Whether batches of equal lengths (two or more sequences) run another kernel than ragged
        ones here (cuDNN): then CUDA graphs capture uniform buckets for them (buckets.uniform_bucket)."""
        return not (self.triton_takes(head_dim) and head_dim in TRITON_UNIFORM_HEAD_DIMS)

    @staticmethod
    def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, L: int, causal: bool) -> torch.Tensor:
        """T / L sequences of L tokens each, as cuDNN's dense [B, heads, L, D] layout (a view: no copy)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        T, H, D = q.shape
        qp, kp, vp = (x.view(T // L, L, x.shape[1], D).transpose(1, 2) for x in (q, k, v))  # [B, heads, L, D]
        # enable_gqa: cuDNN reads the shared K/V heads itself, faster than repeating K/V first
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal, enable_gqa=k.shape[1] != H)
        return out.transpose(1, 2).reshape(T, H, D)


class SdpaGroupedBackend(AttentionBackend):
    name = "sdpa_grouped"
    graph_safe = False

    def prepare(self, cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool, uniform: bool = False,
                whole_rows: bool = True) -> AttnMeta:
        if uniform and max_seqlen > 0:
            # every sequence max_seqlen long (a lone query is one): one run in order, known from host
            # ints; the sort below costs ~80 µs, a twentieth of a MiniLM batch-1 forward on 2 cores
            count = cu_seqlens.shape[0] - 1
            return AttnMeta(cu_seqlens, int(max_seqlen), causal, groups=[LengthGroup(int(max_seqlen), count, None)])
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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta,
               window: int | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert meta.groups is not None
        covered = sum(g.count * g.length for g in meta.groups)
        if len(meta.groups) == 1 and meta.groups[0].index is None and covered == q.shape[0]:
            return _sdpa_run(meta.groups[0], q, k, v, meta.causal, window, bias)  # one run in order: a lone query
        out = q.new_empty(q.shape)
        if covered < out.shape[0]:
            out[covered:].zero_()  # padding rows (a CPU step at a padded count): no sequence writes them
        for g in meta.groups:
            if g.index is None:  # one run in order from row 0, then padding
                out[:covered] = _sdpa_run(g, q[:covered], k[:covered], v[:covered], meta.causal, window, bias)
                continue
            out.index_copy_(0, g.index, _sdpa_run(g, *(x.index_select(0, g.index) for x in (q, k, v)), meta.causal,
                                                  window, bias))
        return out


def _sdpa_run(g: LengthGroup, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None,
              bias: torch.Tensor | None) -> torch.Tensor:
    """SDPA over one length group's rows in order: q [n·len, H, D], k/v [n·len, Hkv, D] → [n·len, H, D].
    A module function, not a closure: the CPU's batch 1 calls it once per layer."""
    n, L, D = g.count, g.length, q.shape[2]
    gqa = k.shape[1] != q.shape[1]
    qs, ks, vs = (x.view(n, L, x.shape[1], D).transpose(1, 2) for x in (q, k, v))  # [n, H, len, D]
    if bias is not None:  # [H, len, len] view: the float mask every sequence of the group shares
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias[:, :L, :L], enable_gqa=gqa)
    elif window is not None and window < L - 1:
        mask = band_mask(L, window, causal, q.device)  # [len, len] bool, True = attend
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=gqa)
    else:
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)
    return o.transpose(1, 2).reshape(n * L, q.shape[1], D)


def _biased_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta, bias: torch.Tensor) -> torch.Tensor:
    """Packed attention with an additive bias [H, L, L] by in-sequence positions, on CUDA: the
    memory-efficient kernel's varlen form. Its host checks want a [1, H, T, T] bias, last dim
    contiguous; it adds ``bias[batch·strideB + h·strideH + i·strideM + j]`` for query i, key j
    *inside* sequence ``batch`` (kernel_forward.h, ``advance_to_block``). So the [H, L, L] table
    is copied into rows of a padded stride (``Lp``, a multiple of 16 for the kernel's alignment),
    and viewed as [1, H, T, T] with strides (0, L·Lp, Lp, 1): reads stay inside the table because
    i, j < L; the buffer is only allocated long enough for the view's nominal extent."""
    T, H, D = q.shape
    L = bias.shape[-1]
    assert not meta.causal and L >= meta.max_seqlen, "biased attention: bidirectional, bias covers max_seqlen"
    Lp = -(-L // 16) * 16
    size = max(H * L * Lp, (H - 1) * L * Lp + (T - 1) * Lp + T)
    buf = bias.new_empty(size)
    buf[:H * L * Lp].view(H, L, Lp)[:, :, :L] = bias
    view = buf.as_strided((1, H, T, T), (0, L * Lp, Lp, 1))
    cu = meta.cu_seqlens
    out = torch.ops.aten._efficient_attention_forward(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), view, cu, cu, meta.max_seqlen, meta.max_seqlen,
        0.0, 0)[0]  # [1, T, H, D]; custom_mask_type 0: no causal mask
    return out.view(T, H, D)


@functools.lru_cache(maxsize=64)
def band_mask(length: int, window: int, causal: bool, device: torch.device) -> torch.Tensor:
    """[length, length] bool, True where key j is visible from query i: |i − j| ≤ window, and
    j ≤ i when causal. Cached: every windowed layer of a forward pass asks for the same lengths."""
    i = torch.arange(length, device=device)
    d = i[:, None] - i[None, :]  # [L, L] query − key
    keep = d.abs() <= window
    return keep & (d >= 0) if causal else keep


def select_backend(device: torch.device, dtype: torch.dtype, override: str | None = None) -> AttentionBackend:
    """Pick the attention backend once: varlen on CUDA with fp16/bf16 (its ragged batches on the
    Triton kernel when Triton imports, else on FlashAttention-2, reported as ``varlen-flash``),
    length-grouped SDPA otherwise.

    Raises ValueError for an unknown override or varlen on a device/dtype it cannot run.
    """
    name = override or ("varlen" if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) else "sdpa_grouped")
    if name == "varlen":
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"varlen attention needs CUDA and fp16/bf16, got {device} {dtype}")
        from bouquet.engine.kernels.ops import triton_kernels

        triton = triton_kernels() is not None
        backend: AttentionBackend = VarlenBackend("triton" if triton else "flash")
    elif name == "sdpa_grouped":
        backend = SdpaGroupedBackend()
    else:
        raise ValueError(f"unknown attention backend {name!r}; choose varlen or sdpa_grouped")
    detail = ""
    if isinstance(backend, VarlenBackend):
        detail = (f"; unequal lengths: {'Triton kernel' if backend.ragged == 'triton' else 'FlashAttention-2'}, "
                  "equal lengths: cuDNN, sliding windows: FlashAttention-2, score bias: memory-efficient kernel")
    log.info("attention backend: %s (device=%s dtype=%s%s)", backend.name, device, dtype, detail)
    return backend
