"""The contract between the scheduler and the engine: one packed batch, no padding.

Imports numpy only (the scheduler that builds it imports no torch). Layout follows
FlashAttention's varlen convention (``cu_seqlens``), as in text-embeddings-inference's ``Batch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Batch:
    """B sequences packed into T tokens.

    input_ids      [T]   int32  token ids, sequences back to back
    position_ids   [T]   int32  0-based position of each token inside its sequence
    token_type_ids [T]   int32  segment ids (BERT pairs), or None when the model has none
    cu_seqlens     [B+1] int32  cu_seqlens[i] = first token of sequence i; cu_seqlens[B] = T
    max_seqlen     int          longest sequence, tokens
    pool_skip      [B]   int32  leading tokens of each sequence left out of pooling (a prompt that
                                sentence-transformers' ``include_prompt: false`` excludes), or None
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    token_type_ids: np.ndarray | None
    cu_seqlens: np.ndarray
    max_seqlen: int
    pool_skip: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    @staticmethod
    def pack(
        seqs: Sequence[np.ndarray], type_ids: Sequence[np.ndarray | None] | None = None,
        pool_skip: Sequence[int] | None = None,
    ) -> "Batch":
        """Concatenate int32 token arrays (each length ≥ 1) into a Batch; ``pool_skip`` (one int
        per sequence, or None when all are 0) becomes ``Batch.pool_skip``.

        Raises ValueError on an empty list or an empty sequence.
        """
        if not seqs:
            raise ValueError("cannot pack an empty list of sequences")
        if len(seqs) == 1 and (type_ids is None or type_ids[0] is None) and (pool_skip is None or not pool_skip[0]):
            # one text, the batch-1 query: the general path's concatenate / repeat cost ~10 µs more
            ids = np.array(seqs[0], dtype=np.int32)
            n = int(ids.shape[0])
            if n < 1:
                raise ValueError("every sequence needs at least one token")
            return Batch(ids, np.arange(n, dtype=np.int32), None, np.array([0, n], dtype=np.int32), n, None)
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
        if int(lengths.min()) < 1:
            raise ValueError("every sequence needs at least one token")
        cu = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        ids = np.concatenate(seqs).astype(np.int32, copy=False)
        # position within each sequence: global index minus the start of its sequence
        pos = np.arange(ids.shape[0], dtype=np.int32) - np.repeat(cu[:-1], lengths)
        tt = None
        if type_ids is not None and any(t is not None for t in type_ids):
            tt = np.concatenate(
                [t if t is not None else np.zeros(len(s), np.int32) for s, t in zip(seqs, type_ids)]
            ).astype(np.int32, copy=False)
        skip = None
        if pool_skip is not None and any(pool_skip):
            skip = np.asarray(pool_skip, dtype=np.int32)
        return Batch(ids, pos, tt, cu, int(lengths.max()), skip)
