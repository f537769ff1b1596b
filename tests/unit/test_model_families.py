"""Every model family against transformers' own implementation holding the same weights.

Tiny random-weight models (tests/fixtures/tiny_models.py), float32 on the CPU. Tolerances:
embeddings cosine ≥ 0.9999 vs transformers and ≥ 0.99999 batched vs one-at-a-time; scores
(cross-encoder sigmoid(logit) per label, Qwen3-Reranker P(yes)) within 1e-4; the decoder
cross-encoders (``*-cross`` of tiny_decoders.py) against transformers' ``*ForSequenceClassification``,
which pools the last non-padding token. The batch mixes lengths 1
and the model's maximum (XLM-R's maximum is where an off-by-one position crashes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.modelspec import ModelSpec, load_spec
from tests.fixtures.tiny_decoders import DECODER_CROSS_KINDS
from tests.fixtures.tiny_models import KINDS, make_tiny_model

EMBED_KINDS = ("bert", "xlmr", "qwen3", "qwen3-bidir", "distilbert", "roberta", "mpnet", "modernbert", "qwen2", "mistral", "gemma3")
SCORE_KINDS = ("bert-cross", "xlmr-cross", "qwen3-reranker", "distilbert-cross", "roberta-cross", "mpnet-cross",
               "modernbert-cross") + DECODER_CROSS_KINDS


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {k: make_tiny_model(k, root / k) for k in KINDS}


def mixed_batch(spec: ModelSpec, seed: int = 0, skewed: bool = False) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Random ids with lengths 1 … max_seq_length; cross-encoders get a two-segment type split.
    ``skewed``: one long sequence among short ones (and repeated lengths, so the CPU attention
    backend forms a group of several sequences)."""
    rng = np.random.default_rng(seed)
    lengths = [1, 7, spec.max_seq_length, 3, 23, spec.max_seq_length - 1, 2]
    if skewed:
        lengths = [1, 2, 1, 3, 1, spec.max_seq_length]
    # ids ≥ 5 avoid the special tokens, so XLM-R's <pad> (1) never appears mid-sequence
    seqs = [rng.integers(5, spec.vocab_size, n).astype(np.int32) for n in lengths]
    if spec.task != "score" or spec.yes_no_ids is not None or spec.config.get("type_vocab_size", 1) < 2:
        return seqs, None
    return seqs, [(np.arange(n) >= n // 2).astype(np.int32) for n in lengths]


def reference(kind: str, path: Path, spec: ModelSpec, seqs: list[np.ndarray], types: list[np.ndarray] | None) -> np.ndarray:
    """transformers, one sequence at a time (no padding, no masks): pooled rows or scores."""
    import transformers as tf

    cls = {"bert": tf.BertModel, "bert-cross": tf.BertForSequenceClassification, "xlmr": tf.XLMRobertaModel,
           "xlmr-cross": tf.XLMRobertaForSequenceClassification, "qwen3": tf.Qwen3Model,
           "qwen3-bidir": tf.Qwen3Model, "qwen3-reranker": tf.Qwen3ForCausalLM, "distilbert": tf.DistilBertModel,
           "distilbert-cross": tf.DistilBertForSequenceClassification, "roberta": tf.RobertaModel,
           "roberta-cross": tf.RobertaForSequenceClassification, "mpnet": tf.MPNetModel,
           "mpnet-cross": tf.MPNetForSequenceClassification, "modernbert": tf.ModernBertModel,
           "modernbert-cross": tf.ModernBertForSequenceClassification, "qwen2": tf.Qwen2Model,
           "mistral": tf.MistralModel, "gemma3": tf.Gemma3TextModel,
           "qwen3-cross": tf.Qwen3ForSequenceClassification, "qwen2-cross": tf.Qwen2ForSequenceClassification,
           "mistral-cross": tf.MistralForSequenceClassification,
           "gemma3-cross": tf.Gemma3TextForSequenceClassification}[kind]
    impl = "eager" if kind.startswith("mpnet") else "sdpa"  # MPNet has only its eager attention in transformers
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation=impl).eval()
    kwargs: dict[str, object] = {}
    if kind == "qwen3-bidir":
        for layer in model.layers:
            layer.self_attn.is_causal = False
        kwargs["attention_mask"] = {"full_attention": None}  # a prebuilt (absent) mask: no causal mask is made
    out = []
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ids = torch.from_numpy(s).long()[None]
            if types is not None:
                kwargs["token_type_ids"] = torch.from_numpy(types[i]).long()[None]
            o = model(input_ids=ids, **kwargs)
            if kind in SCORE_KINDS and kind != "qwen3-reranker":
                out.append(torch.sigmoid(o.logits[0]).numpy())
            elif kind == "qwen3-reranker":
                yes, no = spec.yes_no_ids
                last = o.logits[0, -1]
                out.append(torch.log_softmax(torch.stack([last[no], last[yes]]), 0)[1:].exp().numpy())
            else:
                h = o.last_hidden_state[0]
                out.append((h.mean(0) if spec.pooling == "mean" else h[0] if spec.pooling == "cls" else h[-1]).numpy())
    return np.stack(out)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def engine_rows(engine: Engine, seqs: list[np.ndarray], types: list[np.ndarray] | None) -> np.ndarray:
    rows = engine.step(Batch.pack(seqs, types)).wait()
    if engine.spec.task == "score":
        rows = 1.0 / (1.0 + np.exp(-rows))  # what the API layer reports
    return rows


@pytest.mark.parametrize("kind", KINDS)
def test_matches_transformers(kind: str, tiny_dirs: dict[str, Path]) -> None:
    spec = load_spec(str(tiny_dirs[kind]))
    engine = Engine(spec, device="cpu", dtype="float32")
    seqs, types = mixed_batch(spec)
    ref = reference(kind, tiny_dirs[kind], spec, seqs, types)
    got = engine_rows(engine, seqs, types)
    assert got.shape == ref.shape
    if kind in SCORE_KINDS:
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
        assert ref.max() - ref.min() > 0.05, "scores barely differ: the comparison would prove nothing"
    else:
        assert cosine(got, ref).min() >= 0.9999, cosine(got, ref)
        # different inputs must give clearly different vectors, or any bug would pass
        off = cosine(ref[:-1], ref[1:])
        assert off.max() < 0.99, off


@pytest.mark.parametrize("skewed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_batched_equals_single(kind: str, skewed: bool, tiny_dirs: dict[str, Path]) -> None:
    spec = load_spec(str(tiny_dirs[kind]))
    engine = Engine(spec, device="cpu", dtype="float32")
    seqs, types = mixed_batch(spec, seed=1, skewed=skewed)
    meta = engine.attn.prepare(torch.from_numpy(Batch.pack(seqs).cu_seqlens), max(len(s) for s in seqs), False)
    # CPU attention groups sequences by exact length: every sequence in exactly one group, and
    # the skewed batch has a group of several (three of length 1)
    assert meta.groups is not None and sum(g.count for g in meta.groups) == len(seqs)
    assert max(g.count for g in meta.groups) == (3 if skewed else 1)
    batched = engine.step(Batch.pack(seqs, types)).wait()
    single = np.concatenate([engine.step(Batch.pack([s], None if types is None else [types[i]])).wait()
                             for i, s in enumerate(seqs)])
    if kind in SCORE_KINDS:
        np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)
    else:
        assert cosine(batched, single).min() >= 0.99999


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["bert", "xlmr-cross", "qwen3", "qwen3-reranker", "mpnet", "modernbert-cross", "gemma3",
                                  "qwen2-cross"])
