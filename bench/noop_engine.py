"""An engine that computes nothing, for measuring the host side of `bouquet embed` alone.

``NoopEngine`` has the part of ``bouquet.engine.engine.Engine``'s interface that the job and
``bench/embed_gpu.py`` use (``spec``, ``device``, ``dtype``, ``out_dim``, ``info``, ``step`` →
handle with ``wait``). By default it answers every batch at once, so a job run with it measures
read + tokenize + pack + finalize + write: the rows/s ceiling of the host, whatever the accelerator.
With ``rows_per_s`` it models a device of that speed instead (batches run back to back, ``wait``
sleeps without the GIL until the batch would be done, as ``cuda.Event.synchronize`` does), which
shows on a CPU-only machine whether the pipeline keeps a fast device busy. A benchmark tool only;
the product never imports it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bouquet.engine.batch import Batch


@dataclass(frozen=True)
class NoopInfo:
    """The fields of ``EngineInfo`` that the bench reports."""

    dtype: str
    attention: str = "none (no-op engine)"


class _Handle:
    """``wait()`` returns the rows [B, D] float32, at ``done_at`` (perf_counter seconds) at the earliest."""

    def __init__(self, rows: np.ndarray, done_at: float) -> None:
        self._rows, self._done_at = rows, done_at

    def ready(self) -> bool:
        return time.perf_counter() >= self._done_at

    def wait(self) -> np.ndarray:
        left = self._done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self._rows


class NoopEngine:
    """Instant answers (``rows_per_s`` 0) or a modelled device of ``rows_per_s``. ``device`` and
    ``dtype`` are only reported (they decide the job's pipelining depth and what its manifest
    records); no device is touched. The rows are random unit vectors drawn once, not zeros:
    zeros compress and dictionary-encode unlike real embeddings and would skew the writer's cost."""

    def __init__(self, spec: Any, device: Any, dtype: Any, rows_per_s: float = 0.0, max_rows: int = 4096) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.out_dim: int = spec.dimension
        self.info = NoopInfo(str(dtype).removeprefix("torch."))
        self.rows_per_s = rows_per_s
        rows = np.random.default_rng(0).standard_normal((max_rows, self.out_dim)).astype(np.float32)
        self._rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)  # [max_rows, D] float32
        self._busy_until = 0.0  # perf_counter seconds when the modelled device finishes its queue

    def step(self, batch: Batch) -> _Handle:
        b = batch.num_seqs
        # A fresh array per batch, as the real engine returns (its pinned host buffer).
        rows = np.tile(self._rows, (b // len(self._rows) + 1, 1))[:b] if b > len(self._rows) else self._rows[:b].copy()
        if self.rows_per_s <= 0:
            return _Handle(rows, 0.0)
        self._busy_until = max(time.perf_counter(), self._busy_until) + b / self.rows_per_s
        return _Handle(rows, self._busy_until)
