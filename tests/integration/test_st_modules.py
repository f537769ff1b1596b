"""Every sentence-transformers module a model can declare in modules.json (issue 15 item 2).

Tiny BERT directories are written by sentence-transformers itself (``SentenceTransformer.save``:
its own modules.json, ``1_Pooling``, ``2_Dense`` safetensors, ``3_Normalize``), then loaded by
sentence-transformers and by bouquet (the engine in process, and one served end to end by
``bouquet serve`` over /v1/embeddings): the vectors must agree (cosine ≥ 0.9999, float32) with the
Dense layer's output size. A module bouquet does not run must stop the start naming it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.heads.pooling import finalize
from bouquet.modelspec import ModelError, load_spec
from bouquet.tokenization import TextTokenizer
from helpers import BouquetProcess, cosine_rows
from tests.fixtures.st_models import write_st_model
from tests.fixtures.tiny_models import make_tiny_model

# Mixed lengths: one word (3 tokens with [CLS]/[SEP]) up to the tiny model's 64-token limit.
TEXTS = ["x", "hello world", "a somewhat longer sentence about search and ranking",
         " ".join(["river mountain city music paper"] * 12)]
MODES = ["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens", ("mean", "max")]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("bert", tmp_path_factory.mktemp("st") / "bert")


def st_vectors(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu").encode(texts, convert_to_numpy=True, batch_size=len(texts))


def bouquet_vectors(model_dir: Path, texts: list[str], prompt: str = "") -> np.ndarray:
    """The engine's vectors for ``prompt + text`` (the prompt's tokens left out of pooling when the
    model says include_prompt=false, as the gateway asks), checked batched == one at a time."""
    spec = load_spec(str(model_dir))
    tok = TextTokenizer(spec)
    ids = tok.encode([prompt + t for t in texts]).ids
    engine = Engine(spec, "cpu", "float32")
    with torch.inference_mode():
        skip = tok.prompt_skip(prompt)
        rows = engine.step(Batch.pack(ids, pool_skip=[skip] * len(ids))).wait()
        single = np.concatenate([engine.step(Batch.pack([s], pool_skip=[skip])).wait() for s in ids])
    assert cosine_rows(rows, single).min() >= 0.99999  # batched == one at a time
    return finalize(rows, spec.normalize, None)


TANH = {"in_features": 64, "out_features": 32, "activation_function": torch.nn.Tanh()}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "+".join(m) if isinstance(m, tuple) else m)
def test_pooling_dense_normalize_match_sentence_transformers(tiny_bert, tmp_path, mode):
    in_dim = 64 * (len(mode) if isinstance(mode, tuple) else 1)
    d = write_st_model(tiny_bert, tmp_path / "m", mode, [{**TANH, "in_features": in_dim}])
    ref, got = st_vectors(d, TEXTS), bouquet_vectors(d, TEXTS)
    assert ref.shape == got.shape == (len(TEXTS), 32)
    assert load_spec(str(d)).dimension == 32
    assert cosine_rows(got, ref).min() >= 0.9999
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5
    assert cosine_rows(got[:-1], got[1:]).max() < 0.999  # different texts, different vectors


def test_legacy_pooling_keys(tiny_bert, tmp_path):
    """Older saves spell the mode as booleans (``pooling_mode_weightedmean_tokens: true``)."""
    d = write_st_model(tiny_bert, tmp_path / "m", "weightedmean", [TANH])
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
         "pooling_mode_weightedmean_tokens": True, "include_prompt": True}))
    assert load_spec(str(d)).pooling == "weightedmean"
    assert cosine_rows(bouquet_vectors(d, TEXTS), st_vectors(d, TEXTS)).min() >= 0.9999


def test_dense_chain_without_bias_identity_and_inner_normalize(tiny_bert, tmp_path):
    """Dense(64 → 48, no bias, identity), Normalize, Dense(48 → 16, relu); no final Normalize:
    the vectors keep their length, and the inner Normalize runs in the engine."""
    layers = [{"in_features": 64, "out_features": 48, "bias": False, "activation_function": torch.nn.Identity()},
              "normalize", {"in_features": 48, "out_features": 16, "activation_function": torch.nn.ReLU()}]
    d = write_st_model(tiny_bert, tmp_path / "m", "mean", layers, normalize=False)
    spec = load_spec(str(d))
    assert (spec.dimension, spec.normalize, len(spec.head_steps)) == (16, False, 3)
    ref, got = st_vectors(d, TEXTS), bouquet_vectors(d, TEXTS)
    assert got.shape == (len(TEXTS), 16)
    assert cosine_rows(got, ref).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)


@pytest.mark.parametrize("out_features", [64, 24])
def test_dense_with_residual(tiny_bert, tmp_path, out_features):
    """``use_residual``: the input is added back, through ``residual`` (no bias) when the sizes differ."""
    layer = {"in_features": 64, "out_features": out_features, "activation_function": torch.nn.GELU(),
             "use_residual": True}
    d = write_st_model(tiny_bert, tmp_path / "m", "mean", [layer])
    if out_features != 64:
        from safetensors.torch import load_file, save_file

        state = load_file(str(d / "2_Dense" / "model.safetensors"))  # widen the residual like the linear
        save_file({**state, "residual.weight": torch.randn(out_features, 64) * 0.3}, str(d / "2_Dense" / "model.safetensors"))
    ref, got = st_vectors(d, TEXTS), bouquet_vectors(d, TEXTS)
    assert got.shape == (len(TEXTS), out_features)
    assert cosine_rows(got, ref).min() >= 0.9999


def test_served_over_http_equals_sentence_transformers(tiny_bert, tmp_path):
    d = write_st_model(tiny_bert, tmp_path / "m", "cls", [TANH], prompts={"query": "search query: "})
    ref = st_vectors(d, TEXTS)
    from sentence_transformers import SentenceTransformer

    ref_query = SentenceTransformer(str(d), device="cpu").encode(TEXTS, prompt_name="query", batch_size=len(TEXTS))
    srv = BouquetProcess("--model", str(d), "--log-level", "warning")
    try:
        got = srv.vectors(TEXTS)
        assert got.shape == (len(TEXTS), 32)
        assert cosine_rows(got, ref).min() >= 0.9999
        r = srv.embed(TEXTS[:1], dimensions=8)  # Matryoshka truncation acts on the Dense output
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 8
        # the prompt of config_sentence_transformers.json, as sentence-transformers applies it
        assert cosine_rows(srv.vectors(TEXTS, prompt_name="query"), ref_query).min() >= 0.9999
        assert cosine_rows(ref_query, ref).max() < 0.999  # the prompt does change the vectors
    finally:
        srv.stop()


@pytest.mark.parametrize(("mode", "transport"), [("mean", "auto"), ("max", "grpc")])
def test_include_prompt_false_served_over_http(tiny_bert, tmp_path, mode, transport):
    """``bouquet serve`` of a Pooling(include_prompt=False) model: with ``prompt_name`` the gateway
    counts the prompt's tokens and the replica leaves them out of pooling, as sentence-transformers'
    ``encode(..., prompt_name=...)``; without a prompt every token is pooled. Chunk modes, where only
    the first window would carry the prompt, are refused with a 400 naming ``long_input``. The count
    travels in the Unix-socket call and in the gRPC ``EmbedRequest`` alike."""
    from sentence_transformers import SentenceTransformer

    d = write_st_model(tiny_bert, tmp_path / "m", mode, [TANH], prompts={"query": PROMPT}, include_prompt=False)
    st = SentenceTransformer(str(d), device="cpu")
    ref_query = st.encode(TEXTS, prompt_name="query", batch_size=len(TEXTS))
    ref_plain = st.encode(TEXTS, batch_size=len(TEXTS))
    srv = BouquetProcess("--model", str(d), "--log-level", "warning", "--transport", transport)
    try:
        assert cosine_rows(srv.vectors(TEXTS, prompt_name="query"), ref_query).min() >= 0.9999
        assert cosine_rows(srv.vectors(TEXTS[:1], prompt_name="query"), ref_query[:1]).min() >= 0.9999  # coalesced
        assert cosine_rows(srv.vectors(TEXTS), ref_plain).min() >= 0.9999
        r = srv.embed(TEXTS[:1], prompt_name="query", long_input="chunk_mean")
        assert r.status_code == 400 and r.json()["error"]["param"] == "long_input", r.text
        assert srv.embed(TEXTS[:1], long_input="chunk_mean").status_code == 200  # no prompt: nothing to leave out
    finally:
        srv.stop()


def _with_module(d: Path, entry: dict) -> None:
    mods = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([*mods, {"idx": len(mods), "name": str(len(mods)), **entry}]))


def test_unsupported_module_refuses_to_start(tiny_bert, tmp_path):
    d = write_st_model(tiny_bert, tmp_path / "m", "mean", [TANH])
    _with_module(d, {"path": "4_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    with pytest.raises(ModelError, match="sentence_transformers.models.LayerNorm"):
        load_spec(str(d))
    with pytest.raises(RuntimeError, match="sentence_transformers.models.LayerNorm"):
        BouquetProcess("--model", str(d), "--log-level", "warning", startup_timeout=120).stop()


@pytest.mark.parametrize("name", ["config.json", "modules.json", "tokenizer.json"])
def test_broken_json_file_is_named(tiny_bert, tmp_path, name):
    d = write_st_model(tiny_bert, tmp_path / "m", "mean")
    (d / name).write_text("{bad")
    if name == "tokenizer.json":  # read by tokenizers when the gateway starts
        with pytest.raises(ModelError, match=r"tokenizer.json cannot be read by tokenizers: key must be a string"):
            TextTokenizer(load_spec(str(d)))
        return
    with pytest.raises(ModelError, match=rf"{name} is not valid JSON: Expecting property name"):
        load_spec(str(d))


def test_include_prompt_false_with_last_token_pooling(tiny_bert, tmp_path):
    """Last-token pooling never reads a prompt token, so include_prompt=false changes nothing and
    is served; with a prompt, the vectors still equal sentence-transformers'."""
    from sentence_transformers import SentenceTransformer

    d = write_st_model(tiny_bert, tmp_path / "m", "lasttoken", [TANH])
    pool_cfg = d / "1_Pooling" / "config.json"
    pool_cfg.write_text(json.dumps({**json.loads(pool_cfg.read_text()), "include_prompt": False}))
    prompt = "query: "
    ref = SentenceTransformer(str(d), device="cpu").encode(TEXTS, prompt=prompt, batch_size=len(TEXTS))
    assert cosine_rows(bouquet_vectors(d, [prompt + t for t in TEXTS]), ref).min() >= 0.9999


