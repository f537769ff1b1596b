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
    srv = BouquetProcess("--model", str(tiny_cross), "--served-model-name", "tiny-bert-cross")
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
