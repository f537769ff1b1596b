"""Foundation: the real `bouquet serve` (gateway → gRPC → packed engine) on the embedded default
model, checked against sentence-transformers on the STS Benchmark."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from helpers import cosine_rows, read_sts


@pytest.fixture(scope="module")
def sts_dev(minilm_server, st_minilm):
    s1, s2, gold = read_sts("dev")
    sents = s1 + s2
    ours = np.concatenate([minilm_server.vectors(sents[i:i + 256]) for i in range(0, len(sents), 256)])
    ref = st_minilm.encode(sents, batch_size=64, convert_to_numpy=True)
    return s1, s2, gold, ours, ref


def test_sts_dev_vectors_match_sentence_transformers(sts_dev):
    s1, s2, gold, ours, ref = sts_dev
    assert ours.shape == ref.shape == (2 * len(s1), 384)
    cos = cosine_rows(ours, ref)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.9999, f"sentence {worst}: cosine {cos[worst]}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # model's Normalize module


def test_sts_dev_spearman(sts_dev):
    s1, s2, gold, ours, ref = sts_dev
    n = len(s1)
    rho = spearmanr(cosine_rows(ours[:n], ours[n:]), gold).statistic
    rho_ref = spearmanr(cosine_rows(ref[:n], ref[n:]), gold).statistic
    assert abs(rho - 0.86716) <= 0.0005, rho
    assert abs(rho - rho_ref) <= 0.0005, (rho, rho_ref)


def test_openai_client_base64_and_float(minilm_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused")
    texts = ["The cat sits outside.", "A man is playing guitar.", "pasta"]
    default = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)  # base64 on the wire
    floats = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts, encoding_format="float")
    a = np.asarray([d.embedding for d in default.data], dtype=np.float32)
    b = np.asarray([d.embedding for d in floats.data], dtype=np.float32)
    assert a.shape == (3, 384)
    np.testing.assert_array_equal(a, b)
    assert [d.index for d in default.data] == [0, 1, 2]
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    single = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="pasta", encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, b[2], atol=1e-6)


def test_alone_equals_in_mixed_batch_and_order(minilm_server):
    s1, s2, _ = read_sts("test")
    rng = np.random.default_rng(0)
    pool = s1 + s2
    texts = [pool[i] for i in rng.choice(len(pool), 63, replace=False)]
    texts.insert(17, " ".join(pool[:40]))  # one long text (truncated to 256 tokens)
    batch = minilm_server.vectors(texts)
    for i in (0, 17, 40, 63):
        alone = minilm_server.vectors([texts[i]])
        assert cosine_rows(alone, batch[i:i + 1])[0] >= 0.99999
    # data[i] belongs to input[i]: each row is closest to its own text's solo vector
    solos = np.concatenate([minilm_server.vectors(t) for t in texts[:8]])
    sims = solos @ batch[:8].T
    assert (np.argmax(sims, axis=1) == np.arange(8)).all()


def test_usage_counts_embedded_tokens(minilm_server, st_minilm):
    texts = ["hello world", "a " * 1000]
    r = minilm_server.embed(texts).json()
    expected = len(st_minilm.tokenizer("hello world")["input_ids"]) + 256  # second text truncated to max_seq_length
    assert r["usage"] == {"prompt_tokens": expected, "total_tokens": expected}


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ["a", "", "b"]}, "input[1]"),
    ({"input": ""}, "input"),
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": ["a", 3]}, "input[1]"),
    ({"input": [None]}, "input[0]"),
    ({"input": "a", "encoding_format": "int4"}, "encoding_format"),
])
def test_bad_input_is_400_openai_shape_then_next_request_works(minilm_server, body, param):
    import httpx

    r = httpx.post(minilm_server.url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    if param.startswith("input["):
        assert param[len("input"):] in err["message"]  # names the index
    assert minilm_server.embed(["still fine"]).status_code == 200


def test_invalid_json_and_unknown_model(minilm_server):
    import httpx

    r = httpx.post(minilm_server.url + "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(minilm_server.url + "/v1/embeddings", content=b'{"input": "caf\xe9"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert r.json()["error"]["message"] == "request body is not valid UTF-8: byte 0xe9 at offset 14"
    r = minilm_server.embed("x", model="gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(minilm_server.url + "/v1/models")
    assert r.json()["data"][0]["id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert minilm_server.embed("x").status_code == 200
