"""SPLADE sparse outputs (issue 15 item 3): a tiny ``BertForMaskedLM`` with random weights, saved
by transformers, served by bouquet; every nonzero term of its vocabulary-sized row equals the
reference formula max_t log(1 + relu(logits[t])) over transformers' MaskedLM logits (same
weights; relative error ≤ 1e-4), and the zero terms are zero. The same directory saved by
sentence-transformers' ``SparseEncoder`` (MLMTransformer + SpladePooling) gives its vectors.
/embed_sparse and the /v1/embeddings extension are checked end to end over HTTP.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from tests.fixtures.tiny_models import make_tiny_model

TEXTS = ["x", "hello world", "a somewhat longer sentence about search and ranking",
         " ".join(["river mountain city music paper"] * 12)]


def _mlm_dir(root: Path, kind: str) -> Path:
    """A tiny ``BertForMaskedLM`` or ``DistilBertForMaskedLM`` directory (the tiny BERT's tokenizer)."""
    import transformers as tf

    base = root / "base"
    if not base.exists():
        make_tiny_model("bert", base)
    bert = tf.BertConfig.from_pretrained(str(base))
    torch.manual_seed(5)
    out = root / kind
    if kind == "bert":
        model = tf.BertForMaskedLM(bert)
    else:
        model = tf.DistilBertForMaskedLM(tf.DistilBertConfig(
            vocab_size=bert.vocab_size, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64,
            initializer_range=0.2, pad_token_id=0))
    model.eval().save_pretrained(str(out))
    shutil.copy(base / "tokenizer.json", out / "tokenizer.json")
    return out


@pytest.fixture(scope="module")
def splade_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("splade")


@pytest.fixture(scope="module")
def splade_dir(splade_root: Path) -> Path:
    return _mlm_dir(splade_root, "bert")


def reference_rows(model_dir: Path, ids: list[np.ndarray]) -> np.ndarray:
    """max over each text's tokens of log(1 + relu(MaskedLM logits)), padded batch + mask."""
    import transformers as tf

    model = tf.AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    n = max(len(s) for s in ids)
    x = torch.zeros(len(ids), n, dtype=torch.long)
    mask = torch.zeros(len(ids), n, dtype=torch.long)
    for i, s in enumerate(ids):
        x[i, :len(s)] = torch.from_numpy(s.astype(np.int64))
        mask[i, :len(s)] = 1
    with torch.inference_mode():
        logits = model(input_ids=x, attention_mask=mask).logits  # [B, n, V]
    return (torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)).amax(dim=1).numpy()


