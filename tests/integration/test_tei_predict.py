"""TEI ``POST /predict`` and the compat routes ``POST /`` / ``POST /invocations`` on the real server.

One ``bouquet serve`` holds three scoring models: a 3-label BertForSequenceClassification (NLI
labels, MiniLM's tokenizer, 64 positions), the 1-label tiny ``bert-cross`` and the tiny Qwen3
yes/no reranker. /predict is checked against sentence-transformers' CrossEncoder (pairs) and
transformers (single texts, which CrossEncoder does not take), for one text, one pair and a mixed
batch, with raw_scores on and off; against /rerank for the 1-label and yes/no models; bad inputs
get TEI's error shape and the next request still succeeds. huggingface_hub's InferenceClient posts
to ``/``: its ``feature_extraction`` and ``text_classification`` run against the served models."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from helpers import BouquetProcess
from reliability import tei_error

MAX_POS = 64
LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}
MAX_INPUTS = 8
MAX_TOKENS = 1000  # a templated (query, LONG) pair of the tiny reranker is ~700 tokens; two pass the limit
TEXT = "A man is playing a guitar on the stage."
PAIR = ("A man is playing a guitar.", "Someone makes music.")
LONG = "cats eat fish and mice " * 30  # ~150 tokens: past the 64 positions, truncated
BATCH = [[TEXT], list(PAIR), ["A dog runs in the park.", LONG], [LONG], ["The stock market fell today.", "Cats sleep."]]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    import torch
    import transformers as tf

    from bouquet.modelspec import resolve_model_path
    from tests.fixtures.tiny_models import make_tiny_model

    nli = tmp_path_factory.mktemp("nli")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=MAX_POS, num_labels=3, initializer_range=0.2,
                        id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    tf.BertForSequenceClassification(cfg).eval().save_pretrained(nli, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(resolve_model_path(None) / f, nli / f)
    rr = make_tiny_model("qwen3-reranker", tmp_path_factory.mktemp("rr") / "qwen3-reranker")
    conf = json.loads((rr / "config.json").read_text())
    conf["max_position_embeddings"] = 1024  # room for the reranker's prompt template (rotary: no table)
    (rr / "config.json").write_text(json.dumps(conf))
    return {"nli": nli, "cross": make_tiny_model("bert-cross", tmp_path_factory.mktemp("cross")), "rr": rr}


@pytest.fixture(scope="module")
def server(models) -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--model", str(models["nli"]), "--model", str(models["cross"]), "--model", str(models["rr"]),
                         "--served-model-name", "nli", "--served-model-name", "cross", "--served-model-name", "rr",
                         "--max-inputs", str(MAX_INPUTS), "--max-request-tokens", str(MAX_TOKENS))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def nli_reference(models):
    """(CrossEncoder logits of pairs, transformers logits of single texts), float64 [N, 3]."""
    import torch
    import transformers as tf
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(models["nli"]), max_length=MAX_POS, device="cpu")
    tok = tf.AutoTokenizer.from_pretrained(models["nli"])
    model = tf.BertForSequenceClassification.from_pretrained(models["nli"]).eval()

    def pairs(items: list[tuple[str, str]]) -> np.ndarray:
        return np.asarray(ce.predict(items, activation_fn=torch.nn.Identity()), dtype=np.float64)

    def singles(texts: list[str], side: str = "right") -> np.ndarray:
        tok.truncation_side = side
        enc = tok(texts, padding=True, truncation=True, max_length=MAX_POS, return_tensors="pt")
        with torch.no_grad():
            return model(**enc).logits.double().numpy()

    return pairs, singles


def post(srv: BouquetProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def by_label(preds: list[dict[str, Any]]) -> dict[str, float]:
    """One input's answer → {label: score}, after checking its shape: every label once, by score descending."""
    scores = [p["score"] for p in preds]
    assert scores == sorted(scores, reverse=True), preds
    assert all(set(p) == {"score", "label"} for p in preds), preds
    out = {p["label"]: p["score"] for p in preds}
    assert len(out) == len(preds), preds
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_predict_matches_cross_encoder(server, nli_reference):
    """One text, one pair, a mixed batch, raw_scores on and off: every label's score as the references'."""
    pairs, singles = nli_reference
    names = [LABELS[i] for i in range(3)]
    ref = {"text": singles([TEXT])[0], "pair": pairs([PAIR])[0]}
    batch_ref = np.stack([singles(b)[0] if len(b) == 1 else pairs([tuple(b)])[0] for b in BATCH])
    assert np.ptp(batch_ref, axis=0).min() > 1e-2  # inputs score apart: a wrong row would show
    for raw in (True, False):
        want = (lambda x: x) if raw else softmax
        for inputs, key in ((TEXT, "text"), ([TEXT], "text"), (list(PAIR), "pair")):
            r = post(server, "/predict", {"inputs": inputs, "raw_scores": raw})
            assert r.status_code == 200, r.text
            got = by_label(r.json())
            assert set(got) == set(names)
            np.testing.assert_allclose([got[n] for n in names], want(ref[key]), atol=1e-4)
        r = post(server, "/predict", {"inputs": BATCH, "raw_scores": raw, "model": "nli"})
        assert r.status_code == 200, r.text
        assert len(r.json()) == len(BATCH)
        got_rows = [by_label(preds) for preds in r.json()]
        np.testing.assert_allclose([[g[n] for n in names] for g in got_rows], want(batch_ref), atol=1e-4)
    info = httpx.get(server.url + "/info").json()  # the first model: several labels make a TEI "classifier"
    assert info["model_type"] == {"classifier": {"id2label": {str(k): v for k, v in LABELS.items()},
                                                 "label2id": {v: k for k, v in LABELS.items()}}}