def test_low_precision_close_to_float32(kind: str, dtype: str, tiny_dirs: dict[str, Path]) -> None:
    """fp16/bf16 engines agree with the float32 engine: cosine ≥ 0.99, scores within 0.02."""
    spec = load_spec(str(tiny_dirs[kind]))
    seqs, types = mixed_batch(spec, seed=2)
    full = engine_rows(Engine(spec, device="cpu", dtype="float32"), seqs, types)
    low = engine_rows(Engine(spec, device="cpu", dtype=dtype), seqs, types)
    assert np.isfinite(low).all()
    if kind in SCORE_KINDS:
        np.testing.assert_allclose(low, full, atol=0.02, rtol=0)
    else:
        assert cosine(low, full).min() >= 0.99


@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                                     {"type": "linear", "factor": 2.0}])
def test_a_scaled_rope_beside_rope_parameters_is_refused(scaling: dict[str, object], tmp_path: Path) -> None:
    """A transformers-5 config.json (``rope_parameters`` of the default type) plus the
    ``rope_scaling`` edit model cards give for long inputs: transformers applies it; the engine
    implements only the default rope, so it refuses (it served vectors at cosine 0.96 instead)."""
    import json
    import shutil

    from bouquet.engine.kernels.layers import rope_theta

    assert rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": None}) == 1e6
    with pytest.raises(ValueError, match="rope_type .* is not supported"):
        rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": scaling})
    src = make_tiny_model("qwen3", tmp_path / "src")
    shutil.copytree(src, tmp_path / "scaled")
    cfg = json.loads((tmp_path / "scaled" / "config.json").read_text())
    assert cfg.get("rope_parameters", {}).get("rope_type") == "default"  # as transformers 5 writes it
    (tmp_path / "scaled" / "config.json").write_text(json.dumps({**cfg, "rope_scaling": scaling}))
    with pytest.raises(ValueError, match="rope_type .* is not supported"):
        Engine(load_spec(str(tmp_path / "scaled")), "cpu", "float32")