# A prompt long enough to matter, and one that ends in a word piece the text may join on.
PROMPT = "Represent the scientific sentence for retrieval: "


@pytest.mark.parametrize("mode", ["mean", "max", "cls", "weightedmean", "mean_sqrt_len_tokens", ("mean", "max")],
                         ids=lambda m: "+".join(m) if isinstance(m, tuple) else m)
def test_include_prompt_false_leaves_the_prompt_out(tiny_bert, tmp_path, mode):
    """INSTRUCTOR-style Pooling(include_prompt=False): the prompt's tokens ([CLS] included, as
    sentence-transformers counts them) are left out of pooling; CLS then reads the first text token,
    weightedmean keeps each token's position in the whole sequence."""
    from sentence_transformers import SentenceTransformer

    in_dim = 64 * (len(mode) if isinstance(mode, tuple) else 1)
    d = write_st_model(tiny_bert, tmp_path / "m", mode, [{**TANH, "in_features": in_dim}], include_prompt=False)
    ref = SentenceTransformer(str(d), device="cpu").encode(TEXTS, prompt=PROMPT, batch_size=len(TEXTS))
    got = bouquet_vectors(d, TEXTS, PROMPT)
    assert cosine_rows(got, ref).min() >= 0.9999
    assert cosine_rows(bouquet_vectors(d, TEXTS), st_vectors(d, TEXTS)).min() >= 0.9999  # no prompt: all pooled


