"""Pooling, normalization and Matryoshka truncation: the one place these live.

Pooling acts on packed hidden states, the segment id of each token and ``cu_seqlens``
(sentence-transformers 6.2's ``Pooling`` semantics, without padding; its flattened-input path
``_forward_flattened``): CLS = row ``cu[:-1]``, last token = row ``cu[1:] - 1``, mean = per-sequence
sum / length, mean_sqrt_len = sum / sqrt(length), max = per-sequence elementwise maximum,
weightedmean = sum of ``(position + 1) * row`` / sum of ``(position + 1)``; SPLADE (on masked-LM
logits [T, vocab], sentence-transformers' ``SpladePooling``) = max (or sum) over the sequence of
log(1 + relu(logits)), every token of the sequence included (special tokens too, as there and in
the SPLADE papers' code). Tokens of a prompt that the model's ``include_prompt: false`` leaves out
(``Batch.pool_skip``) carry the discarded segment id, so every mode but last-token skips them. One
implementation per
mode, the graph-safe one, picked once per engine by ``pooler(mode)``; several modes joined by "+"
are concatenated in that order, as sentence-transformers concatenates them. Finalization
(``finalize``) follows the Matryoshka recipe of Kusupati et al. 2022 / sentence-transformers'
``truncate_dim``: slice to ``dimensions`` first, then L2-normalize.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported inside the device functions, not here: ``finalize`` is numpy-only and runs in
# every replica, the no-op one included, whose process would otherwise pay torch's import (~2 s)
# and carry its ~10^5 extra objects through every garbage collection.

POOLINGS = ("cls", "mean", "last", "max", "mean_sqrt_len", "weightedmean",
            "splade", "splade_sum", "splade_log1p", "splade_sum_log1p")

# A pooling function: hidden [T, D] (any float dtype), seg_ids [T] int32 (sequence index of each
# token; padding tokens carry B, a row that is dropped), cu_seqlens [B+1] int32 → [B, D] float32.
# Graph-safe: no data-dependent shapes and no host syncs, so it is captured in CUDA graphs; the
# CPU runs the same functions on the same packed inputs. Empty sequences (padding slots, length 0)
# give a row the caller discards.
PoolFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def pool_cls(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The first pooled token of each sequence: row ``cu[:-1]``, or the first token after a prompt
    left out of pooling (its tokens carry the discarded segment id), as sentence-transformers picks
    the first token its attention mask keeps; a sequence that is all prompt falls back to ``cu[:-1]``."""
    import torch

    t = hidden.shape[0]
    cu = cu_seqlens.to(torch.int64)
    n = cu.shape[0] - 1
    # the smallest token index of each segment (t where a segment has no token)
    first = torch.full((n + 1,), t, device=hidden.device, dtype=torch.int64)
    first.scatter_reduce_(0, seg_ids.to(torch.int64), torch.arange(t, device=hidden.device), reduce="amin")
    first = torch.where(first[:n] < cu[1:], first[:n], cu[:-1])
    return hidden[first.clamp(max=t - 1)].float()


