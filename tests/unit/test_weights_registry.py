"""Weight loading by Hugging Face names and the architecture registry: every mismatch between a
checkpoint and an architecture is a start-up error that names the offending entries, and unused
entries are skipped only when the architecture lists them (IGNORED_KEYS)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bouquet.engine.runtime.engine import Engine
from bouquet.engine.models.registry import ARCHITECTURES, UnsupportedArchitecture, model_class
from bouquet.engine.models.weights import WeightError, load_safetensors
from bouquet.modelspec import load_spec
from tests.fixtures.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("w")
    return {k: make_tiny_model(k, root / k) for k in ("bert", "qwen3-reranker")}


def test_loaded_names_skip_ignored_entries(dirs: dict[str, Path]) -> None:
    spec = load_spec(str(dirs["bert"]))
    state = load_safetensors(spec.path)
    assert any(k.startswith("pooler.") for k in state)  # the checkpoint has a pooler …
    engine = Engine(spec, device="cpu", dtype="float32")
    assert not any(k.startswith("pooler.") for k in engine.loaded)  # … the embedding model skips it
    assert engine.loaded == set(state) - {k for k in state if k.startswith("pooler.")}


def test_missing_parameter_is_named(dirs: dict[str, Path]) -> None:
    spec = load_spec(str(dirs["bert"]))
    state = load_safetensors(spec.path)
    del state["encoder.layer.1.output.dense.weight"]
    with pytest.raises(WeightError, match=r"missing \['encoder\.layer\.1\.output\.dense\.weight'\]"):
        Engine.from_state_dict(spec, state, device="cpu", dtype="float32")


def test_unexpected_parameter_is_named(dirs: dict[str, Path]) -> None:
    spec = load_spec(str(dirs["bert"]))
    state = load_safetensors(spec.path)
    state["encoder.layer.2.output.dense.weight"] = torch.zeros(64, 128)
    with pytest.raises(WeightError, match=r"unexpected \['encoder\.layer\.2\.output\.dense\.weight'\]"):
        Engine.from_state_dict(spec, state, device="cpu", dtype="float32")


def test_prefixed_checkpoint_loads(dirs: dict[str, Path]) -> None:
    """A Qwen3ForCausalLM checkpoint (``model.`` prefix, tied head) serves as an embedder too."""
    spec = load_spec(str(dirs["qwen3-reranker"]))
    state = load_safetensors(spec.path)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # some exports store the tied head
    reranker = Engine.from_state_dict(spec, state, device="cpu", dtype="float32")
    assert "lm_head.weight" not in reranker.loaded
    cfg = dict(spec.config, bouquet={"task": "embed"})
    from bouquet.modelspec import spec_from_config

    embed_spec = spec_from_config(cfg, spec.path, "qwen3-as-embedder")
    assert embed_spec.task == "embed" and embed_spec.pooling == "last"
    embedder = Engine.from_state_dict(embed_spec, state, device="cpu", dtype="float32")
    assert type(embedder.model).__name__ == "Qwen3Model"
    assert "layers.0.self_attn.q_norm.weight" in embedder.loaded  # names after the prefix is stripped


def test_unsupported_architecture_lists_supported() -> None:
    with pytest.raises(UnsupportedArchitecture) as e:
        model_class("GPT2Model")
    for name in ARCHITECTURES:
        assert name in str(e.value)


def test_reranker_detection(dirs: dict[str, Path]) -> None:
    spec = load_spec(str(dirs["qwen3-reranker"]))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(spec.tokenizer_path))
    assert spec.task == "score" and spec.dimension == 1 and spec.pooling == "last"
    assert spec.yes_no_ids == (tok.token_to_id("yes"), tok.token_to_id("no"))
    assert spec.pair_template is not None and "{query}" in spec.pair_template and "{document}" in spec.pair_template


@pytest.mark.parametrize("extra,causal", [
    ({}, True), ({"is_bidirectional": True}, False), ({"is_causal": False}, False),
    ({"is_bidirectional": True, "bouquet": {"causal": True}}, True),
])
def test_causal_conventions(extra: dict, causal: bool) -> None:
    from bouquet.modelspec import is_causal, spec_from_config

    cfg = {"architectures": ["Qwen3Model"], "hidden_size": 64, "vocab_size": 100, **extra}
    assert is_causal(cfg) is causal
    assert spec_from_config(cfg).pooling == ("last" if causal else "mean")
    assert not is_causal({"architectures": ["BertModel"]})