@pytest.mark.parametrize("case", ["custom", "activation", "pickle"])
def test_unsupported_settings_are_named(tiny_bert, tmp_path, case):
    d = write_st_model(tiny_bert, tmp_path / "m", "mean", [TANH])
    dense_cfg = d / "2_Dense" / "config.json"
    if case == "custom":
        _with_module(d, {"path": "4_Mine", "type": "my_package.modules.Rescale"})
        match = "my_package.modules.Rescale"
    elif case == "activation":
        dense_cfg.write_text(json.dumps({**json.loads(dense_cfg.read_text()),
                                         "activation_function": "my_package.Swish"}))
        match = "my_package.Swish"
    elif case == "pickle":
        state = {"linear.weight": torch.zeros(32, 64), "linear.bias": torch.zeros(32)}
        torch.save(state, d / "2_Dense" / "pytorch_model.bin")
        (d / "2_Dense" / "model.safetensors").unlink()
        match = "pytorch_model.bin is a pickle"
    with pytest.raises(ModelError, match=match):
        load_spec(str(d))
    shutil.rmtree(d)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["cls", "max", "weightedmean", ("mean", "max")],
                         ids=lambda m: "+".join(m) if isinstance(m, tuple) else m)
def test_cuda_graphs_run_pooling_and_dense(tiny_bert, tmp_path, mode):
    """On the GPU the pooling modes and the Dense layers run inside the captured CUDA graph
    (bf16, varlen attention): eager, capture and replay all agree with the CPU in float32."""
    in_dim = 64 * (len(mode) if isinstance(mode, tuple) else 1)
    d = write_st_model(tiny_bert, tmp_path / "m", mode, [{**TANH, "in_features": in_dim}])
    spec = load_spec(str(d))
    ids = TextTokenizer(spec).encode(TEXTS).ids
    ref = Engine(spec, "cpu", "float32").step(Batch.pack(ids)).wait()
    engine = Engine(spec, "cuda", "bfloat16")
    outs = [engine.step(Batch.pack(ids)).wait().copy() for _ in range(3)]  # eager, capture, replay
    assert engine.graph_replays >= 1
    for out in outs:
        assert cosine_rows(out, ref).min() >= 0.999


