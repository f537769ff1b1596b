"""Token-budget packing: which pending sequences form the next engine batch.

One rule for the server's scheduler (server/scheduler.py) and the offline job (jobs/packer.py):
sequences are taken strictly in arrival order until one more would take the batch past
``max_tokens`` tokens or ``max_seqs`` sequences; a sequence longer than ``max_tokens`` still runs,
alone (never dropped). Order, not length-sorting: the engine is packed, so sorting buys no padding,
and arrival order keeps latency fair and output shards in order.

The pending unit is a *run*: consecutive sequences of one owner (a request, a chunk of input rows)
with their cumulative token counts, taken from the front in slices. Pure Python (no torch, no
numpy needed), so server/ and jobs/ both import it without importing each other.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate
from typing import Generic, Iterable, Protocol, Sequence, TypeVar


def cumulative(lengths: Iterable[int]) -> list[int]:
    """[n+1] running token counts of sequences with these lengths (tokens), starting at 0."""
    return list(accumulate(lengths, initial=0))


class Run(Protocol):
    """What the queue needs of a run of sequences: ``cum`` [n+1] cumulative token counts (ints,
    non-decreasing, ``cum[0] == 0``; a list or an int64 array) and ``next``, the first sequence
    not yet taken (the queue advances it)."""

    cum: Sequence[int]
    next: int


R = TypeVar("R", bound=Run)


@dataclass(frozen=True)
class Slice(Generic[R]):
    """Sequences [lo, hi) of ``run``, in one batch."""

    run: R
    lo: int
    hi: int

    @property
    def tokens(self) -> int:
        return int(self.run.cum[self.hi] - self.run.cum[self.lo])


class PackQueue(Generic[R]):
    """FIFO of runs → the next batch's slices under a token and a sequence budget.

    Raises ValueError when ``max_tokens`` or ``max_seqs`` < 1. Not thread-safe.
    ``pending_tokens`` counts the tokens of sequences not yet taken.
    """

    def __init__(self, max_tokens: int, max_seqs: int) -> None:
        if max_tokens < 1 or max_seqs < 1:
            raise ValueError(f"max_tokens and max_seqs must be >= 1, got {max_tokens} and {max_seqs}")
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self._runs: deque[R] = deque()
        self.pending_tokens = 0

    def __bool__(self) -> bool:
        return bool(self._runs)

    def add(self, run: R) -> None:
        """Queue ``run``'s sequences from ``run.next`` on (a run with none left is ignored)."""
        if run.next < len(run.cum) - 1:
            self._runs.append(run)
            self.pending_tokens += int(run.cum[-1] - run.cum[run.next])

    def remove(self, run: R) -> int:
        """Drop ``run``'s sequences not yet taken (it is marked fully taken); returns how many."""
        n = len(run.cum) - 1
        left = n - run.next
        if left > 0:
            self._runs = deque(r for r in self._runs if r is not run)
            self.pending_tokens -= int(run.cum[n] - run.cum[run.next])
            run.next = n
        return left

    def take(self) -> list[Slice[R]]:
        """The next batch: the longest arrival-order prefix of pending sequences within both
        budgets (at least one sequence). Empty when nothing is pending."""
        out: list[Slice[R]] = []
        tokens = seqs = 0
        runs = self._runs
        while runs:
            run = runs[0]
            lo, n = run.next, len(run.cum) - 1
            base = run.cum[lo]
            # Sequences [lo, hi) fit the tokens left: cum[hi] - base <= room.
            hi = bisect_right(run.cum, base + self.max_tokens - tokens, lo, n + 1) - 1
            hi = min(hi, lo + self.max_seqs - seqs)
            if hi <= lo:
                if out:
                    break
                hi = lo + 1  # an over-budget sequence runs alone
            out.append(Slice(run, lo, hi))
            tokens += int(run.cum[hi] - base)
            seqs += hi - lo
            run.next = hi
            if hi < n:
                break  # the run's next sequence does not fit
            runs.popleft()
        self.pending_tokens -= tokens
        return out
