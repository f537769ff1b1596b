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