def _edit_json(path: Path, **changes: object) -> None:
    """Set (value not None) or drop (None) top-level keys of a JSON file."""
    conf = json.loads(path.read_text()) if path.exists() else {}
    conf.update({k: v for k, v in changes.items() if v is not None})
    for k in [k for k, v in changes.items() if v is None]:
        conf.pop(k, None)
    path.write_text(json.dumps(conf))


# (sentence_bert_config.json changes, tokenizer_config.json changes, the limit wanted, where the
# start-up log says it came from); the tiny model has 64 positions
LIMITS = {
    "tokenizer_below_positions": ({"max_seq_length": None}, {"model_max_length": 16}, 16,
                                  "tokenizer_config.json model_max_length"),
    "st_config_over_tokenizer": ({"max_seq_length": 32}, {"model_max_length": 16}, 32,
                                 "sentence_bert_config.json max_seq_length"),
    "no_limit_placeholder": ({"max_seq_length": None}, {"model_max_length": 10**30}, 64,
                             "the position table: max_position_embeddings"),
    "legacy_max_len": ({"max_seq_length": None}, {"model_max_length": None, "max_len": 20}, 20,
                       "tokenizer_config.json model_max_length"),
    "tokenizer_args_over_st_config": ({"max_seq_length": 48, "tokenizer_args": {"model_max_length": 24}}, {}, 24,
                                      "sentence_bert_config.json tokenizer_args model_max_length"),
}


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_max_seq_length_follows_sentence_transformers(tiny_bert, tmp_path, case):
    """bouquet truncates where sentence-transformers does: its Transformer config's max_seq_length
    (or a model_max_length among its tokenizer arguments), else the tokenizer's model_max_length where
    it is below the position table (sentence-transformers 6.3 saves its max_seq_length there alone),
    else the positions; transformers' "no limit" placeholder (1e30) is none. The long text is cut
    at the same token."""
    from sentence_transformers import SentenceTransformer

    st_changes, tok_changes, want, source = LIMITS[case]
    d = write_st_model(tiny_bert, tmp_path / "m", "mean")
    _edit_json(d / "sentence_bert_config.json", **st_changes)
    _edit_json(d / "tokenizer_config.json", **tok_changes)
    assert SentenceTransformer(str(d), device="cpu").max_seq_length == want
    spec = load_spec(str(d))
    assert spec.max_seq_length == want and spec.max_length_source == source
    assert cosine_rows(bouquet_vectors(d, TEXTS), st_vectors(d, TEXTS)).min() >= 0.9999


def test_older_st_config_names_and_folders_without_modules(tiny_bert, tmp_path):
    """sentence-transformers reads its Transformer config under older names too
    (sentence_distilbert_config.json, ...), and reads none without a modules.json."""
    from sentence_transformers import SentenceTransformer

    d = write_st_model(tiny_bert, tmp_path / "m", "mean")
    _edit_json(d / "tokenizer_config.json", model_max_length=None)
    _edit_json(d / "sentence_bert_config.json", max_seq_length=20)
    (d / "sentence_bert_config.json").rename(d / "sentence_distilbert_config.json")
    assert SentenceTransformer(str(d), device="cpu").max_seq_length == 20 == load_spec(str(d)).max_seq_length
    (d / "modules.json").unlink()
    assert SentenceTransformer(str(d), device="cpu").max_seq_length == 64 == load_spec(str(d)).max_seq_length


@pytest.mark.parametrize("value", [-5, 0, "abc", True, 1.5])
def test_a_bad_max_seq_length_is_named(tiny_bert, tmp_path, value):
    d = write_st_model(tiny_bert, tmp_path / "m", "mean")
    _edit_json(d / "sentence_bert_config.json", max_seq_length=value)
    with pytest.raises(ModelError, match=r"sentence_bert_config\.json: max_seq_length must be a positive integer"):
        load_spec(str(d))
    shutil.copytree(tiny_bert, tmp_path / "own")
    _edit_json(tmp_path / "own" / "config.json", bouquet={"max_seq_length": 200})
    with pytest.raises(ModelError, match=r"bouquet\.max_seq_length must be a whole number of tokens from 1 to 64"):
        load_spec(str(tmp_path / "own"))