def test_predict_truncation_and_parameters(server, nli_reference):
    """truncate: false refuses the long input (naming it); truncation_direction Left keeps its end;
    huggingface_hub's ``parameters``: top_k keeps the best labels, function_to_apply picks the function."""
    pairs, singles = nli_reference
    err = tei_error(post(server, "/predict", {"inputs": [[TEXT], [LONG]], "truncate": False}), 400)
    assert "inputs[1][0]" in err["error"], err
    err = tei_error(post(server, "/predict", {"inputs": ["q", LONG], "truncate": False}), 400)
    assert "inputs[1]" in err["error"], err
    long = LONG + "the end differs from the start"
    for side in ("Right", "Left"):
        got = by_label(post(server, "/predict", {"inputs": long, "raw_scores": True, "truncation_direction": side}).json())
        np.testing.assert_allclose([got[LABELS[i]] for i in range(3)], singles([long], side.lower())[0], atol=1e-4)
    assert np.abs(singles([long], "left")[0] - singles([long])[0]).max() > 1e-3  # the two cuts score apart
    logits = pairs([PAIR])[0]
    best = LABELS[int(np.argmax(logits))]
    top = post(server, "/predict", {"inputs": list(PAIR), "parameters": {"top_k": 1}}).json()
    assert [p["label"] for p in top] == [best]
    for fn, want in (("sigmoid", 1 / (1 + np.exp(-logits))), ("softmax", softmax(logits)), ("none", logits)):
        got = by_label(post(server, "/predict", {"inputs": list(PAIR), "parameters": {"function_to_apply": fn}}).json())
        np.testing.assert_allclose([got[LABELS[i]] for i in range(3)], want, atol=1e-4)
    tei_error(post(server, "/predict", {"inputs": TEXT, "raw_scores": True, "parameters": {"function_to_apply": "softmax"}}),
              400)


def test_predict_one_label_and_yes_no_reranker_agree_with_rerank(server, models):
    """A 1-label cross-encoder: sigmoid (CrossEncoder's default), or the logit with raw_scores, named
    with its config's label; the yes/no reranker: P("yes") under "score", pairs only. Both as /rerank."""
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(models["cross"]), max_length=MAX_POS, device="cpu")
    label = json.loads((models["cross"] / "config.json").read_text())["id2label"]["0"]
    docs = ["river engine passage", "red blue green house"]
    want = ce.predict([("search query", d) for d in docs])
    r = post(server, "/predict", {"inputs": [["search query", d] for d in docs], "model": "cross"})
    assert r.status_code == 200, r.text
    assert [[p["label"] for p in preds] for preds in r.json()] == [[label], [label]]
    np.testing.assert_allclose([preds[0]["score"] for preds in r.json()], want, atol=1e-4)
    for model in ("cross", "rr"):
        for raw in (False, True):
            ranks = post(server, "/rerank", {"query": "search query", "texts": docs, "raw_scores": raw, "model": model})
            ref = {x["index"]: x["score"] for x in ranks.json()}
            got = post(server, "/predict", {"inputs": [["search query", d] for d in docs], "raw_scores": raw,
                                            "model": model}).json()
            np.testing.assert_allclose([preds[0]["score"] for preds in got], [ref[0], ref[1]], atol=1e-6)
    assert post(server, "/predict", {"inputs": ["search query", "red"], "model": "rr"}).json()[0]["label"] == "score"
    err = tei_error(post(server, "/predict", {"inputs": [["search query", "red"], ["a text alone"]], "model": "rr"}), 400)
    assert "inputs[1][0]" in err["error"] and "pairs" in err["error"], err
    assert post(server, "/predict", {"inputs": ["search query", "red"], "model": "rr"}).status_code == 200


