"""A benchmarking aid: an engine that runs no model (``bouquet serve --engine noop``, and the
host-side ceiling of ``bouquet bench embed``).

It answers every packed batch with rows of the model's output size, so that a benchmark through
the real gateway → gRPC → scheduler → service path (or the batch job's read → tokenize → pack →
finalize → write) measures everything but the model. The model's spec (dimension, limits,
tokenizer) is still loaded by the caller, so inputs are validated exactly as with the real engine.

Rows are zeros by default: they stay zero after normalization (``finalize`` divides by at least
1e-12), so replies have the right shape and are obviously not embeddings. ``random_rows`` gives
fixed random unit vectors instead, for writers whose cost depends on the values (zeros compress
and dictionary-encode unlike real embeddings). ``rows_per_s`` > 0 models a device of that speed:
batches run back to back and ``wait`` sleeps (without the GIL, as ``cuda.Event.synchronize``
does) until the batch would be done, which shows on a CPU-only machine whether a pipeline keeps
a fast device busy.

What it does not own: anything on a device. It imports numpy only (no torch in its replica).
"""
from __future__ import annotations

import time

import numpy as np

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.contract import EngineInfo
from bouquet.modelspec import ModelSpec


class NoopResult:
    """``wait()`` returns the rows, float32 [B, out_dim], at ``done_at`` (perf_counter seconds) at
    the earliest; 0 means at once. Implements ``contract.ResultHandle``."""

    def __init__(self, rows: np.ndarray, done_at: float = 0.0) -> None:
        self._rows, self._done_at = rows, done_at

    def ready(self) -> bool:
        return self._done_at == 0.0 or time.perf_counter() >= self._done_at

    def wait(self) -> np.ndarray:
        left = self._done_at - time.perf_counter()
        if self._done_at and left > 0:
            time.sleep(left)
        return self._rows


class NoopEngine:
    """Implements ``contract.StepEngine`` without weights or torch.

    ``device`` and ``dtype`` are only reported (``info``; the batch job reads ``device.type`` to
    choose its pipelining depth, so pass a ``torch.device`` there); no device is touched.
    ``rows_per_s``: modelled device speed (0: answers at once). ``random_rows``: random unit
    vectors (``max_rows`` of them, drawn once) instead of zeros.
    """

    inline_step = True  # step only slices an array: the server calls it on its event loop, no thread hop
    graph_captures = 0  # no device, no CUDA graphs
    graph_replays = 0

    def __init__(self, spec: ModelSpec, device: object = "noop", dtype: object = "float32", rows_per_s: float = 0.0,
                 random_rows: bool = False, max_rows: int = 4096) -> None:
        t0 = time.perf_counter()
        self.spec, self.device, self.dtype = spec, device, dtype
        self.out_dim = spec.dimension
        self.rows_per_s = rows_per_s
        self._random: np.ndarray | None = None
        if random_rows:
            rows = np.random.default_rng(0).standard_normal((max_rows, self.out_dim)).astype(np.float32)
            self._random = rows / np.linalg.norm(rows, axis=1, keepdims=True)  # [max_rows, D] float32
        self._busy_until = 0.0  # perf_counter seconds when the modelled device finishes its queue
        self.info = EngineInfo(str(device), str(dtype).removeprefix("torch."), "none", self.out_dim,
                               time.perf_counter() - t0)

    def _rows(self, b: int) -> np.ndarray:
        """A fresh float32 [b, out_dim] array per batch, as the real engine returns."""
        if self._random is None:
            return np.zeros((b, self.out_dim), dtype=np.float32)
        n = len(self._random)
        return np.tile(self._random, (b // n + 1, 1))[:b] if b > n else self._random[:b].copy()

    def step(self, batch: Batch) -> NoopResult:
        """Rows for ``batch.num_seqs`` sequences, float32 [B, out_dim]."""
        b = batch.num_seqs
        if self.rows_per_s <= 0:
            return NoopResult(self._rows(b))
        self._busy_until = max(time.perf_counter(), self._busy_until) + b / self.rows_per_s
        return NoopResult(self._rows(b), self._busy_until)

    def step_tokens(self, batch: Batch) -> NoopResult:
        """Rows for ``batch.num_tokens`` tokens, float32 [T, out_dim] (no device time modelled)."""
        return NoopResult(self._rows(batch.num_tokens))

    def replays(self, batch: Batch) -> bool:
        """Never: there are no CUDA graphs (every step is cheap anyway: ``inline_step``)."""
        return False

    def warmup(self) -> None:
        """Nothing to warm up; kept so the server treats both engines alike."""

    def shutdown(self) -> None:
        """Nothing to save."""
