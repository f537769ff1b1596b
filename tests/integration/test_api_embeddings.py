"""/v1/embeddings and TEI /embed on the real server (MiniLM): input forms, truncation, long inputs,
Matryoshka dimensions, base64, token ids, usage — through httpx and the official openai client."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from helpers import cosine_rows

LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 60  # ~800 tokens > 256
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_long_input_same_vector_as_string_list_and_tei_embed(minilm_server):
    as_str = minilm_server.vectors(LONG, truncate=True)
    as_list = minilm_server.vectors(["short one", LONG], truncate=True)[1:]
    r = post(minilm_server, "/embed", {"inputs": [LONG], "truncate": True})
    assert r.status_code == 200, r.text
    tei = np.asarray(r.json(), dtype=np.float32)
    assert tei.shape == (1, 384)
    np.testing.assert_allclose(as_str, as_list, atol=1e-5)
    np.testing.assert_allclose(as_str, tei, atol=1e-5)


def test_truncation_off_is_400_with_count_and_limit(minilm_server, st_minilm):
    n = len(st_minilm.tokenizer(LONG)["input_ids"])
    r = minilm_server.embed([LONG], truncate=False)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and f"{n} tokens" in err["message"] and "256" in err["message"]
    r = post(minilm_server, "/embed", {"inputs": LONG, "truncate": False})
    assert r.status_code == 400 and set(r.json()) == {"error", "error_type"} and f"{n} tokens" in r.json()["error"]
    r = minilm_server.embed(LONG, truncate=True, long_input="error")
    assert r.status_code == 400 and r.json()["error"]["param"] == "long_input"
    assert minilm_server.embed("fine").status_code == 200


def test_truncation_side_left_keeps_the_end(minilm_server, st_minilm):
    ids = st_minilm.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    cls, sep = st_minilm.tokenizer.cls_token_id, st_minilm.tokenizer.sep_token_id
    left = minilm_server.vectors(LONG, truncation_side="left")
    right = minilm_server.vectors(LONG, truncation_side="right")
    np.testing.assert_allclose(left, minilm_server.vectors([[cls, *ids[-254:], sep]]), atol=1e-5)
    np.testing.assert_allclose(right, minilm_server.vectors([[cls, *ids[:254], sep]]), atol=1e-5)
    assert minilm_server.embed(LONG, truncation_side="middle").status_code == 400


def test_usage_counts_tokens_and_base64_decodes_to_floats(minilm_server):
    texts = ["hello", "a cat sat on the mat"]
    f = minilm_server.embed(texts, encoding_format="float").json()
    b = minilm_server.embed(texts, encoding_format="base64").json()
    assert f["usage"] == b["usage"] == {"prompt_tokens": 3 + 8, "total_tokens": 3 + 8}
    for fi, bi in zip(f["data"], b["data"]):
        decoded = np.frombuffer(base64.b64decode(bi["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(fi["embedding"], dtype=np.float32))


def test_dimensions_is_renormalized_prefix(minilm_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused")
    full = minilm_server.vectors(["Matryoshka dolls nest.", "pasta"])
    got = client.embeddings.create(model=MODEL, input=["Matryoshka dolls nest.", "pasta"], dimensions=256)
    v = np.asarray([d.embedding for d in got.data], dtype=np.float32)
    ref = full[:, :256] / np.linalg.norm(full[:, :256], axis=1, keepdims=True)
    assert v.shape == (2, 256)
    np.testing.assert_allclose(v, ref, atol=1e-5)
    for bad in (0, -3, 385):
        r = minilm_server.embed("x", dimensions=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


def test_token_ids_embed_like_text_and_bad_ids_are_400(minilm_server):
    text = minilm_server.vectors(["hello"])
    np.testing.assert_allclose(minilm_server.vectors([[101, 7592, 102]]), text, atol=1e-6)
    np.testing.assert_allclose(minilm_server.vectors([101, 7592, 102]), text, atol=1e-6)
    for bad in ([[999999999]], [[101, -1]], [[101, 30522]]):
        r = minilm_server.embed(bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_token_id", r.text
        assert minilm_server.embed([[101, 7592, 102]]).status_code == 200  # the server keeps serving


def test_openai_client_extensions(minilm_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused")
    r = client.embeddings.create(model=MODEL, input=[LONG], user="u-1", encoding_format="float",
                                 extra_body={"truncate": True, "normalize": False, "priority": "batch"})
    v = np.asarray(r.data[0].embedding)
    assert abs(np.linalg.norm(v) - 1.0) > 1e-3  # normalize: false gives the raw mean-pooled vector
    np.testing.assert_allclose(v / np.linalg.norm(v), minilm_server.vectors(LONG)[0], atol=1e-5)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=[LONG], extra_body={"truncate": False})


def test_chunk_mean_and_chunks(minilm_server):
    short = minilm_server.vectors("just a short sentence")
    np.testing.assert_allclose(minilm_server.vectors("just a short sentence", long_input="chunk_mean"), short, atol=1e-6)
    r = minilm_server.embed(["tiny", LONG], long_input="chunks")
    assert r.status_code == 200, r.text
    body = r.json()
    tiny, long_item = body["data"]
    assert len(tiny["chunks"]) == 1 and tiny["chunks"][0]["tokens"] == [0, 1]
    chunks = long_item["chunks"]
    assert len(chunks) >= 3
    spans = [c["tokens"] for c in chunks]
    assert spans[0][0] == 0 and all(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # windows overlap
    assert all(e - s <= 254 for s, e in spans)
    assert LONG[chunks[1]["chars"][0]:chunks[1]["chars"][1]].split()[0] in LONG.split()
    # the window vectors are what the window's text embeds to on its own
    c1 = LONG[chunks[1]["chars"][0]:chunks[1]["chars"][1]]
    assert cosine_rows(minilm_server.vectors(c1), np.asarray([chunks[1]["embedding"]]))[0] > 0.9999
    w = np.asarray([e - s for s, e in spans], dtype=np.float64)
    mean = (np.asarray([c["embedding"] for c in chunks]) * w[:, None]).sum(0) / w.sum()
    np.testing.assert_allclose(long_item["embedding"], mean / np.linalg.norm(mean), atol=1e-5)
    mean_only = minilm_server.vectors(LONG, long_input="chunk_mean")[0]
    np.testing.assert_allclose(mean_only, long_item["embedding"], atol=1e-5)
    assert body["usage"]["prompt_tokens"] == 3 + sum(e - s + 2 for s, e in spans)
    tei = post(minilm_server, "/embed", {"inputs": LONG, "long_input": "chunk_mean"})
    np.testing.assert_allclose(tei.json()[0], mean_only, atol=1e-5)
    assert post(minilm_server, "/embed", {"inputs": LONG, "long_input": "chunks"}).status_code == 400
