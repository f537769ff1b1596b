"""A benchmarking aid: an engine that runs no model (``bouquet serve --engine noop``).

It answers every packed batch with zero vectors of the model's output size, at once, so that a
benchmark through the real gateway → gRPC → scheduler → service path measures everything but the
model: HTTP parsing, tokenization, the gRPC hop, batching and reply encoding. The model's spec
(dimension, limits, tokenizer) is still loaded by the caller, so inputs are validated exactly as
with the real engine. Zero rows stay zero after normalization (``finalize`` divides by at least
1e-12), so replies have the right shape and are obviously not embeddings.

What it does not own: anything on a device. It imports numpy only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from bouquet.engine.batch import Batch
from bouquet.modelspec import ModelSpec


@dataclass(frozen=True)
class NoopInfo:
    """The fields of ``EngineInfo`` that the service reports (``Info`` RPC and logs)."""

    device: str = "noop"
    dtype: str = "float32"
    attention: str = "none"
    out_dim: int = 0
    load_seconds: float = 0.0


class NoopResult:
    """A finished result: ``wait()`` returns float32 zeros [B, out_dim] without blocking."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def ready(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self._rows


class NoopEngine:
    """Same ``step``/``warmup``/``shutdown`` surface as ``engine.Engine``; no weights, no torch."""

    inline_step = True  # step allocates zeros: the server calls it on its event loop, no thread hop

    def __init__(self, spec: ModelSpec) -> None:
        t0 = time.perf_counter()
        self.spec = spec
        self.out_dim = spec.dimension
        self.info = NoopInfo(out_dim=self.out_dim, load_seconds=time.perf_counter() - t0)

    def step(self, batch: Batch) -> NoopResult:
        """Zero rows for ``batch.num_seqs`` sequences, float32 [B, out_dim]."""
        return NoopResult(np.zeros((batch.num_seqs, self.out_dim), dtype=np.float32))

    def warmup(self) -> None:
        """Nothing to warm up; kept so the server treats both engines alike."""

    def shutdown(self) -> None:
        """Nothing to save."""
