"""An engine that computes nothing, for measuring the host side of `bouquet embed` alone.

``NoopEngine`` has the part of ``bouquet.engine.engine.Engine``'s interface that the job and
``bench/embed_gpu.py`` use (``spec``, ``device``, ``dtype``, ``out_dim``, ``info``, ``step`` →
handle with ``wait``) and answers every batch at once with zero vectors, so a job run with it
measures read + tokenize + pack + finalize + write: the rows/s ceiling of the host, whatever the
accelerator. A benchmark tool only; the product never imports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bouquet.engine.batch import Batch


@dataclass(frozen=True)
class NoopInfo:
    """The fields of ``EngineInfo`` that the bench reports."""

    dtype: str
    attention: str = "none (no-op engine)"


class _Done:
    """A finished handle: ``wait()`` returns its rows [B, D] float32 at once."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def ready(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self._rows


class NoopEngine:
    """Zero vectors for every batch, instantly. ``device`` and ``dtype`` are only reported (they
    decide the job's pipelining depth and what its manifest records); no device is touched."""

    def __init__(self, spec: Any, device: Any, dtype: Any) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.out_dim: int = spec.dimension
        self.info = NoopInfo(str(dtype).removeprefix("torch."))

    def step(self, batch: Batch) -> _Done:
        # A fresh array per batch, as the real engine returns (its pinned host buffer).
        return _Done(np.zeros((batch.num_seqs, self.out_dim), dtype=np.float32))
