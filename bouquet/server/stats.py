"""Replica-side numbers for monitoring, reported in the gRPC ``Info`` reply.

The gateway polls ``Info`` (its health loop, about once a second) and exports these per replica
on ``/metrics``; a replica runs no HTTP server of its own. Counters only grow; histograms are
cumulative with fixed bounds (Prometheus semantics) so the gateway can re-export them as they are.
What this module does not own: batching decisions (scheduler.py) or the exporter (gateway/metrics.py).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from bouquet.engine.runtime.contract import StepEngine
from bouquet.proto import bouquet_pb2 as pb

# Tokens per engine step: the CUDA-graph buckets (multiples of 64 to 1,024, of 256 above) fall in these.
TOKEN_BOUNDS = (16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)
SEQ_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)


@dataclass
class CumulativeHistogram:
    """Observations counted per upper bound ``le``; ``cumulative()`` gives Prometheus buckets."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


@dataclass
class ReplicaStats:
    """Per-step observations made by the service's engine loop."""

    batch_tokens: CumulativeHistogram = field(default_factory=lambda: CumulativeHistogram(TOKEN_BOUNDS))
    batch_sequences: CumulativeHistogram = field(default_factory=lambda: CumulativeHistogram(SEQ_BOUNDS))
    step_seconds_sum: float = 0.0

    def observe_step(self, tokens: int, sequences: int, seconds: float) -> None:
        self.batch_tokens.observe(tokens)
        self.batch_sequences.observe(sequences)
        self.step_seconds_sum += seconds

    def fill(self, reply: pb.InfoReply, scheduler: Any, engine: StepEngine | None,
             inflight_requests: int) -> pb.InfoReply:
        """Copy the counters into ``reply``. ``scheduler.stats`` has batches/sequences/tokens/
        cancelled_seqs; the engine (None while the model loads) counts its CUDA-graph captures
        and replays (``contract.StepEngine``; 0 on the CPU, with --enforce-eager, or no-op)."""
        s = scheduler.stats
        reply.inflight_requests = inflight_requests
        reply.batches, reply.batch_sequences, reply.batch_tokens = s.batches, s.sequences, s.tokens
        reply.cancelled_sequences = s.cancelled_seqs
        reply.graph_captures = engine.graph_captures if engine is not None else 0
        reply.graph_replays = engine.graph_replays if engine is not None else 0
        reply.batch_tokens_le.extend(self.batch_tokens.bounds)
        reply.batch_tokens_cumulative.extend(self.batch_tokens.cumulative())
        reply.batch_sequences_le.extend(self.batch_sequences.bounds)
        reply.batch_sequences_cumulative.extend(self.batch_sequences.cumulative())
        reply.step_seconds_sum = self.step_seconds_sum
        return reply