def pool_last(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Row ``cu[1:] - 1`` (the last token) of each sequence."""
    import torch

    return hidden[(cu_seqlens[1:].to(torch.int64) - 1).clamp(min=0)].float()


def _segment_sums(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence float32 sums of rows [B, D] (summed into row ``seg_ids[t]``) and lengths
    [B, 1] float32 (at least 1): the tokens of each segment, so a prompt left out of pooling (in
    the discarded segment) counts in neither."""
    import torch

    n = cu_seqlens.shape[0] - 1
    seg = seg_ids.to(torch.int64)
    counts = torch.zeros(n + 1, device=hidden.device, dtype=torch.float32)
    counts.index_add_(0, seg, torch.ones(seg.shape[0], device=hidden.device, dtype=torch.float32))
    lengths = counts[:n].clamp(min=1).unsqueeze(1)
    sums = torch.zeros(n + 1, hidden.shape[1], device=hidden.device, dtype=torch.float32)
    sums.index_add_(0, seg, hidden.float())
    return sums[:n], lengths


def pool_mean(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence sum of rows / length."""
    sums, lengths = _segment_sums(hidden, seg_ids, cu_seqlens)
    return sums / lengths


def pool_mean_sqrt_len(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence sum of rows / sqrt(length) (sentence-transformers' ``mean_sqrt_len_tokens``)."""
    sums, lengths = _segment_sums(hidden, seg_ids, cu_seqlens)
    return sums / lengths.sqrt()


def pool_max(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence elementwise maximum of the rows (scatter-amax into row ``seg_ids[t]``)."""
    import torch

    n = cu_seqlens.shape[0] - 1
    idx = seg_ids.to(torch.int64).unsqueeze(1).expand(-1, hidden.shape[1])
    # the maximum is exact in any dtype: reduce in the model's, convert the [B, D] result only
    out = torch.full((n + 1, hidden.shape[1]), float("-inf"), device=hidden.device, dtype=hidden.dtype)
    return out.scatter_reduce_(0, idx, hidden, reduce="amax")[:n].float()


def pool_weightedmean(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Rows weighted by their 1-based position in the sequence: sum(w * row) / sum(w)."""
    import torch

    cu = cu_seqlens.to(torch.int64)
    seg = seg_ids.to(torch.int64)
    n = cu.shape[0] - 1
    # position of token t = t - first token of its sequence (a prompt left out of pooling still
    # counts in it, as in sentence-transformers); padding and prompt tokens (segment n) land in
    # the dropped row whatever their weight
    pos = torch.arange(hidden.shape[0], device=hidden.device) - cu[seg]
    w = (pos + 1).to(torch.float32).unsqueeze(1)  # [T, 1]
    sums = torch.zeros(n + 1, hidden.shape[1], device=hidden.device, dtype=torch.float32)
    sums.index_add_(0, seg, hidden.float() * w)
    wsum = torch.zeros(n + 1, 1, device=hidden.device, dtype=torch.float32)
    wsum.index_add_(0, seg, w)
    return sums[:n] / wsum[:n].clamp(min=1e-9)


def _splade(reduce: str, log1p_twice: bool) -> PoolFn:
    """SPLADE pooling of logits [T, vocab] → [B, vocab] float32: ``reduce`` ("max" or "sum") over
    the sequence of log(1 + relu(x)) (``log1p_twice``: log(1 + log(1 + relu(x))), the
    ``log1p_relu`` activation of OpenSearch's models). For max, the transform is applied after the
    maximum (it is non-decreasing, so the result is the same) to [B, vocab] instead of [T, vocab]."""

    def act(x: torch.Tensor) -> torch.Tensor:
        import torch

        y = torch.log1p(torch.relu(x.float()))
        return torch.log1p(y) if log1p_twice else y

    def pool(logits: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        if reduce == "max":
            return act(pool_max(logits, seg_ids, cu_seqlens))
        return _segment_sums(act(logits), seg_ids, cu_seqlens)[0]

    return pool


_POOLERS: dict[str, PoolFn] = {"cls": pool_cls, "mean": pool_mean, "last": pool_last, "max": pool_max,
                               "mean_sqrt_len": pool_mean_sqrt_len, "weightedmean": pool_weightedmean,
                               "splade": _splade("max", False), "splade_sum": _splade("sum", False),
                               "splade_log1p": _splade("max", True), "splade_sum_log1p": _splade("sum", True)}


def pooler(mode: str) -> PoolFn:
    """The pooling function of ``mode`` (one of POOLINGS, or several joined by "+": their rows
    concatenated, [B, k * D]), chosen once when the engine loads.

    Raises ValueError for an unknown mode."""
    fns = []
    for m in mode.split("+"):
        if m not in _POOLERS:
            raise ValueError(f"unknown pooling {m!r}; choose one of {POOLINGS} (or several joined by '+')")
        fns.append(_POOLERS[m])
    if len(fns) == 1:
        return fns[0]

    def concatenated(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.cat([f(hidden, seg_ids, cu_seqlens) for f in fns], dim=1)

    return concatenated


def finalize(vectors: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """vectors [N, D] float32 → [N, dimensions or D] float32, truncated then L2-normalized.

    Raises ValueError when dimensions is outside [1, D].
    """
    if dimensions is not None:
        if not 1 <= dimensions <= vectors.shape[1]:
            raise ValueError(f"dimensions must be in [1, {vectors.shape[1]}], got {dimensions}")
        vectors = vectors[:, :dimensions]
    if normalize:
        # einsum: each row's sum of squares without the [N, D] temporary (on the batch-1 path)
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
        vectors = vectors / np.maximum(norms, 1e-12)[:, None]
    return np.ascontiguousarray(vectors, dtype=np.float32)
