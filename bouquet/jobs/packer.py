"""Token-budget batching for offline jobs, and the pipelined engine loop that consumes it.

The packing rule is the server's (bouquet/packing.py): sequences strictly in arrival order (which
keeps output shards trivially in order), at most ``max_tokens`` tokens and ``max_seqs`` sequences
per batch, an over-budget sequence alone. A batch may span several groups; each group ("owner")
receives its rows back in order through ``Segment``s.

What this module does not own: reading, tokenization, output files.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from bouquet.engine.runtime.batch import Batch
from bouquet.packing import PackQueue, Slice


@dataclass(eq=False)
class Group:
    """Tokenized sequences of one owner (e.g. a chunk of input rows) and where its results go.

    seqs     n int32 token arrays
    cum      [n+1] int64 cumulative token counts
    vectors  [n, D] float32, filled as batches complete
    """

    seqs: list[np.ndarray]
    owner: Any
    dim: int
    cum: np.ndarray = field(init=False)
    vectors: np.ndarray = field(init=False)
    next: int = 0  # first row not yet batched
    filled: int = 0  # rows whose vectors arrived

    def __post_init__(self) -> None:
        self.cum = np.zeros(len(self.seqs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.seqs], out=self.cum[1:])
        self.vectors = np.empty((len(self.seqs), self.dim), dtype=np.float32)

    @property
    def rows(self) -> int:
        return len(self.seqs)

    @property
    def tokens(self) -> int:
        return int(self.cum[-1])


Segment = Slice[Group]  # rows [lo, hi) of ``run``, a Group


class Packer:
    """FIFO of groups → packed batches under a token and sequence budget.

    Raises ValueError when max_tokens or max_seqs < 1. A sequence longer than ``max_tokens`` gets
    a batch of its own (never dropped).
    """

    def __init__(self, max_tokens: int, max_seqs: int, pool_skip: int = 0) -> None:
        self._queue: PackQueue[Group] = PackQueue(max_tokens, max_seqs)
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.pool_skip = pool_skip  # leading tokens of every sequence left out of pooling (the job's prompt)

    @property
    def pending_tokens(self) -> int:
        return self._queue.pending_tokens

    def add(self, group: Group) -> None:
        self._queue.add(group)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def take(self) -> tuple[Batch, list[Segment]]:
        """The next batch and which rows of which groups it holds. Raises IndexError when empty."""
        segs = self._queue.take()
        if not segs:
            raise IndexError("no pending sequences")
        seqs = [seq for s in segs for seq in s.run.seqs[s.lo:s.hi]]
        return Batch.pack(seqs, None, [self.pool_skip] * len(seqs) if self.pool_skip else None), segs


def scatter(rows: np.ndarray, segs: list[Segment]) -> None:
    """Copy a batch's output rows [B, D] back into the groups it came from, in order."""
    off = 0
    for s in segs:
        n = s.hi - s.lo
        s.run.vectors[s.lo:s.hi] = rows[off:off + n]
        s.run.filled += n
        off += n


def run_pipelined(
    engine: Any, batches: Iterable[tuple[Batch, list[Segment]]], post: Callable[[np.ndarray], np.ndarray],
    depth: int = 1,
) -> Iterator[tuple[int, int]]:
    """Step every batch through ``engine`` keeping up to ``depth`` batches in flight besides the
    newest (on CUDA ``step`` is asynchronous: batch N+1 is launched before batch N is awaited).

    ``post`` maps [B, D] float32 → [B, D'] (normalization). Yields (rows, tokens) per completed
    batch, after its rows were scattered into their groups.
    """
    inflight: deque[tuple[Any, list[Segment], int]] = deque()

    def complete() -> tuple[int, int]:
        handle, segs, tokens = inflight.popleft()
        out = post(handle.wait())
        scatter(out, segs)
        return out.shape[0], tokens

    for batch, segs in batches:
        inflight.append((engine.step(batch), segs, batch.num_tokens))
        while len(inflight) > depth:
            yield complete()
    while inflight:
        yield complete()


def drain(packer: Packer) -> Iterator[tuple[Batch, list[Segment]]]:
    """Every pending batch of ``packer``."""
    while packer:
        yield packer.take()
