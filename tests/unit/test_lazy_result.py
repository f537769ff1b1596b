"""The engine's lazy result handle on the CPU fallback: complete at once, same rows as forward."""
from __future__ import annotations

import numpy as np

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine, GraphOptions, PendingResult
from bouquet.modelspec import load_spec


def test_cpu_step_returns_ready_handle_equal_to_forward() -> None:
    engine = Engine(load_spec(None), device="cpu", graphs=GraphOptions(enabled=True))
    assert engine.graphs is None  # graphs are a CUDA-only path
    batch = Batch.pack([np.array([101, 7592, 2088, 102], np.int32), np.array([101, 102], np.int32)])
    handle = engine.step(batch)
    assert isinstance(handle, PendingResult) and handle.ready()
    rows = handle.wait()
    assert rows.shape == (2, engine.out_dim) and rows.dtype == np.float32
    np.testing.assert_allclose(rows, engine.forward(batch).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(handle.wait(), rows)  # waiting twice is harmless
