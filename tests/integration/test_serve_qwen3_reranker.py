"""End to end: a tiny Qwen3-Reranker-style model behind the real `bouquet serve`, scored through
/v1/rerank and /v1/score, against transformers' Qwen3ForCausalLM holding the same weights:
P("yes") = softmax over the yes/no logits at the last position of the templated pair."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from bouquet.modelspec import load_spec
from helpers import BouquetProcess
from tests.fixtures.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    model_dir = make_tiny_model("qwen3-reranker", tmp_path_factory.mktemp("rr") / "qwen3-reranker")
    # The real chat template is long for the tiny tokenizer; rotary positions need no table, so
    # only the declared maximum grows (as in the real model's 32k).
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_position_embeddings"] = 1024
    cfg_path.write_text(json.dumps(cfg))
    # two gateway workers: large requests are templated and tokenized in shards (gateway/core.py run_sharded)
    srv = BouquetProcess("--model", str(model_dir), "--log-level", "warning", "--gateway-workers", "2",
                         "--tokenizer-threads", "2")
    yield model_dir, srv
    srv.stop()


def reference_p_yes(model_dir, query: str, docs: list[str], instruction: str) -> np.ndarray:
    import transformers as tf
    from tokenizers import Tokenizer

    spec = load_spec(str(model_dir))
    yes, no = spec.yes_no_ids
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = tf.Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for d in docs:
            text = spec.pair_template.format(instruction=instruction, query=query, document=d)
            ids = tok.encode(text, add_special_tokens=False).ids
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            out.append(torch.softmax(logits[[yes, no]], 0)[0].item())
    return np.asarray(out)


def test_rerank_matches_transformers(reranker):
    model_dir, srv = reranker
    query = "what is the capital of france"
    docs = ["paris is the capital of france", "bananas are yellow", "the eiffel tower is in paris", "x"]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": query, "documents": docs, "return_documents": True}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(docs)
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    got = np.zeros(len(docs))
    for x in results:
        got[x["index"]] = x["relevance_score"]
        assert x["document"]["text"] == docs[x["index"]]
    spec = load_spec(str(model_dir))
    ref = reference_p_yes(model_dir, query, docs, spec.default_instruction)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert ((got >= 0) & (got <= 1)).all()
    # /v1/score gives the same numbers, in request order
    s = httpx.post(srv.url + "/v1/score", json={"text_1": query, "text_2": docs}, timeout=60)
    assert s.status_code == 200, s.text
    np.testing.assert_allclose([d["score"] for d in s.json()["data"]], ref, atol=1e-4)


def test_rerank_instruction_and_top_n(reranker):
    model_dir, srv = reranker
    docs = ["alpha beta", "gamma", "delta epsilon zeta"]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": "gamma?", "documents": docs, "top_n": 1,
                                                 "instruction": "Find the matching word"}, timeout=60)
    assert r.status_code == 200, r.text
    (best,) = r.json()["results"]
    ref = reference_p_yes(model_dir, "gamma?", docs, "Find the matching word")
    assert best["index"] == int(np.argmax(ref))
    assert abs(best["relevance_score"] - ref.max()) <= 1e-4
    assert srv.embed("a").status_code == 400  # a scoring model refuses /v1/embeddings clearly


def test_instruction_is_text_not_template(reranker):
    # The instruction is the client's text: a "{query}" in it stays as written (str.format fills the
    # model card's template once), and so do the query's braces; it was replaced by the query.
    model_dir, srv = reranker
    docs = ["alpha beta", "gamma"]
    for instruction, query in (("Find {query} here", "gamma?"), ("{document} {instruction}", "q {query} {document}")):
        r = httpx.post(srv.url + "/v1/score", json={"text_1": query, "text_2": docs, "instruction": instruction},
                       timeout=60)
        assert r.status_code == 200, r.text
        ref = reference_p_yes(model_dir, query, docs, instruction)
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, atol=1e-4)


def test_over_long_pairs_name_the_request_field(reranker):
    # The prompt template's pair: an over-long document with truncation off names its item; a query
    # that leaves no room names its field, as sent (one text_1 in a list is text_1[0] for every pair).
    _, srv = reranker
    long = "word " * 5000
    cases = [("/v1/rerank", {"query": "q", "documents": ["a", long], "truncate": False}, "documents[1]"),
             ("/v1/score", {"text_1": "q", "text_2": ["a", long], "truncate": False}, "text_2[1]"),
             ("/v1/score", {"text_1": [long], "text_2": ["a", "b"]}, "text_1[0]"),
             ("/v1/rerank", {"query": long, "documents": ["a", "b"]}, "query")]
    for route, body, where in cases:
        r = httpx.post(srv.url + route, json=body, timeout=60)
        assert r.status_code == 400, (where, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == where and err["message"].startswith(where + ":"), (where, err)


def test_many_documents_match_transformers_in_order(reranker):
    """100 distinct documents in one request (enough text that a gateway worker templates and
    tokenizes them in shards on its tokenizer threads): every score equals the reference, in input order, through
    /v1/rerank with and without top_n and through /v1/score."""
    from tests.fixtures.tiny_models import _WORDS

    model_dir, srv = reranker
    rng = np.random.default_rng(3)
    query = "river engine passage"
    docs = [f"{i} " + " ".join(rng.choice(_WORDS, size=int(rng.integers(20, 60)))) for i in range(100)]
    assert sum(map(len, docs)) > 16_384  # more than one shard (gateway/core.py SHARD_CHARS)
    ref = reference_p_yes(model_dir, query, docs, load_spec(str(model_dir)).default_instruction)
    res = httpx.post(srv.url + "/v1/rerank", json={"query": query, "documents": docs}, timeout=120).json()["results"]
    got = np.zeros(len(docs))
    for x in res:
        got[x["index"]] = x["relevance_score"]
    np.testing.assert_allclose(got, ref, atol=1e-4)
    order = [x["index"] for x in res]
    assert order == list(np.argsort(-got, kind="stable"))
    top = httpx.post(srv.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 7}, timeout=120).json()
    assert [(x["index"], x["relevance_score"]) for x in top["results"]] == [(x["index"], x["relevance_score"]) for x in res[:7]]
    s = httpx.post(srv.url + "/v1/score", json={"text_1": query, "text_2": docs}, timeout=120).json()["data"]
    assert [d["index"] for d in s] == list(range(100))
    np.testing.assert_allclose([d["score"] for d in s], ref, atol=1e-4)
