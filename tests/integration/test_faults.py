"""Issue 8, fault kinds 1-7 and 10 against the real `bouquet serve` (embedded all-MiniLM-L6-v2, CPU).

Each test covers a kind of fault with several inputs, and the reference is sentence-transformers
(or the server's own answer to the simplest form of the same input).
"""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import numpy as np
import pytest

from helpers import cosine_rows
from reliability import decode_b64, openai_error, tei_error

LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 80  # ~1,100 tokens > 256


@pytest.fixture(scope="module")
def ref(st_minilm):
    """sentence-transformers vectors for a text, cached."""
    cache: dict[str, np.ndarray] = {}

    def get(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = st_minilm.encode([text], convert_to_numpy=True)[0]
        return cache[text]

    return get


# ---- 1. empty inputs ------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["", "a"]}, "input[0]"),
    ({"input": ["a", "b", ""]}, "input[2]"),
    ({"input": [[]]}, "input[0]"),
    ({"input": [[101, 102], []]}, "input[1]"),
])
def test_empty_inputs_400_naming_index_then_200(minilm_server, body, param):
    for _ in range(2):  # twice in a row: the first failure leaves nothing behind
        err = openai_error(httpx.post(minilm_server.url + "/v1/embeddings", json=body, timeout=30), 400, param)
        if "[" in param:
            assert param[param.index("["):] in err["message"]
    assert minilm_server.embed(["a"]).status_code == 200


# ---- 2. truncation honoured on every path ------------------------------------------------------
def test_truncation_same_vector_every_path(minilm_server, ref):
    as_str = minilm_server.vectors(LONG)[0]
    as_list = minilm_server.vectors([LONG])[0]
    in_batch = minilm_server.vectors(["short", LONG, "x"])[1]
    explicit = minilm_server.vectors(LONG, truncate=True)[0]
    for v in (as_list, in_batch, explicit):
        assert cosine_rows(v[None], as_str[None])[0] >= 0.99999
    assert cosine_rows(as_str[None], ref(LONG)[None])[0] >= 0.9999  # sentence-transformers cuts at 256 too


def test_truncation_tei_route_same_vector(minilm_server):
    r = httpx.post(minilm_server.url + "/embed", json={"inputs": LONG, "truncate": True}, timeout=60)
    assert r.status_code == 200, r.text
    tei = np.asarray(r.json()[0], dtype=np.float32)
    assert cosine_rows(tei[None], minilm_server.vectors(LONG))[0] >= 0.99999
    body = tei_error(httpx.post(minilm_server.url + "/embed", json={"inputs": [LONG], "truncate": False}, timeout=60), 400)
    assert "256" in body["error"]


@pytest.mark.parametrize("inp", [LONG, [LONG], ["fine", LONG]])
def test_truncation_off_400_states_token_count(minilm_server, st_minilm, inp):
    n = len(st_minilm.tokenizer(LONG)["input_ids"])
    err = openai_error(minilm_server.embed(inp, truncate=False), 400, code="context_length_exceeded")
    assert str(n) in err["message"] and "256" in err["message"], err
    # token ids beyond the limit: same refusal, and the count is stated
    err = openai_error(minilm_server.embed([[101] + [2000] * 300 + [102]], truncate=False), 400)
    assert "302" in err["message"], err


# ---- 3. batching must not change vectors ---------------------------------------------------------
@pytest.mark.parametrize("text", ["cat", "A man is playing a guitar on stage.", "¿Dónde está la estación de tren?"])
def test_alone_vs_with_30_longer_texts(minilm_server, text):
    others = [f"{i} " + "a considerably longer sentence about river banks and mountains " * (1 + i % 5) for i in range(30)]
    alone = minilm_server.vectors(text)
    for pos in (0, 15, 30):
        batch = others[:pos] + [text] + others[pos:]
        together = minilm_server.vectors(batch)[pos]
        assert cosine_rows(alone, together[None])[0] >= 0.99999


# ---- 4. order under concurrency --------------------------------------------------------------
def test_order_under_concurrency(minilm_server, ref):
    words = ["cat", "dog", "bird"]
    refs = np.stack([ref(w) for w in words])
    requests = [words] * 20 + [words[::-1]] * 10 + [[w] * 3 for w in words]
    with cf.ThreadPoolExecutor(len(requests)) as ex:
        replies = list(ex.map(lambda inp: (inp, minilm_server.embed(inp)), requests))
    for inp, r in replies:
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == list(range(len(inp)))
        got = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        # each row is closest to its own input's reference vector, and close to it
        assert [words[j] for j in np.argmax(got @ refs.T, axis=1)] == list(inp)
        assert cosine_rows(got, np.stack([ref(w) for w in inp])).min() >= 0.9999


