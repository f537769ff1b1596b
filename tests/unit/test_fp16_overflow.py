"""A row that overflows in float16 fails only its own request, with a clear message, and the
engine keeps serving. Real parts: the tiny Qwen3 model in fp16 on the CPU, the real scheduler.

The overflow is made deterministic: one token's embedding row sits at fp16's maximum (65504)
and the first attention output projection is scaled up, so the residual add of that token
exceeds 65504 → inf → NaN after the next RMSNorm. Other tokens stay in range, and in float32
the very same weights give finite values (it is an fp16 overflow, not a broken model).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.models.weights import load_safetensors
from bouquet.modelspec import load_spec
from bouquet.server.scheduler import Request, Scheduler
from tests.fixtures.tiny_models import make_tiny_model

HOT = 300  # the token whose embedding overflows


def overflowing_engine(model_dir: Path, dtype: str) -> Engine:
    spec = load_spec(str(model_dir))
    state = load_safetensors(spec.path)
    state["embed_tokens.weight"][HOT] = 65504.0
    state["layers.0.self_attn.o_proj.weight"] *= 100.0
    return Engine.from_state_dict(spec, state, device="cpu", dtype=dtype)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("fp16") / "qwen3")


def test_overflowing_row_fails_only_its_request(model_dir: Path) -> None:
    engine = overflowing_engine(model_dir, "float16")
    ok = Request([np.array([5, 6, 7, 8], np.int32), np.array([9, 10], np.int32)])
    bad = Request([np.array([11, 12], np.int32), np.array([5, 6, HOT], np.int32)])
    sched = Scheduler(max_batch_tokens=1024)
    sched.add(ok)
    sched.add(bad)
    sb = sched.next_batch()
    assert sb is not None and len(sb.owners) == 4  # one batch holds both requests
    rows = engine.step(sb.batch).wait()
    assert not np.isfinite(rows[3]).all()  # the precondition: fp16 really overflowed there
    done = sched.complete(sb, rows)
    assert set(done) == {ok, bad}
    assert ok.error is None and all(np.isfinite(r).all() for r in ok.rows)
    assert bad.error is not None and "non-finite" in bad.error and "input 1" in bad.error
    # the engine keeps serving
    again = engine.step(Batch.pack([np.array([5, 6, 7], np.int32)])).wait()
    assert np.isfinite(again).all()


def test_same_weights_are_finite_in_float32(model_dir: Path) -> None:
    rows = overflowing_engine(model_dir, "float32").step(Batch.pack([np.array([5, 6, HOT], np.int32)])).wait()
    assert np.isfinite(rows).all()
