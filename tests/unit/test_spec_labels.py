"""``ModelSpec.labels``: the names /predict and /info give a scoring model's outputs, from config.json
as transformers writes it (``id2label`` keyed "0".."n-1"; none for its default of 2 labels)."""
from __future__ import annotations

import json

import pytest

from bouquet.modelspec import spec_from_config


def _bert(arch: str, **extra: object) -> dict:
    import transformers

    cfg = json.loads(transformers.BertConfig(vocab_size=100, **extra).to_json_string(use_diff=True))
    return {**cfg, "architectures": [arch]}


@pytest.mark.parametrize("extra,want", [
    ({"id2label": {0: "contradiction", 1: "entailment", 2: "neutral"}}, ("contradiction", "entailment", "neutral")),
    ({"num_labels": 1}, ("LABEL_0",)),  # transformers writes id2label {"0": "LABEL_0"} for one label
    ({}, ("LABEL_0", "LABEL_1")),  # its default of 2 labels: no id2label in config.json
    ({"num_labels": 3}, ("LABEL_0", "LABEL_1", "LABEL_2")),
])
def test_labels_follow_id2label(extra, want):
    spec = spec_from_config(_bert("BertForSequenceClassification", **extra))
    assert spec.task == "score" and spec.labels == want and len(spec.labels) == spec.dimension


def test_lone_output_without_names_is_score_and_embedders_have_none():
    cfg = _bert("BertForSequenceClassification")
    cfg.pop("id2label", None)
    assert spec_from_config({**cfg, "num_labels": 1}).labels == ("score",)
    assert spec_from_config({**cfg, "id2label": {"0": "a", "2": "c"}, "num_labels": 2}).labels == ("LABEL_0", "LABEL_1")
    assert spec_from_config(_bert("BertModel")).labels == ()


def test_a_causal_lm_says_why_it_is_a_reranker_or_an_embedder():
    """A Qwen3ForCausalLM is a yes/no reranker by config.json's "bouquet" task, "is_reranker", or
    'reranker' in its name, in that order; the spec says which rule decided (the start-up log
    shows it: a trial's renamed Qwen3-Reranker copy was served as an embedder without a word)."""
    import transformers

    cfg = {**json.loads(transformers.Qwen3Config(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                 intermediate_size=64).to_json_string(use_diff=True)),
           "architectures": ["Qwen3ForCausalLM"], "yes_token_id": 1, "no_token_id": 2}
    named = spec_from_config(cfg, model_id="/models/Qwen3-Reranker-0.6B")
    assert named.task == "score" and named.task_reason == "its name or folder contains 'reranker'"
    renamed = spec_from_config(cfg, model_id="/models/q3-local")
    assert renamed.task == "embed" and "a yes/no reranker needs 'reranker' in its name" in renamed.task_reason
    assert spec_from_config(cfg, model_id="/models/q3-local", name_hint="qwen3-reranker").task == "score"
    flagged = spec_from_config({**cfg, "is_reranker": True}, model_id="/models/q3-local")
    assert flagged.task == "score" and flagged.task_reason == "config.json's \"is_reranker\": true"
    told = spec_from_config({**cfg, "bouquet": {"task": "embed"}}, model_id="/models/Qwen3-Reranker-0.6B")
    assert told.task == "embed" and told.task_reason == 'config.json\'s "bouquet": {"task": "embed"}'
    bert = spec_from_config(_bert("BertModel"))
    assert bert.task == "embed" and bert.task_reason == ""


def test_a_causal_embedder_with_nothing_to_append_is_flagged():
    """Last-token pooling with no end-of-text id (the serve log warns): config.json's eos_token_id is
    appended when tokenizer.json has no <|endoftext|>; with neither, the text's own last token is pooled."""
    import transformers

    cfg = {**json.loads(transformers.Qwen3Config(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                 intermediate_size=64, eos_token_id=7).to_json_string(use_diff=False)),
           "architectures": ["Qwen3Model"]}
    spec = spec_from_config(cfg)
    assert spec.append_eos_id == 7 and not spec.pools_own_last_token
    bare = spec_from_config({k: v for k, v in cfg.items() if k != "eos_token_id"})
    assert bare.append_eos_id is None and bare.pools_own_last_token
    assert not spec_from_config(_bert("BertModel")).pools_own_last_token
