"""Batch formation: pure Python (numpy for the packed arrays), no torch, no asyncio.

Pending requests wait in one FIFO per priority class (bouquet/packing.py: the packing rule the
offline job uses too). ``next_batch`` takes sequences first-come-first-served from the highest
class with pending work — every `interactive` sequence before any `batch` one, and never both
classes in one batch — until the token budget or the sequence-slot limit is reached. An interactive sequence thus waits for at most the batches
already in flight (one on the CPU, ``depth`` on a GPU). A sequence longer than the budget still
runs, alone. Requests for per-token outputs (``Request.per_token``) queue apart and form batches of
their own, whose engine output has one row per token. What the scheduler does not own: running the engine, waiting for results, or any
network I/O (server/service.py does those); it only decides what runs next and routes result rows
back to their requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable

import numpy as np

from bouquet.config import MAX_BATCH_SEQS
from bouquet.engine.runtime.batch import Batch
from bouquet.packing import PackQueue, cumulative


class Priority(IntEnum):
    INTERACTIVE = 0
    BATCH = 1


class QueueFull(Exception):
    """The pending-token limit would be exceeded; the caller answers 429/RESOURCE_EXHAUSTED."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(f"queue full: {pending} tokens pending, limit {limit}")
        self.pending, self.limit = pending, limit


@dataclass(eq=False)
class Request:
    """One client request: ``seqs[i]`` is int32 token ids [len_i]; results land in ``rows[i]``.

    ``on_done`` is called once, from ``Scheduler.complete``, when every row is in (or, with an
    error message, when a row failed). ``cum`` and ``next`` make it a run of bouquet/packing.py:
    set when it is queued, ``next`` advanced as its sequences are batched.
    """

    seqs: list[np.ndarray]
    type_ids: list[np.ndarray | None] | None = None
    priority: Priority = Priority.INTERACTIVE
    on_done: Callable[["Request"], None] | None = None
    rows: list[np.ndarray | None] = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False
    error: str | None = None
    engine_failed: bool = False  # the error is the engine's (an exception in a step), not the input's
    per_token: bool = False  # rows[i] is [len_i, D'] (token outputs) instead of one [D] row
    pool_skip: int = 0  # leading tokens of every sequence left out of pooling (its prompt)
    cum: list[int] = field(default_factory=lambda: [0])  # [n+1] cumulative tokens, once queued
    next: int = 0  # first sequence not yet handed to the engine

    def __post_init__(self) -> None:
        self.rows = [None] * len(self.seqs)
        self.remaining = len(self.seqs)

    @property
    def queued(self) -> int:
        """Sequences queued and not yet handed to the engine."""
        return len(self.cum) - 1 - self.next

    @property
    def num_tokens(self) -> int:
        return int(sum(len(s) for s in self.seqs))


@dataclass(frozen=True)
class ScheduledBatch:
    batch: Batch
    owners: list[tuple[Request, int]]  # row b of the engine output → (request, sequence index)
    per_token: bool = False  # the engine output has one row per token: sequence b is rows cu[b]:cu[b+1]


@dataclass
class SchedulerStats:
    batches: int = 0
    sequences: int = 0
    tokens: int = 0
    cancelled_seqs: int = 0


class Scheduler:
    """FCFS within a priority class under a token budget. Not thread-safe: one event loop owns it."""

    def __init__(self, max_batch_tokens: int, max_batch_seqs: int = MAX_BATCH_SEQS,
                 max_queue_tokens: int | None = None) -> None:
        if max_batch_tokens < 1 or max_batch_seqs < 1:
            raise ValueError(f"max_batch_tokens and max_batch_seqs must be >= 1, got {max_batch_tokens}, {max_batch_seqs}")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self.max_queue_tokens = max_queue_tokens
        self._queues: dict[tuple[Priority, bool], PackQueue[Request]] = {
            (p, t): PackQueue(max_batch_tokens, max_batch_seqs) for p in Priority for t in (False, True)}
        self.stats = SchedulerStats()

    @property
    def pending_tokens(self) -> int:
        """Tokens of the sequences queued and not yet batched, all classes."""
        return sum(q.pending_tokens for q in self._queues.values())

    def add(self, req: Request) -> None:
        """Queue every sequence of ``req``. Raises QueueFull beyond ``max_queue_tokens`` and
        ValueError for a request with no sequences or an empty sequence."""
        if not req.seqs:
            raise ValueError("a request needs at least one sequence")
        if any(len(s) == 0 for s in req.seqs):
            raise ValueError("every sequence needs at least one token")
        n = req.num_tokens
        pending = self.pending_tokens
        if self.max_queue_tokens is not None and pending > 0 and pending + n > self.max_queue_tokens:
            raise QueueFull(pending, self.max_queue_tokens)
        req.cum, req.next = cumulative(len(s) for s in req.seqs), 0
        self._queues[(req.priority, req.per_token)].add(req)

    def cancel(self, req: Request) -> int:
        """Drop ``req``'s sequences that have not run yet; returns how many were dropped.
        Rows already in flight are discarded by ``complete``."""
        if req.cancelled:
            return 0
        req.cancelled = True
        dropped = self._queues[(req.priority, req.per_token)].remove(req)
        self.stats.cancelled_seqs += dropped
        return dropped

    def has_pending(self) -> bool:
        return any(self._queues.values())

    def next_batch(self) -> ScheduledBatch | None:
        """The next batch to run, or None when nothing is pending."""
        for key, queue in self._queues.items():  # (priority, per_token) in priority order
            # Only one class per batch: a batch with interactive work is not topped up with
            # batch-class work, so the query's own batch stays small and its latency is at most
            # the batch in flight plus a short one, not two full batches.
            slices = queue.take() if queue else None  # (the loop asks after every step: most are empty)
            if slices:
                break
        else:
            return None
        owners = [(s.run, i) for s in slices for i in range(s.lo, s.hi)]
        seqs = [r.seqs[i] for r, i in owners]
        tts = None
        if any(r.type_ids is not None for r, _ in owners):
            tts = [r.type_ids[i] if r.type_ids is not None else None for r, i in owners]
        self.stats.batches += 1
        self.stats.sequences += len(owners)
        self.stats.tokens += sum(s.tokens for s in slices)
        skip = [r.pool_skip for r, _ in owners]
        return ScheduledBatch(Batch.pack(seqs, tts, skip), owners, per_token=key[1])

    def complete(self, sb: ScheduledBatch, rows: np.ndarray | None, error: str | None = None) -> list[Request]:
        """Route rows [B, D] of a finished batch to their requests (or fail them with ``error``).
        Returns the requests that became done; their ``on_done`` has been called."""
        done: list[Request] = []
        cu = sb.batch.cu_seqlens
        for b, (req, i) in enumerate(sb.owners):
            if req.remaining == 0:
                continue  # already failed or finished
            if error is not None or rows is None:
                req.error = error or "engine failure"
                req.engine_failed = True
                req.remaining = 0
            else:
                row = rows[cu[b]:cu[b + 1]] if sb.per_token else rows[b]
                if not np.isfinite(row).all():
                    req.error = f"input {i} produced non-finite values (overflow in the model's dtype)"
                    req.remaining = 0
                else:
                    req.rows[i] = row
                    req.remaining -= 1
            if req.remaining == 0:
                done.append(req)
                if req.error is not None and req.queued:
                    self.cancel(req)  # its other sequences need not run
                if req.on_done is not None:
                    req.on_done(req)
        return done
