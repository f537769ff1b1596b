"""The engine contract: what a replica (server/service.py, server/stats.py, server/main.py) uses
of an engine, written down. Torch-free (numpy and the model spec), so the no-op engine's
replica never loads torch.

Implemented by ``engine.Engine`` (the model on a device) and ``noop.NoopEngine`` (no model: a
benchmarking aid); ``tests/integration/test_contracts.py`` checks both. The contract between the scheduler
and the engine's input is ``batch.Batch``; the one between the engine and a model class is
``models/base.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from bouquet.engine.runtime.batch import Batch
from bouquet.modelspec import ModelSpec


@dataclass(frozen=True)
class EngineInfo:
    """What an engine reports about itself (the ``Info`` RPC, /health, logs).

    device   e.g. "cuda:0", "cpu", "noop"
    dtype    compute dtype without the "torch." prefix, e.g. "bfloat16"
    attention the attention backend's name ("varlen", "sdpa_grouped", "none")
    out_dim  floats per output row (``ModelSpec.dimension``)
    load_seconds wall time of construction (weights read, moved, fused)
    """

    device: str
    dtype: str
    attention: str
    out_dim: int
    load_seconds: float


@runtime_checkable
class ResultHandle(Protocol):
    """A launched batch. ``ready()`` never blocks: True when ``wait()`` would return at once.
    ``wait()`` blocks the calling thread (without the GIL while a device works) and returns the
    batch's rows, float32 [B, out_dim]; calling it again returns the same array."""

    def ready(self) -> bool: ...

    def wait(self) -> np.ndarray: ...


@runtime_checkable
class StepEngine(Protocol):
    """One model (or none) stepping packed batches.

    spec          the model's ModelSpec
    out_dim       floats per output row
    info          EngineInfo
    inline_step   True when every ``step`` costs next to nothing on the host (the no-op engine):
                  the replica then calls it on its event loop instead of a helper thread
    graph_captures CUDA graphs captured so far (0 without graphs); only grows
    graph_replays  batches answered by replaying a captured graph so far; only grows

    ``step(batch)`` launches the batch and returns its ResultHandle (at once on CUDA; on the
    CPU the work runs inside ``step`` and the handle is already ready). Raises on a device error.
    ``step_tokens(batch)``: the model's token outputs, one row per token [T, D'] float32 (bge-m3's
    sparse weight and ColBERT vector, else the last hidden states), eager, no graphs.
    ``replays(batch)``: True when ``step(batch)`` would replay an already captured CUDA graph (a
    cheap step the replica may also run on its event loop). ``warmup()`` runs one batch through
    the whole path and captures start-up graphs; raises when the model yields non-finite rows.
    ``shutdown()`` saves what the next start reuses (the bucket histogram).
    """

    spec: ModelSpec
    out_dim: int
    info: EngineInfo
    inline_step: bool

    @property
    def graph_captures(self) -> int: ...

    @property
    def graph_replays(self) -> int: ...

    def step(self, batch: Batch) -> ResultHandle: ...

    def step_tokens(self, batch: Batch) -> ResultHandle: ...

    def replays(self, batch: Batch) -> bool: ...

    def warmup(self) -> None: ...

    def shutdown(self) -> None: ...
