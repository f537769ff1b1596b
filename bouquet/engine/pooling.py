"""Pooling, normalization and Matryoshka truncation: the one place these live.

Pooling acts on packed hidden states and ``cu_seqlens`` (sentence-transformers' ``Pooling``
semantics, without padding): CLS = row ``cu[:-1]``, last token = row ``cu[1:] - 1``, mean =
per-sequence sum / length. Finalization (``finalize``) follows the Matryoshka recipe of
Kusupati et al. 2022 / sentence-transformers' ``truncate_dim``: slice to ``dimensions`` first,
then L2-normalize.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported inside the device functions, not here: ``finalize`` is numpy-only and runs in
# every replica, the no-op one included, whose process would otherwise pay torch's import (~2 s)
# and carry its ~10^5 extra objects through every garbage collection.

POOLINGS = ("cls", "mean", "last")


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [T, D] (any float dtype), cu_seqlens [B+1] int32 → [B, D] float32.

    Raises ValueError for an unknown mode. Empty sequences (padding slots, length 0) pool to 0
    for ``mean``; their rows are discarded by the caller.
    """
    import torch

    cu = cu_seqlens.to(torch.int64)
    if mode == "cls":
        return hidden[cu[:-1].clamp(max=hidden.shape[0] - 1)].float()
    if mode == "last":
        return hidden[(cu[1:] - 1).clamp(min=0)].float()
    if mode == "mean":
        lengths = cu[1:] - cu[:-1]  # [B]
        seg = torch.repeat_interleave(
            torch.arange(lengths.shape[0], device=hidden.device), lengths, output_size=hidden.shape[0]
        )
        sums = torch.zeros(lengths.shape[0], hidden.shape[1], device=hidden.device, dtype=torch.float32)
        sums.index_add_(0, seg, hidden.float())
        return sums / lengths.clamp(min=1).unsqueeze(1).to(torch.float32)
    raise ValueError(f"unknown pooling {mode!r}; choose one of {POOLINGS}")


def pool_static(hidden: torch.Tensor, seg_ids: torch.Tensor, cu_seqlens: torch.Tensor, mode: str) -> torch.Tensor:
    """Like ``pool`` but graph-safe: hidden [T, D], seg_ids [T] int32/int64 (sequence index of
    each token; padding tokens carry B, a row that is dropped), cu_seqlens [B+1] → [B, D] float32.
    No data-dependent shapes and no host syncs, so it can be captured in a CUDA graph."""
    import torch

    if mode != "mean":
        return pool(hidden, cu_seqlens, mode)
    cu = cu_seqlens.to(torch.int64)
    n = cu.shape[0] - 1
    lengths = (cu[1:] - cu[:-1]).clamp(min=1).unsqueeze(1).to(torch.float32)
    sums = torch.zeros(n + 1, hidden.shape[1], device=hidden.device, dtype=torch.float32)
    sums.index_add_(0, seg_ids.to(torch.int64), hidden.float())
    return sums[:n] / lengths


def finalize(vectors: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """vectors [N, D] float32 → [N, dimensions or D] float32, truncated then L2-normalized.

    Raises ValueError when dimensions is outside [1, D].
    """
    if dimensions is not None:
        if not 1 <= dimensions <= vectors.shape[1]:
            raise ValueError(f"dimensions must be in [1, {vectors.shape[1]}], got {dimensions}")
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=np.float32)