# ---- 5. encoding formats --------------------------------------------------------------------
@pytest.mark.parametrize("inp", ["pasta", ["one", "two and three", LONG]])
def test_base64_is_exactly_float(minilm_server, inp):
    floats = minilm_server.vectors(inp, encoding_format="float")
    r = minilm_server.embed(inp, encoding_format="base64")
    assert r.status_code == 200
    b64 = np.stack([decode_b64(d["embedding"]) for d in r.json()["data"]])
    np.testing.assert_array_equal(b64, floats)  # orjson writes float32 exactly (shortest round-trip)


@pytest.mark.parametrize("fmt", ["int4", "", "FLOAT", "bits", 5, ["float"]])
def test_unknown_encoding_format_400(minilm_server, fmt):
    openai_error(minilm_server.embed("x", encoding_format=fmt), 400, "encoding_format")


# ---- 6. dimensions (Matryoshka) ---------------------------------------------------------------
@pytest.mark.parametrize("dims", [256, 1, 100, 384])
def test_dimensions_renormalized_prefix(minilm_server, dims):
    texts = ["cat", "a sentence about dogs"]
    full = minilm_server.vectors(texts)
    cut = minilm_server.vectors(texts, dimensions=dims)
    assert cut.shape == (2, dims)
    want = full[:, :dims] / np.linalg.norm(full[:, :dims], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, atol=1e-5)
    b64 = minilm_server.embed(texts, dimensions=dims, encoding_format="base64").json()["data"]
    assert all(decode_b64(d["embedding"]).size == dims for d in b64)


@pytest.mark.parametrize("dims", [0, -1, 385, 10**12, "256", 256.5, True, [256]])
def test_invalid_dimensions_400(minilm_server, dims):
    openai_error(minilm_server.embed("x", dimensions=dims), 400, "dimensions")


# ---- 7. input shapes --------------------------------------------------------------------------
def test_input_shapes_agree(minilm_server, st_minilm):
    text = "token ids and text must agree"
    ids = st_minilm.tokenizer(text)["input_ids"]
    want = minilm_server.vectors(text)
    for form in ([text], ids, [ids], [ids, ids]):
        got = minilm_server.vectors(form)
        assert cosine_rows(got, np.repeat(want, len(got), 0)).min() >= 0.99999, form


@pytest.mark.parametrize("bad", [[30522], [[101, 30522, 102]], [[101, 102], [101, 10**6, 102]], [-1], [2**31], [2**63],
                                 [101, 1.5], [101, "2"], [[101], "x"]])
def test_bad_token_ids_400_server_stays_up(minilm_server, bad):
    openai_error(minilm_server.embed(bad), 400)
    assert minilm_server.embed([[101, 2000, 102]]).status_code == 200


# ---- 10. one failing request never poisons the next ---------------------------------------------
BAD_REQUESTS = [
    {"content": b"{not json"},
    {"content": b"\xff\xfe\x00garbage"},
    {"json": {"input": "x", "model": "no-such-model"}},
    {"json": {"input": [LONG], "truncate": False}},
    {"json": {"input": [[99999999]]}},
    {"json": {"input": ["a"] * 5000}},
    {"json": {"input": "x", "dimensions": 0}},
    {"json": {"input": "x", "normalize": "yes"}},
    {"json": [1, 2, 3]},
]


def test_failure_never_poisons_next(minilm_server, ref):
    good = ["poison check", "second text"]
    want = np.stack([ref(t) for t in good])
    for kw in BAD_REQUESTS:
        r = httpx.post(minilm_server.url + "/v1/embeddings", timeout=60, **kw)
        assert 400 <= r.status_code < 500, (kw, r.status_code, r.text)
        assert cosine_rows(minilm_server.vectors(good), want).min() >= 0.9999


def test_failures_interleaved_with_concurrent_good_requests(minilm_server, ref):
    jobs = [("bad", kw) for kw in BAD_REQUESTS] + [("good", {"json": {"input": [f"text number {i}"]}}) for i in range(12)]

    def send(job):
        kind, kw = job
        return kind, kw, httpx.post(minilm_server.url + "/v1/embeddings", timeout=120, **kw)

    with cf.ThreadPoolExecutor(8) as ex:
        for kind, kw, r in ex.map(send, jobs):
            if kind == "bad":
                assert 400 <= r.status_code < 500, r.text
            else:
                assert r.status_code == 200, r.text
                got = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
                assert cosine_rows(got[None], ref(kw["json"]["input"][0])[None])[0] >= 0.9999
