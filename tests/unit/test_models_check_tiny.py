"""`bouquet bench models-check` (bouquet/bench/tools/models_check.py, run on an H200 at full size) works end to end at tiny size on the
CPU: same code path, transformers' random init handed to Engine.from_state_dict."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_models_check_tiny_cpu(tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from bouquet.bench.tools import models_check as mod

    out = tmp_path / "check.json"
    code = mod.main([str(out), "--tiny", "--device", "cpu", "--dtype", dtype])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"], report
    assert {r["model"] for r in report["results"]} == {"qwen3-embedding", "qwen3-reranker", "qwen3-seq-cls", "bge-base",
                                                      "xlm-r-base", "distilbert", "roberta-large", "mpnet-base",
                                                      "modernbert-base", "gte-qwen2-1.5b", "e5-mistral-7b",
                                                      "embeddinggemma-300m"}
    for r in report["results"]:
        assert r["spread"] < 0.999, r  # outputs vary with the input, so the comparison means something
