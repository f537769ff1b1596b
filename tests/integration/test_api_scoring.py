"""/v1/rerank, /v1/score and TEI /rerank on the real server: a random-weight cross-encoder checked
against transformers' BertForSequenceClassification, and MiniLM as a bi-encoder on STSb."""
from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.stats import spearmanr

from helpers import BouquetProcess, cosine_rows, cross_encoder_reference, read_sts
from reliability import openai_error, tei_error

QUERY = "what do cats eat"
DOCS = ["Cats are obligate carnivores and eat meat.", "The stock market fell today.",
        "Kittens drink milk from their mother.", "A recipe for vegetable soup.", "cats eat fish and mice " * 40]
MAX_POS = 128
CROSS_TOKENS = 8 * MAX_POS  # the cross-encoder server's --max-request-tokens


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory) -> Path:
    """A BertForSequenceClassification (1 label) with small random weights and MiniLM's real tokenizer."""
    import torch
    import transformers as tf

    from bouquet.modelspec import resolve_model_path

    out = tmp_path_factory.mktemp("cross")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=MAX_POS, num_labels=1, initializer_range=0.2)
    tf.BertForSequenceClassification(cfg).eval().save_pretrained(out, safe_serialization=True)
    src = resolve_model_path(None)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / f, out / f)
    return out


