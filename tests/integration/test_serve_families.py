"""`bouquet serve --model DIR` serves the other embedding families end to end (XLM-R,
bidirectional Qwen3, DistilBERT, RoBERTa, MPNet, ModernBERT; BERT and causal Qwen3 have their own tests) and the other
cross-encoder families through /v1/rerank: vectors over real HTTP equal the
in-process engine's on the gateway's own token ids. The engine is checked against transformers in
test_model_families.py; this test covers the rest of the path (gRPC, scheduling, finalization).
One decoder cross-encoder (Qwen2ForSequenceClassification) answers /v1/rerank too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.heads.pooling import finalize
from bouquet.tokenization import TextTokenizer
from bouquet.modelspec import load_spec
from helpers import BouquetProcess, cosine_rows
from tests.fixtures.tiny_decoders import DECODER_KINDS
from tests.fixtures.tiny_models import make_tiny_model

TEXTS = ["hello world", "a somewhat longer sentence about search and ranking", "x"]
QUERY = "search the river city"


@pytest.mark.parametrize("kind", ["xlmr", "qwen3-bidir", "distilbert", "roberta", "mpnet", "modernbert"])
def test_serve_family_over_http(kind, tmp_path):
    model_dir = make_tiny_model(kind, tmp_path / kind)
    spec = load_spec(str(model_dir))
    enc = TextTokenizer(spec).encode(TEXTS)
    with torch.inference_mode():
        ref = finalize(Engine(spec, "cpu", "float32").step(Batch.pack(enc.ids)).wait(), spec.normalize, None)
    srv = BouquetProcess("--model", str(model_dir), "--log-level", "warning")
    try:
        got = srv.vectors(TEXTS)
        assert got.shape == (len(TEXTS), spec.dimension)
        assert cosine_rows(got, ref).min() >= 0.9999
        assert cosine_rows(got[:-1], got[1:]).max() < 0.999  # different texts, different vectors
        r = srv.embed(TEXTS)
        assert r.json()["usage"]["prompt_tokens"] == enc.num_tokens
        if kind == "xlmr":
            check_tokenize_spans(srv)
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["distilbert-cross", "roberta-cross", "mpnet-cross", "modernbert-cross"])
def test_serve_cross_family_over_http(kind, tmp_path):
    """/v1/rerank on a cross-encoder family: raw scores over HTTP equal the in-process engine's
    logits on the gateway's own (query, document) pair encoding, and the order follows them."""
    import httpx

    model_dir = make_tiny_model(kind, tmp_path / kind)
    spec = load_spec(str(model_dir))
    enc = TextTokenizer(spec).encode_pairs([(QUERY, d) for d in TEXTS])
    with torch.inference_mode():
        ref = Engine(spec, "cpu", "float32").step(Batch.pack(enc.ids, enc.type_ids)).wait()[:, 0]
    srv = BouquetProcess("--model", str(model_dir), "--log-level", "warning")
    try:
        r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": TEXTS, "raw_scores": True}, timeout=60)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], ref, atol=1e-4)
        assert [x["index"] for x in r.json()["results"]] == list(np.argsort(-ref, kind="stable"))
        assert ref.max() - ref.min() > 0.05  # the documents score differently
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_serve_decoder_family_over_http(kind, tmp_path):
    """The decoder embedders (gte-Qwen2, e5-mistral, EmbeddingGemma styles) over /v1/embeddings,
    plain and with their query prompt: equal to the in-process engine on the prompted text (the
    gateway appends a missing EOS, e5-mistral's pooled token)."""
    model_dir = make_tiny_model(kind, tmp_path / kind)
    spec = load_spec(str(model_dir))
    prompt = spec.prompts["query"]
    tok = TextTokenizer(spec)
    with torch.inference_mode():
        engine = Engine(spec, "cpu", "float32")
        ref, ref_q = (finalize(engine.step(Batch.pack(tok.encode(texts).ids)).wait(), spec.normalize, None)
                      for texts in (TEXTS, [prompt + t for t in TEXTS]))
    if spec.append_eos_id is not None:
        assert all(ids[-1] == spec.append_eos_id for ids in tok.encode(TEXTS).ids)
    srv = BouquetProcess("--model", str(model_dir), "--log-level", "warning")
    try:
        got, got_q = srv.vectors(TEXTS), srv.vectors(TEXTS, prompt_name="query")
        assert got.shape == (len(TEXTS), spec.dimension)
        assert cosine_rows(got, ref).min() >= 0.9999 and cosine_rows(got_q, ref_q).min() >= 0.9999
        assert cosine_rows(got, got_q).max() < 0.999  # the prompt changes the vectors
        assert cosine_rows(got[:-1], got[1:]).max() < 0.999
        # /tokenize lists the ids the model reads (the EOS the gateway appends included), as usage counts them
        import httpx

        toks = httpx.post(srv.url + "/tokenize", json={"inputs": TEXTS[0]}, timeout=30).json()[0]
        assert [t["id"] for t in toks] == list(tok.encode(TEXTS[:1]).ids[0]), toks
        usage = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[0]}, timeout=30).json()["usage"]
        assert usage["prompt_tokens"] == len(toks) and toks[-1]["special"] and toks[-1]["start"] is None
    finally:
        srv.stop()


def test_serve_decoder_cross_encoder_over_http(tmp_path):
    """/v1/rerank on a decoder cross-encoder (Qwen2ForSequenceClassification, 2 labels): the pair
    is the tokenizer's own template (no separator, no token types), pooled on the document's last
    token, and the score is the softmax of the last label of the in-process engine's logits."""
    import httpx

    model_dir = make_tiny_model("qwen2-cross", tmp_path / "qwen2-cross")
    spec = load_spec(str(model_dir))
    tok = TextTokenizer(spec)
    enc = tok.encode_pairs([(QUERY, d) for d in TEXTS])
    alone = tok.encodings([QUERY, *TEXTS], add_special_tokens=False)
    assert [list(ids) for ids in enc.ids] == [alone[0].ids + a.ids for a in alone[1:]]
    with torch.inference_mode():
        logits = Engine(spec, "cpu", "float32").step(Batch.pack(enc.ids, enc.type_ids)).wait()  # [3, 2]
    ref = torch.softmax(torch.from_numpy(logits).double(), 1)[:, -1].numpy()
    srv = BouquetProcess("--model", str(model_dir), "--log-level", "warning")
    try:
        r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], ref, atol=1e-5)
        assert ref.max() - ref.min() > 0.05  # the documents score differently
    finally:
        srv.stop()


def check_tokenize_spans(srv: BouquetProcess) -> None:
    """/tokenize on a SentencePiece tokenizer: its synthetic "▁" word-start token covers no input
    characters, spans never overlap, and every token's text is ``input[start:stop]``."""
    import httpx

    for text in ("中文字符测试", "hello 中文 world", "😀x", "a  b"):
        r = httpx.post(srv.url + "/tokenize", json={"inputs": text, "add_special_tokens": False}, timeout=30)
        assert r.status_code == 200, r.text
        toks = r.json()[0]
        end = 0
        for t in toks:
            assert t["text"] == text[t["start"]:t["stop"]] and t["start"] >= end, (text, toks)
            end = t["stop"]
        assert "".join(t["text"] for t in toks) == text.replace(" ", "") or " " in text
    first = httpx.post(srv.url + "/tokenize", json={"inputs": "中文字符测试", "add_special_tokens": False}).json()[0]
    assert first[0]["text"] == "" and first[0]["start"] == first[0]["stop"] == 0  # the "▁"
