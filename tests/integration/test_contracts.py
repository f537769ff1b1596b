"""The written contracts between layers hold for what implements them: both engines (the torch
one and the no-op one) are ``contract.StepEngine``s with ``ResultHandle`` results, every
registered architecture's class is a ``models.base.PackedModel``, the family table is the one
source of architecture facts, and the replica's CUDA-graph counters reach /metrics (0 on the
CPU with --enforce-eager; tests/gpu/test_gpu_fastpath.py checks them nonzero on a GPU)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.contract import ResultHandle, StepEngine
from bouquet.families import FAMILIES, family
from bouquet.modelspec import load_spec
from helpers import BouquetProcess, graph_counters
from tests.fixtures.tiny_models import make_tiny_model

MEMBERS = ("spec", "out_dim", "info", "inline_step", "graph_captures", "graph_replays",
           "step", "replays", "warmup", "shutdown")
BATCH = Batch.pack([np.array([101, 7592, 2088, 102], np.int32), np.array([101, 102], np.int32)])


def check_engine(e: StepEngine) -> None:
    assert isinstance(e, StepEngine)  # runtime_checkable: every member is present …
    for name in MEMBERS:  # … named here too, so a member dropped from the Protocol is noticed
        assert hasattr(e, name), name
    assert isinstance(e.inline_step, bool) and isinstance(e.graph_captures, int) and isinstance(e.graph_replays, int)
    assert e.info.out_dim == e.out_dim == e.spec.dimension
    assert e.replays(BATCH) is False  # no CUDA graphs on these engines
    handle = e.step(BATCH)
    assert isinstance(handle, ResultHandle) and handle.ready()
    rows = handle.wait()
    assert rows.shape == (2, e.out_dim) and rows.dtype == np.float32
    assert (e.graph_captures, e.graph_replays) == (0, 0)


def test_torch_engine_implements_the_contract() -> None:
    from bouquet.engine.runtime.engine import Engine

    check_engine(Engine(load_spec(None), device="cpu"))


def test_noop_engine_implements_the_contract() -> None:
    from bouquet.engine.runtime.noop import NoopEngine

    engine = NoopEngine(load_spec(None))
    check_engine(engine)
    assert engine.inline_step and engine.info.device == "noop" and not engine.step(BATCH).wait().any()


def test_noop_engine_models_a_device_and_random_rows() -> None:
    from bouquet.engine.runtime.noop import NoopEngine

    engine = NoopEngine(load_spec(None), rows_per_s=20.0, random_rows=True, max_rows=1)
    t0 = time.perf_counter()
    handle = engine.step(BATCH)  # 2 rows at 20 rows/s: done 0.1 s later
    assert not handle.ready()
    rows = handle.wait()
    assert time.perf_counter() - t0 >= 0.09 and handle.ready()
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)  # unit vectors, tiled past max_rows


def test_torch_free_modules_import_no_torch() -> None:
    """The no-op replica (server process, service, engine), the contract, the family table and the
    model spec never load torch."""
    code = ("import sys, bouquet.server.main, bouquet.server.service, bouquet.engine.runtime.noop, bouquet.engine.runtime.contract, "
            "bouquet.families, bouquet.modelspec; assert 'torch' not in sys.modules, 'torch was imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_every_family_row_is_a_packed_model() -> None:
    from bouquet.engine.models.base import PackedModel
    from bouquet.engine.models.registry import ARCHITECTURES, model_class

    assert set(ARCHITECTURES) == set(FAMILIES)
    for arch in ARCHITECTURES:
        for task in ("embed", "score"):
            cls = model_class(arch, task)
            assert issubclass(cls, PackedModel), cls
            assert isinstance(cls.IGNORED_KEYS, tuple) and isinstance(cls.PREFIXES, tuple)


def test_position_offset_is_one_fact(tmp_path: Path) -> None:
    """XLM-R's offset comes from its family row, for the model's embeddings and the spec's limit."""
    from bouquet.engine.runtime.engine import Engine

    spec = load_spec(str(make_tiny_model("xlmr", tmp_path / "xlmr")))
    offset = family(spec.architecture).position_offset(spec.config)
    assert offset == spec.config["pad_token_id"] + 1
    assert spec.max_seq_length == spec.config["max_position_embeddings"] - offset
    engine = Engine(spec, device="cpu", dtype="float32")
    assert engine.model.embeddings.position_offset == offset
    longest = Batch.pack([np.full(spec.max_seq_length, 5, np.int32)])
    assert np.isfinite(engine.step(longest).wait()).all()  # the last position row exists
    assert family("BertModel").position_offset({"pad_token_id": 0}) == 0


def test_graph_counters_stay_zero_when_eager() -> None:
    """Issue 16 item 8: the counters are the engine's real ones, 0 on the CPU with --enforce-eager."""
    srv = BouquetProcess("--enforce-eager")
    try:
        for _ in range(3):
            assert srv.embed(["graph counters", "stay at zero"]).status_code == 200
        time.sleep(1.3)  # replica numbers arrive with the gateway's next Info poll (about 1 s)
        assert graph_counters(srv.url) == {"captures": 0.0, "replays": 0.0}
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["bert", "qwen3-reranker"])
def test_model_fuses_at_load(kind: str, tmp_path: Path) -> None:
    """One forward path: the engine's model reads fused weights, built by fuse() at load."""
    from bouquet.engine.runtime.engine import Engine

    engine = Engine(load_spec(str(make_tiny_model(kind, tmp_path / kind))), device="cpu", dtype="float32")
    m = engine.model
    if kind == "bert":
        qkv = m.encoder.layer[0].qkv
        w, b = qkv.weight, qkv.bias
        assert w.shape[0] == 3 * w.shape[1] and b.shape == (w.shape[0],)
    else:
        assert m.yes_no.shape[0] == 2 and m.model.layers[0].mlp.gate_up.weight.shape[0] == 2 * m.model.layers[0].mlp.up_proj.weight.shape[0]


def test_label_count_follows_transformers_defaults() -> None:
    """transformers 5 writes no ``id2label`` for its default of 2 labels: such a config.json still
    has 2 outputs (1 and 3 labels are written out)."""
    import json

    import transformers

    from bouquet.families import num_labels

    for n in (1, 2, 3):
        cfg = json.loads(transformers.BertConfig(num_labels=n).to_json_string(use_diff=True))
        assert num_labels(cfg) == n, (n, cfg.get("id2label"))
