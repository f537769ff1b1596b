"""Issue 39, item 4: every TEI / Cohere field bouquet accepts is honoured or refused, never accepted
and ignored. TEI ``/rerank``'s ``truncation_direction`` on a cross-encoder of 64 tokens with a
162-token document: "Left" keeps the document's end, "Right" its start, each scored as
sentence-transformers' CrossEncoder scores the text kept; Cohere fields bouquet does not implement
get 400; ``instruction`` on a model that takes none gets 400 on every scoring route."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from helpers import BouquetProcess
from reliability import openai_error, tei_error

QUERY = "red fox"
DOC_TOKENS = 162
MAX_LEN = 64


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory) -> Path:
    from tests.fixtures.tiny_models import make_tiny_model

    return make_tiny_model("bert-cross", tmp_path_factory.mktemp("bert-cross"))


@pytest.fixture(scope="module")
def cross_server(cross_dir) -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--model", str(cross_dir))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def document(cross_dir) -> tuple[str, list[str]]:
    """(a 162-token document of whole-word tokens, its words): its start and end differ, and any
    run of its words re-tokenizes to the same tokens, so a text cut is a token cut."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(cross_dir / "tokenizer.json"))
    vocab = sorted(w for w in tok.get_vocab() if w.isalpha() and len(w) > 2 and tok.encode(w, add_special_tokens=False).ids
                   == [tok.token_to_id(w)])
    assert len(vocab) >= 20, vocab
    words = [vocab[(i * 7) % len(vocab)] for i in range(DOC_TOKENS)]
    doc = " ".join(words)
    assert len(tok.encode(doc, add_special_tokens=False).ids) == DOC_TOKENS
    return doc, words


def test_rerank_truncation_direction_keeps_the_side_asked(cross_server, cross_dir, document):
    import torch
    from sentence_transformers import CrossEncoder
    from tokenizers import Tokenizer

    doc, words = document
    q_len = len(Tokenizer.from_file(str(cross_dir / "tokenizer.json")).encode(QUERY, add_special_tokens=False).ids)
    room = MAX_LEN - q_len - 3  # [CLS] query [SEP] document [SEP]
    kept = {"Right": " ".join(words[:room]), "Left": " ".join(words[-room:])}
    ce = CrossEncoder(str(cross_dir), max_length=MAX_LEN, device="cpu")
    ref = {side: float(ce.predict([(QUERY, text)], activation_fn=torch.nn.Identity())[0]) for side, text in kept.items()}
    got = {}
    for side in ("Left", "Right", None):
        body = {"query": QUERY, "texts": [doc, kept["Right"]], "raw_scores": True}
        if side is not None:
            body["truncation_direction"] = side
        r = httpx.post(cross_server.url + "/rerank", json=body, timeout=60)
        assert r.status_code == 200, r.text
        got[side] = {x["index"]: x["score"] for x in r.json()}
    assert abs(ref["Left"] - ref["Right"]) > 1e-3, ref  # the two ends score apart: the test can tell them apart
    np.testing.assert_allclose(got["Left"][0], ref["Left"], atol=1e-4)
    np.testing.assert_allclose(got["Right"][0], ref["Right"], atol=1e-4)
    assert got[None] == got["Right"]  # TEI's default
    np.testing.assert_allclose(got["Left"][1], ref["Right"], atol=1e-4)  # a text that fits is never cut
    for bad in ("Middle", "", "start", 1):
        err = tei_error(httpx.post(cross_server.url + "/rerank", json={"query": QUERY, "texts": [doc],
                                                                        "truncation_direction": bad}), 400)
        assert "truncation_direction" in err["error"], err


def test_every_tei_rerank_field_changes_the_answer(cross_server, document):
    """raw_scores, return_text, truncate, truncation_direction: each one sent changes what comes back."""
    doc, _ = document
    url = cross_server.url + "/rerank"
    base = {"query": QUERY, "texts": [doc, "fox"]}
    plain = httpx.post(url, json=base).json()
    assert all(0 < x["score"] < 1 and "text" not in x for x in plain)
    raw = httpx.post(url, json={**base, "raw_scores": True}).json()
    assert {x["index"]: x["score"] for x in raw} != {x["index"]: x["score"] for x in plain}
    assert {x["text"] for x in httpx.post(url, json={**base, "return_text": True}).json()} == {doc, "fox"}
    assert "texts[0]" in tei_error(httpx.post(url, json={**base, "truncate": False}), 400)["error"]
    left = httpx.post(url, json={**base, "truncation_direction": "Left"}).json()
    assert {x["index"]: x["score"] for x in left}[0] != {x["index"]: x["score"] for x in plain}[0]


@pytest.mark.parametrize("field,value", [("max_chunks_per_doc", 2), ("max_tokens_per_doc", 32),
                                         ("rank_fields", ["title"]), ("rank_fields", ["text", "title"])])
def test_cohere_fields_not_implemented_are_refused(cross_server, field, value):
    body = {"query": QUERY, "documents": ["fox", "dog"], field: value}
    err = openai_error(httpx.post(cross_server.url + "/v1/rerank", json=body), 400, field, "unsupported_parameter")
    assert field in err["message"]
    ok = httpx.post(cross_server.url + "/v1/rerank", json={**body, field: None, "rank_fields": ["text"]})
    assert ok.status_code == 200, ok.text


def test_instruction_refused_where_no_model_reads_it(cross_server, minilm_server):
    for srv in (cross_server, minilm_server):  # a cross-encoder; a bi-encoder (cosine scores)
        for path, body in (("/v1/rerank", {"query": "q", "documents": ["d"]}), ("/rerank", {"query": "q", "texts": ["d"]}),
                           ("/v1/score", {"text_1": "q", "text_2": "d"})):
            r = httpx.post(srv.url + path, json={**body, "instruction": "Judge relevance"}, timeout=60)
            assert r.status_code == 400 and "instruction" in r.text, (srv.url, path, r.text)


def test_truncation_direction_refused_alike_on_every_tei_route(minilm_server):
    # /embed_all read "" as the default ("Right") where /embed and /rerank refuse it
    for path in ("/embed", "/embed_all"):
        for bad in ("", "Middle", 1):
            err = tei_error(httpx.post(minilm_server.url + path, json={"inputs": "fox", "truncation_direction": bad},
                                       timeout=60), 400)
            assert "truncation_direction" in err["error"], (path, bad, err)
        for ok in ("left", "RIGHT"):
            r = httpx.post(minilm_server.url + path, json={"inputs": "fox", "truncation_direction": ok}, timeout=60)
            assert r.status_code == 200, (path, ok, r.text[:200])