@pytest.mark.parametrize("body,status,says", [
    ({}, 400, "inputs"),
    ({"inputs": ""}, 400, "empty"),
    ({"inputs": []}, 400, "empty list"),
    ({"inputs": ["a", "b", "c"]}, 400, "3 strings"),
    ({"inputs": [["a", "b", "c"]]}, 400, "inputs[0]"),
    ({"inputs": [[]]}, 400, "inputs[0]"),
    ({"inputs": [["a"], "b"]}, 400, "inputs[1]"),
    ({"inputs": [["a", 3]]}, 400, "inputs[0][1]"),
    ({"inputs": [["a", ""]]}, 400, "inputs[0][1]"),
    ({"inputs": [1]}, 400, "inputs[0]"),
    ({"inputs": {"text": "a"}}, 400, "got an object"),
    ({"inputs": [["a"]] * (MAX_INPUTS + 1)}, 413, "--max-inputs"),
    ({"inputs": [["q", LONG]] * 2, "model": "rr"}, 413, "--max-request-tokens"),
    ({"inputs": "a", "truncation_direction": "Middle"}, 400, "truncation_direction"),
    ({"inputs": "a", "raw_scores": "yes"}, 400, "raw_scores"),
    ({"inputs": "a", "parameters": {"top_k": 0}}, 400, "top_k"),
    ({"inputs": "a", "parameters": {"function_to_apply": "relu"}}, 400, "function_to_apply"),
    ({"inputs": "a", "instruction": "Judge"}, 400, "instruction"),
])
def test_predict_bad_input_is_a_tei_error_and_the_next_request_succeeds(server, body, status, says):
    err = tei_error(post(server, "/predict", body), status)
    assert says in err["error"], err
    assert post(server, "/predict", {"inputs": [["a"], ["b", "c"]]}).status_code == 200


def test_predict_on_an_embedding_model_is_424(minilm_server):
    err = tei_error(post(minilm_server, "/predict", {"inputs": "a text"}), 424)
    assert "not a classifier" in err["error"] and err["error_type"] == "Backend", err
    assert post(minilm_server, "/embed", {"inputs": "a text"}).status_code == 200


def test_compat_routes_dispatch_on_the_body(server, minilm_server):
    """``/`` and ``/invocations``: query + texts → /rerank; inputs → the model's /predict or /embed
    (an inputs object → /similarity); neither or both → 400 naming what is accepted."""
    for path in ("/", "/invocations"):
        for body, route in (({"inputs": BATCH}, "/predict"), ({"inputs": TEXT, "raw_scores": True}, "/predict"),
                            ({"query": "q", "texts": ["a", "b"]}, "/rerank")):
            r = post(server, path, body)
            assert r.status_code == 200 and r.json() == post(server, route, body).json(), (path, body, r.text)
        for body, route in (({"inputs": ["a", "b"]}, "/embed"),
                            ({"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}, "/similarity")):
            r = post(minilm_server, path, body)
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json(), post(minilm_server, route, body).json(), atol=1e-6)
        for bad in ({}, {"input": "x"}, {"query": "q", "texts": ["a"], "inputs": "x"}):
            err = tei_error(post(server, path, bad), 400)
            assert "'query' and 'texts'" in err["error"] and "'inputs'" in err["error"] and "/predict" in err["error"]
        assert "/embed" in tei_error(post(minilm_server, path, {}), 400)["error"]
        assert post(server, path, {"inputs": TEXT}).status_code == 200
        # similarity on scoring models: the error says what it needs and where to go, not the /predict shapes
        err = tei_error(post(server, path, {"inputs": {"source_sentence": "a", "sentences": ["b"]}}), 424)
        assert "needs an embedding model" in err["error"] and "'model'" in err["error"], err
        assert "/similarity" in err["error"] and "must be" not in err["error"], err
    spec = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert all(r in spec["/"]["post"]["summary"] for r in ("/embed", "/predict", "/similarity", "/embed_sparse", "/rerank"))
    for path in ("/predict", "/", "/invocations"):
        op = spec[path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["properties"]["inputs"], path
        assert {"200", "400", "413", "424"} <= set(op["responses"]), path


def test_huggingface_hub_inference_client(server, minilm_server, st_minilm, nli_reference):
    """huggingface_hub's InferenceClient(base_url) posts {"inputs": ...} to ``/``: feature_extraction
    gets the embedding model's vectors, text_classification the first model's labels (TEI answers one
    input with a flat list, of which this client returns the first element: the best label)."""
    from huggingface_hub import InferenceClient

    vec = InferenceClient(base_url=minilm_server.url).feature_extraction(TEXT)
    assert vec.shape == (1, 384)
    np.testing.assert_allclose(vec[0], st_minilm.encode(TEXT, normalize_embeddings=True), atol=1e-5)
    client = InferenceClient(base_url=server.url)
    got = client.text_classification(TEXT)
    got = got if isinstance(got, list) else [got]
    probs = softmax(nli_reference[1]([TEXT])[0])
    best = int(np.argmax(probs))
    assert got[0].label == LABELS[best] and abs(got[0].score - probs[best]) < 1e-4, got
    two = client.text_classification(TEXT, top_k=2, function_to_apply="sigmoid")
    two = two if isinstance(two, list) else [two]
    assert two[0].label == LABELS[best], two