def bouquet_rows(model_dir: Path, texts: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
    spec = load_spec(str(model_dir))
    ids = TextTokenizer(spec).encode(texts).ids
    with torch.inference_mode():
        rows = Engine(spec, "cpu", "float32").step(Batch.pack(ids)).wait()
    return rows, ids


def check_terms(got: np.ndarray, ref: np.ndarray) -> None:
    """Every nonzero term within 1e-4 relative error; terms within float32's rounding of the
    logits (2e-6 absolute: a logit of 0.001 differs in its last bits between two summation
    orders) are held to that instead, and terms the reference leaves at zero stay below it. The
    relative bar alone holds from 0.05 up: the two sums' orders (packed rows here, padded ones in
    transformers, and the thread count other tests leave behind) move a logit by up to ~3e-6, which
    is 1.4e-4 of a 0.02 term (CI, DistilBERT) but 6e-5 of a 0.05 one."""
    nz = ref > 0
    assert nz.sum(axis=1).min() > 0
    assert np.abs(got[~nz]).max(initial=0) <= 2e-6, "a term the reference leaves at zero is nonzero"
    err = np.abs(got[nz] - ref[nz])
    assert (err <= 1e-4 * ref[nz] + 2e-6).all(), (err / ref[nz]).max()
    big = ref[nz] >= 0.05  # away from the rounding floor: relative error alone
    assert (err[big] / ref[nz][big]).max() <= 1e-4


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_splade_rows_equal_formula_on_transformers_logits(splade_root, kind):
    splade_dir = _mlm_dir(splade_root, kind)
    spec = load_spec(str(splade_dir))
    assert spec.sparse and spec.dimension == spec.vocab_size and not spec.normalize
    got, ids = bouquet_rows(splade_dir, TEXTS)
    assert got.shape == (len(TEXTS), spec.vocab_size)
    check_terms(got, reference_rows(splade_dir, ids))


def test_splade_sentence_transformers_sparse_encoder(splade_dir, tmp_path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    out = tmp_path / "st"
    SparseEncoder(modules=[MLMTransformer(str(splade_dir), max_seq_length=64), SpladePooling("max")],
                  device="cpu").save(str(out))
    assert load_spec(str(out)).pooling == "splade"
    ref = SparseEncoder(str(out), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    got, _ = bouquet_rows(out, TEXTS)
    check_terms(got, ref)


def test_embed_sparse_and_openai_extension_over_http(splade_dir):
    import httpx

    from helpers import BouquetProcess

    got, ids = bouquet_rows(splade_dir, TEXTS)
    srv = BouquetProcess("--model", str(splade_dir), "--log-level", "warning")
    try:
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        for row, terms in zip(got, r.json()):
            idx = [t["index"] for t in terms]
            assert idx == sorted(idx) and idx == np.flatnonzero(row > 0).tolist()
            np.testing.assert_allclose([t["value"] for t in terms], row[idx], rtol=1e-6)
        # top_k: the k largest, still in index order; threshold: only the terms above it
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": TEXTS[2], "top_k": 5, "threshold": 0.1}, timeout=60)
        terms = r.json()[0]
        row = got[2]
        want = np.sort(np.argsort(-row, kind="stable")[:5])
        assert [t["index"] for t in terms] == want.tolist() and min(t["value"] for t in terms) > 0.1
        # null is unset for both options (threshold null was a 400 while top_k null was taken)
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": TEXTS[0], "top_k": None, "threshold": None}, timeout=60)
        assert r.status_code == 200 and [t["index"] for t in r.json()[0]] == np.flatnonzero(got[0] > 0).tolist(), r.text
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[:2], "threshold": 0.5}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        for i, item in enumerate(body["data"]):
            assert item["object"] == "sparse_embedding" and item["index"] == i
            emb = item["embedding"]
            assert emb["indices"] == np.flatnonzero(got[i] > 0.5).tolist()
            np.testing.assert_allclose(emb["values"], got[i][emb["indices"]], rtol=1e-6)
        assert body["usage"]["prompt_tokens"] == sum(len(s) for s in ids[:2])
        for path, extra in (("/embed", {}), ("/embed_sparse", {"top_k": 0}), ("/embed_sparse", {"dimensions": 4})):
            r = httpx.post(srv.url + path, json={"inputs": "x", **extra}, timeout=60)
            assert r.status_code == (424 if path == "/embed" else 400), r.text
            assert r.json()["error"]
    finally:
        srv.stop()


def test_embed_sparse_without_model_goes_to_the_sparse_model(splade_dir):
    # With a dense model first and a SPLADE model second, /embed_sparse without `model` picks the
    # model that has sparse output (it went to the first embedding model and got 424), /embed the first.
    import httpx

    from bouquet.modelspec import resolve_model_path
    from helpers import BouquetProcess

    got, _ = bouquet_rows(splade_dir, TEXTS[:2])
    srv = BouquetProcess("--model", str(resolve_model_path(None)), "--model", str(splade_dir),
                         "--served-model-name", "minilm", "--served-model-name", "splade", "--log-level", "warning")
    try:
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": TEXTS[:2]}, timeout=60)
        assert r.status_code == 200, r.text
        for row, terms in zip(got, r.json()):
            assert [t["index"] for t in terms] == np.flatnonzero(row > 0).tolist()
        dense = httpx.post(srv.url + "/embed", json={"inputs": TEXTS[0]}, timeout=60)
        assert dense.status_code == 200 and len(dense.json()[0]) == 384, dense.text[:300]
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": "x", "model": "minilm"}, timeout=60)
        assert r.status_code == 424, r.text  # named explicitly: that model, which has no sparse output
    finally:
        srv.stop()


def test_dense_routes_without_model_skip_a_splade_model_listed_first(splade_dir):
    """SPLADE first, a dense model second (a trial): TEI's /embed, /embed_all, /similarity and
    /v1/embeddings without `model` go to the dense model (they went to SPLADE: 424 on /embed while
    a dense model was served); SPLADE named on a dense route is a 400 naming the dense model;
    /embed_sparse still goes to SPLADE, and /v1/embeddings naming it still answers sparse."""
    import httpx

    from bouquet.modelspec import resolve_model_path
    from helpers import BouquetProcess

    srv = BouquetProcess("--model", str(splade_dir), "--model", str(resolve_model_path(None)),
                         "--served-model-name", "splade", "--served-model-name", "minilm", "--log-level", "warning")
    try:
        post = lambda path, body: httpx.post(srv.url + path, json=body, timeout=60)  # noqa: E731
        r = post("/embed", {"inputs": TEXTS[0]})
        assert r.status_code == 200 and len(r.json()[0]) == 384, r.text[:300]
        assert post("/embed_all", {"inputs": TEXTS[0]}).status_code == 200
        assert post("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}).status_code == 200
        r = post("/v1/embeddings", {"input": TEXTS[0]})
        assert r.status_code == 200 and r.json()["model"] == "minilm" and len(r.json()["data"][0]["embedding"]) == 384
        for path in ("/embed", "/embed_all"):
            r = post(path, {"inputs": "x", "model": "splade"})
            assert r.status_code == 400, r.text
            assert r.json()["error_type"] == "Validation" and "use model 'minilm'" in r.json()["error"], r.text
        assert post("/embed_sparse", {"inputs": "x"}).status_code == 200
        r = post("/v1/embeddings", {"input": "x", "model": "splade"})
        assert r.status_code == 200 and r.json()["data"][0]["object"] == "sparse_embedding", r.text[:300]
    finally:
        srv.stop()
