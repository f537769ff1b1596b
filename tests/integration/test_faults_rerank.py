"""Issue 8, fault kind 9: rerank with a cross-encoder on the real `bouquet serve` (CPU).

The model is the engine branch's tiny random-weight BertForSequenceClassification
(``make_tiny_model("bert-cross")``, wide init so documents get clearly different scores); the
reference is transformers' own forward pass over the same (query, document) pairs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import numpy as np
import pytest

from helpers import BouquetProcess, cross_encoder_reference


MAX_POS = 64  # the tiny BERT's max_position_embeddings
# Three documents per query, words from the tiny tokenizer's vocabulary (no [UNK] soup).
CASES = [
    ("search query", ["river mountain city", "document index vector model", "red blue green house"]),
    ("rerank relevant passage", ["the answer to the question", "night day water fire", "gateway batch embedding"]),
    ("stone light dark", ["stone light dark", "music paper learning fast slow", "a web judge"]),
    ("engine server", ["retrieve web passage " * 12, "engine server gateway", "token score"]),  # 1st is truncated
]


@pytest.fixture(scope="module")
def tiny_cross(tmp_path_factory) -> Path:
    from fixtures.tiny_models import make_tiny_model

    return make_tiny_model("bert-cross", tmp_path_factory.mktemp("bert-cross"))


@pytest.fixture(scope="module")
def server(tiny_cross) -> Iterator[BouquetProcess]:
    # two gateway workers: the tokenizer's Rust threads are off then, and large requests are
    # tokenized in shards on the tokenizer threads (gateway/core.py run_sharded), as on a GPU host
    srv = BouquetProcess("--model", str(tiny_cross), "--served-model-name", "tiny-bert-cross",
                         "--gateway-workers", "2", "--tokenizer-threads", "2")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def logits(tiny_cross) -> Callable[[list[str], list[str]], np.ndarray]:
    return cross_encoder_reference(tiny_cross, MAX_POS)


def post(srv: BouquetProcess, path: str, body: dict) -> httpx.Response:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, (path, body, r.text)
    return r


@pytest.mark.parametrize("query, docs", CASES)
def test_top_n_1_of_three_is_the_argmax(server, logits, query, docs):
    ref = logits([query] * 3, docs)
    best = int(np.argmax(ref))
    # A near-tie would make "the right index" depend on float noise, not on the server.
    assert np.sort(ref)[-1] - np.sort(ref)[-2] > 1e-3, ref
    (only,) = post(server, "/v1/rerank", {"query": query, "documents": docs, "top_n": 1}).json()["results"]
    assert only["index"] == best
    assert 0.0 <= only["relevance_score"] <= 1.0
    assert only["relevance_score"] == pytest.approx(1 / (1 + np.exp(-ref[best])), abs=1e-5)
    # return_documents echoes the chosen document, as an object with its text
    (only,) = post(server, "/v1/rerank", {"query": query, "documents": docs, "top_n": 1, "return_documents": True,
                                          "model": "tiny-bert-cross"}).json()["results"]
    assert only["index"] == best and only["document"] == {"text": docs[best]}


@pytest.mark.parametrize("query, docs", CASES)
def test_full_ranking_sorted_and_tei_raw_scores(server, logits, query, docs):
    ref = logits([query] * 3, docs)
    order = list(np.argsort(-ref, kind="stable"))
    res = post(server, "/v1/rerank", {"query": query, "documents": docs, "return_documents": True}).json()["results"]
    scores = [x["relevance_score"] for x in res]
    assert [x["index"] for x in res] == order and scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores) and all(x["document"]["text"] == docs[x["index"]] for x in res)
    # TEI /rerank: raw logits (not squashed), sorted, with the texts
    tei = post(server, "/rerank", {"query": query, "texts": docs, "raw_scores": True, "return_text": True}).json()
    assert [x["index"] for x in tei] == order
    np.testing.assert_allclose([x["score"] for x in tei], ref[order], atol=1e-4)
    assert all(x["text"] == docs[x["index"]] for x in tei)
    # TEI default: sigmoid scores in [0, 1], same order
    tei = post(server, "/rerank", {"query": query, "texts": docs}).json()
    assert [x["index"] for x in tei] == order
    np.testing.assert_allclose([x["score"] for x in tei], 1 / (1 + np.exp(-ref[order])), atol=1e-5)


def test_hundred_documents_match_sentence_transformers(server, tiny_cross):
    """One request of 100 distinct documents (most over the model's 64 tokens, so cut on the
    document side; enough text that each of the server's two gateway workers tokenizes it in shards
    on its tokenizer threads) scores
    every document as sentence-transformers' CrossEncoder does, in input order, with and without
    ``top_n``; TEI's ``truncation_direction: left`` keeps the documents' ends as CrossEncoder does
    with its tokenizer's ``truncation_side = "left"``."""
    from sentence_transformers import CrossEncoder

    from fixtures.tiny_models import _WORDS

    rng = np.random.default_rng(7)
    query = "river engine passage"
    docs = [f"{i} " + " ".join(rng.choice(_WORDS, size=int(rng.integers(10, 120)))) for i in range(100)]
    assert sum(map(len, docs)) > 16_384  # more than one shard of the gateway's tokenizing (core.SHARD_CHARS)
    ce = CrossEncoder(str(tiny_cross), max_length=MAX_POS, device="cpu")
    want = ce.predict([(query, d) for d in docs], batch_size=100)
    whole = ce.tokenizer([query] * len(docs), docs, truncation=False)["input_ids"]
    assert sum(len(x) > MAX_POS for x in whole) >= 30  # many are cut
    res = post(server, "/v1/rerank", {"query": query, "documents": docs}).json()
    got = np.zeros(len(docs))
    for x in res["results"]:
        got[x["index"]] = x["relevance_score"]
    np.testing.assert_allclose(got, want, atol=1e-5)
    order = [x["index"] for x in res["results"]]
    assert sorted(order) == list(range(100)) and order == list(np.argsort(-got, kind="stable"))
    top = post(server, "/v1/rerank", {"query": query, "documents": docs, "top_n": 10, "return_documents": True}).json()
    assert [x["index"] for x in top["results"]] == order[:10]
    assert [x["relevance_score"] for x in top["results"]] == [x["relevance_score"] for x in res["results"][:10]]
    assert all(x["document"]["text"] == docs[x["index"]] for x in top["results"])
    assert top["usage"] == res["usage"]
    score = post(server, "/v1/score", {"text_1": query, "text_2": docs}).json()["data"]
    assert [d["index"] for d in score] == list(range(100))
    np.testing.assert_allclose([d["score"] for d in score], want, atol=1e-5)
    ce.tokenizer.truncation_side = "left"
    want_left = ce.predict([(query, d) for d in docs], batch_size=100)
    assert np.abs(want_left - want).max() > 1e-3  # the two sides differ: the test below can tell them apart
    tei = post(server, "/rerank", {"query": query, "texts": docs, "truncation_direction": "left"}).json()
    np.testing.assert_allclose([x["score"] for x in sorted(tei, key=lambda x: x["index"])], want_left, atol=1e-5)