@pytest.fixture(scope="module")
def cross_server(cross_dir):
    srv = BouquetProcess("--model", str(cross_dir), "--served-model-name", "tiny-cross",
                         "--max-request-tokens", str(CROSS_TOKENS))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(cross_dir):
    """transformers' logits for (QUERY, doc) pairs, pair-encoded and truncated on the document side."""
    return cross_encoder_reference(cross_dir, MAX_POS)


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_rerank_matches_transformers(cross_server, reference):
    ref = reference([QUERY] * len(DOCS), DOCS)
    raw = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "raw_scores": True}).json()
    got = {r["index"]: r["relevance_score"] for r in raw["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], ref, atol=1e-4)  # incl. the truncated long doc
    r = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                          "model": "tiny-cross"}).json()
    scores = [x["relevance_score"] for x in r["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-np.sort(ref)[::-1])), atol=1e-5)
    assert [x["index"] for x in r["results"]] == list(np.argsort(-ref, kind="stable"))
    assert "document" not in r["results"][0] and r["usage"]["total_tokens"] > 0


def test_top_n_and_return_documents(cross_server, reference):
    ref = reference([QUERY] * len(DOCS), DOCS)
    r = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": True})
    (only,) = r.json()["results"]
    best = int(np.argmax(ref))
    assert only["index"] == best and only["document"] == {"text": DOCS[best]}
    r = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": True})
    assert sorted(x["document"]["text"] for x in r.json()["results"]) == sorted(DOCS)


def test_score_and_tei_rerank_on_cross_encoder(cross_server, reference):
    t1, t2 = ["cats", "stocks"], ["Cats eat meat.", "Markets fell."]
    r = post(cross_server, "/v1/score", {"text_1": t1, "text_2": t2, "raw_scores": True}).json()
    assert [d["index"] for d in r["data"]] == [0, 1] and r["object"] == "list"
    np.testing.assert_allclose([d["score"] for d in r["data"]], reference(t1, t2), atol=1e-4)
    one_to_many = post(cross_server, "/v1/score", {"text_1": QUERY, "text_2": DOCS[:3], "raw_scores": True}).json()
    np.testing.assert_allclose([d["score"] for d in one_to_many["data"]], reference([QUERY] * 3, DOCS[:3]), atol=1e-4)
    tei = post(cross_server, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True, "return_text": True}).json()
    ref = reference([QUERY] * len(DOCS), DOCS)
    assert [x["index"] for x in tei] == list(np.argsort(-ref, kind="stable"))
    np.testing.assert_allclose([x["score"] for x in tei], np.sort(ref)[::-1], atol=1e-4)
    assert all(x["text"] == DOCS[x["index"]] for x in tei)
    info = httpx.get(cross_server.url + "/info").json()
    assert "reranker" in info["model_type"] and info["max_input_length"] == MAX_POS


def test_scoring_errors(cross_server):
    cases = [
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": "q", "documents": ["a", {"txt": "b"}]}, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": [{"text": 5}]}, "documents[0]"),  # was 'documents', "token ids"
        ("/v1/rerank", {"query": "q", "documents": ["a", 7]}, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "word " * 200, "documents": ["a"]}, "query"),  # the query is never truncated
        ("/v1/rerank", {"query": "q", "documents": [DOCS[-1]], "truncate": False}, "documents[0]"),
        ("/v1/score", {"text_1": "q", "text_2": ["a", DOCS[-1]], "truncate": False}, "text_2[1]"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ("/v1/score", {"text_1": [[101, 102]], "text_2": "x"}, "text_1"),
        # a query that leaves its document no room names its item, as on the other models (was "text_1")
        ("/v1/score", {"text_1": ["a", "word " * 200], "text_2": ["b", "c"]}, "text_1[1]"),
        ("/v1/score", {"text_1": "word " * 200, "text_2": ["b", "c"]}, "text_1"),
        # 31k characters: tokenized in shards where the gateway has several tokenizer threads (core.py run_sharded)
        ("/v1/score", {"text_1": ["a"] * 59 + ["word " * 200], "text_2": ["cats eat fish " * 40] * 60}, "text_1[59]"),
    ]
    for path, body, param in cases:
        r = post(cross_server, path, body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)
    # an empty query was sent: not a missing one (the code said "missing_required_parameter")
    for query, code in ((None, "missing_required_parameter"), ("", "invalid_value"), (0, "invalid_type"), ([], "invalid_type")):
        body = {"documents": ["a"], **({} if query is None else {"query": query})}
        assert post(cross_server, "/v1/rerank", body).json()["error"]["code"] == code, query
    msg = post(cross_server, "/v1/score", {"text_1": ["a", "word " * 200], "text_2": ["b", "c"]}).json()["error"]["message"]
    assert msg.startswith("text_1[1]: the query of pair 1 does not fit"), msg
    r = post(cross_server, "/predict", {"inputs": [["a", "b"], ["word " * 200, "c"]]})  # TEI's shape names it too
    assert tei_error(r, 400)["error"].startswith("inputs[1][0]: the query of pair 1 does not fit"), r.text
    # the message says what the document is (it said "got null" for an object without 'text')
    for doc, got in (({"txt": "b"}, "got an object without 'text'"), ({"text": None}, "got 'text' as null"), (7, "got a number")):
        msg = post(cross_server, "/v1/rerank", {"query": "q", "documents": ["a", doc]}).json()["error"]["message"]
        assert msg.endswith(got), (doc, msg)
    # truncation off, a document of 42,000 characters is refused from its start ("at least"), not tokenized whole
    msg = post(cross_server, "/v1/rerank", {"query": "q", "documents": ["a", "cats eat fish " * 3_000],
                                            "truncate": False}).json()["error"]["message"]
    assert msg.startswith("documents[1]: pair 1 has at least") and "(truncation is off)" in msg, msg
    r = post(cross_server, "/rerank", {"query": "q"})
    assert r.status_code == 400 and set(r.json()) == {"error", "error_type"}
    r = post(cross_server, "/v1/embeddings", {"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_task"
    assert post(cross_server, "/embed", {"inputs": "x"}).status_code == 424
    assert post(cross_server, "/v1/rerank", {"query": "q", "documents": ["a"]}).status_code == 200


def test_cross_encoder_token_limit(cross_server):
    """Pairs are counted as the model runs them (cut to 128 tokens each): 8 long documents fill the
    server's --max-request-tokens exactly and are scored; 9 → 413 in each route's shape."""
    docs = [f"document {i} " + "cats eat fish and mice " * 40 for i in range(9)]
    r = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": docs[:8]})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == CROSS_TOKENS, r.text[:300]
    for path, body in (("/v1/rerank", {"query": QUERY, "documents": docs}), ("/v1/score", {"text_1": QUERY, "text_2": docs})):
        err = openai_error(post(cross_server, path, body), 413, code="too_many_tokens")
        assert f"limit of {CROSS_TOKENS:,}" in err["message"] and "--max-request-tokens" in err["message"], err
    assert "--max-request-tokens" in tei_error(post(cross_server, "/rerank", {"query": QUERY, "texts": docs}), 413)["error"]


def test_bi_encoder_score_spearman_on_stsb(minilm_server):
    s1, s2, gold = read_sts("dev")
    r = post(minilm_server, "/v1/score", {"text_1": s1, "text_2": s2})
    assert r.status_code == 200, r.text
    scores = np.asarray([d["score"] for d in r.json()["data"]])
    assert scores.shape == (len(s1),) and (scores >= -1).all() and (scores <= 1).all()
    rho = spearmanr(scores, gold).statistic
    assert abs(rho - 0.86716) <= 0.0005, rho
    # the same numbers as cosines of the embeddings, and /v1/rerank agrees
    v1, v2 = minilm_server.vectors(s1[:20]), minilm_server.vectors(s2[:20])
    np.testing.assert_allclose(scores[:20], cosine_rows(v1, v2), atol=1e-5)
    rr = post(minilm_server, "/v1/rerank", {"query": s1[0], "documents": s2[:20]}).json()["results"]
    cos0 = cosine_rows(np.repeat(v1[:1], 20, 0), v2)
    assert [x["index"] for x in rr] == list(np.argsort(-cos0, kind="stable"))


def test_bi_encoder_long_query_error_names_the_query(minilm_server):
    # Queries are never truncated, `truncate: true` or not; the message says so, about the query.
    for truncate in (True, False):
        r = post(minilm_server, "/v1/rerank", {"query": "word " * 400, "documents": ["a"], "truncate": truncate})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "query" and err["code"] == "context_length_exceeded"
        assert err["message"].startswith("query has 402 tokens") and "queries are never truncated" in err["message"], err
    assert post(minilm_server, "/v1/rerank", {"query": "q", "documents": ["a" * 5000]}).status_code == 200


def test_bi_encoder_long_input_errors_name_the_request_field(minilm_server):
    # `param` (and the message's start) is the field of the request at fault, with its position,
    # counted in the request (texts sent more than once are embedded once: the first one is named).
    long = "word " * 400  # 402 tokens with [CLS] / [SEP], over the model's 256
    cases = [
        ("/v1/rerank", {"query": "q", "documents": ["ok", long, long], "truncate": False}, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["ok", "ok", long], "truncate": False}, "documents[2]"),
        ("/v1/score", {"text_1": "q", "text_2": ["ok", long], "truncate": False}, "text_2[1]"),
        ("/v1/score", {"text_1": ["a", long], "text_2": ["b", "c"]}, "text_1[1]"),
        ("/v1/score", {"text_1": long, "text_2": ["b", "c"]}, "text_1"),
        ("/v1/score", {"text_1": [long], "text_2": ["b", "c"]}, "text_1[0]"),  # one text_1 against each text_2
        ("/v1/score", {"text_1": ["a", "b"], "text_2": long, "truncate": False}, "text_2"),
    ]
    for route, body, where in cases:
        r = post(minilm_server, route, body)
        assert r.status_code == 400, (route, body, r.text)
        err = r.json()["error"]
        assert err["param"] == where and err["code"] == "context_length_exceeded", (where, err)
        assert err["message"].startswith(f"{where} has 402 tokens"), (where, err)
    r = post(minilm_server, "/rerank", {"query": "q", "texts": ["ok", long], "truncate": False})  # TEI's shape
    assert r.status_code == 400 and r.json()["error"].startswith("texts[1] has 402 tokens"), r.text
    assert post(minilm_server, "/v1/score", {"text_1": "q", "text_2": ["ok"]}).status_code == 200  # still serving


@pytest.fixture(scope="module")
def sharded_minilm():
    """The default model under two gateway workers of two tokenizer threads each: requests of more
    than 16,384 characters are tokenized in shards (gateway/core.py run_sharded)."""
    srv = BouquetProcess("--gateway-workers", "2", "--tokenizer-threads", "2")
    yield srv
    srv.stop()


def test_sharded_tokenizing_changes_nothing(minilm_server, sharded_minilm):
    """Embeddings, bi-encoder scores and errors of 100-text requests (several shards) equal those of
    the one-worker server (one tokenizer call), item by item; an over-long text in a later shard
    is named by its index in the request."""
    s1, s2, _ = read_sts("test")
    texts = [f"{i} " + " ".join(s1[i:i + 5] + s2[i:i + 5]) for i in range(100)]  # ~100 tokens each
    assert sum(map(len, texts)) > 16_384  # more than one shard
    one, sharded = minilm_server.vectors(texts), sharded_minilm.vectors(texts)
    assert cosine_rows(one, sharded).min() > 0.99999
    body = {"text_1": s1[0], "text_2": texts}
    a, b = post(minilm_server, "/v1/score", body).json(), post(sharded_minilm, "/v1/score", body).json()
    np.testing.assert_allclose([d["score"] for d in b["data"]], [d["score"] for d in a["data"]], atol=1e-6)
    assert a["usage"] == b["usage"]
    long = "word " * 400
    for route, body, where in (("/v1/embeddings", {"input": texts[:97] + [long] + texts[97:], "truncate": False}, "input[97]"),
                               ("/v1/rerank", {"query": "q", "documents": texts + [long], "truncate": False}, "documents[100]")):
        err = post(sharded_minilm, route, body).json()["error"]
        assert err["param"] == where and err["message"].startswith(f"{where} has 402 tokens"), err
