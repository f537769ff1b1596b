"""Cohere v2 ``POST /v2/embed`` (and ``POST /v2/rerank``) and the compact encodings (int8, uint8, binary, ubinary, float16) on the
real server, through the official ``cohere`` client (ClientV2) and httpx; binary / ubinary against
sentence-transformers' ``quantize_embeddings``; the STSb Spearman each encoding keeps (docs/api.md).

The table of docs/api.md is printed by
``PYTHONPATH=$PWD python -m pytest -q -s tests/integration/test_api_cohere.py -k stsb``."""
from __future__ import annotations

import base64
import json
import os

import httpx
import numpy as np
import pytest
from scipy.stats import spearmanr

from helpers import BouquetProcess, cosine_rows, read_sts

cohere = pytest.importorskip("cohere")
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
TEXTS = ["A man is playing a guitar.", "Vector databases store compact vectors.", "Ein Hund läuft im Park.",
         "The weather is lovely today and the sun is out."]
# 'START' must keep a different part than 'END': distinct halves, ~700 tokens in all (MiniLM: 256)
LONG = "Cats sleep on warm windowsills all afternoon. " * 40 + "Rockets launch from the coast at dawn. " * 40
KEY = "cohere-test-key"


def v2(srv, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(srv.url + "/v2/embed", json={"model": MODEL, "input_type": "search_document", **body},
                      headers=headers, timeout=300)


def int8_reference(f: np.ndarray) -> np.ndarray:
    """docs/api.md's int8: round(127 · x / ‖x‖₂), written here independently of bouquet's code."""
    f = np.asarray(f, dtype=np.float64)
    return np.clip(np.rint(127 * f / np.linalg.norm(f, axis=1, keepdims=True)), -127, 127).astype(np.int8)


def test_cohere_client_every_embedding_type(minilm_server, st_minilm):
    from sentence_transformers.util.quantization import quantize_embeddings

    co = cohere.ClientV2(base_url=minilm_server.url, api_key="unused")
    r = co.embed(model=MODEL, texts=TEXTS, input_type="search_query", embedding_types=TYPES)
    e = r.embeddings
    f = np.asarray(e.float_, dtype=np.float32)
    assert f.shape == (4, 384) and r.texts == TEXTS and isinstance(r.id, str) and r.id
    np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1, atol=1e-5)
    assert cosine_rows(f, st_minilm.encode(TEXTS)).min() > 0.9999
    np.testing.assert_array_equal(f, minilm_server.vectors(TEXTS))  # the same vectors as /v1/embeddings
    assert r.meta.billed_units.input_tokens == minilm_server.embed(TEXTS).json()["usage"]["prompt_tokens"]
    np.testing.assert_array_equal(np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in e.base64]), f)
    # binary / ubinary: bit for bit what sentence-transformers makes of the same float vectors
    for name, got in (("binary", e.binary), ("ubinary", e.ubinary)):
        ref = quantize_embeddings(f, precision=name)
        assert np.asarray(got).shape == (4, 48)
        np.testing.assert_array_equal(np.asarray(got), ref.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(e.int8), int8_reference(f))
    np.testing.assert_array_equal(np.asarray(e.uint8), int8_reference(f).astype(np.int64) + 128)
    assert np.abs(np.asarray(e.int8)).max() > 20  # not all rounded to 0: the scale is in use
    only = co.embed(model=MODEL, texts=TEXTS[:1], input_type="clustering")  # embedding_types defaults to float
    assert only.embeddings.int8 is None and np.allclose(only.embeddings.float_[0], f[0], atol=1e-6)


def test_compact_codes_do_not_depend_on_the_other_texts(minilm_server):
    """One text's int8/uint8/binary codes are the same alone, first, last, or beside a long text;
    sentence-transformers' calibrated int8 (ranges from the batch itself) is not, which is why
    the server uses a fixed scale."""
    from sentence_transformers.util.quantization import quantize_embeddings

    text = TEXTS[1]
    batches = [[text], [text, *TEXTS[2:]], [TEXTS[0], LONG, TEXTS[3], text], [*TEXTS, LONG, "x"]]
    codes = []
    for batch in batches:
        r = v2(minilm_server, {"texts": batch, "embedding_types": ["int8", "uint8", "binary", "ubinary"]})
        assert r.status_code == 200, r.text
        codes.append({t: rows[batch.index(text)] for t, rows in r.json()["embeddings"].items()})
    assert all(c == codes[0] for c in codes[1:])
    f1, f2 = minilm_server.vectors(batches[1]), minilm_server.vectors(batches[3])
    st1, st2 = quantize_embeddings(f1, precision="int8"), quantize_embeddings(f2, precision="int8")
    assert not np.array_equal(st1[0], st2[batches[3].index(text)])


def test_v1_encoding_formats_extension(minilm_server):
    from sentence_transformers.util.quantization import quantize_embeddings

    body = {"model": MODEL, "texts": TEXTS, "embedding_types": ["int8", "uint8", "binary", "ubinary"]}
    cohere_codes = v2(minilm_server, body).json()["embeddings"]
    f = minilm_server.vectors(TEXTS)
    for fmt in ("int8", "uint8", "binary", "ubinary"):
        got = [d["embedding"] for d in minilm_server.embed(TEXTS, encoding_format=fmt).json()["data"]]
        assert got == cohere_codes[fmt], fmt
    half = [d["embedding"] for d in minilm_server.embed(TEXTS, encoding_format="float16").json()["data"]]
    h = np.stack([np.frombuffer(base64.b64decode(s), "<f2") for s in half])
    assert h.dtype == np.float16 and h.shape == (4, 384)
    np.testing.assert_array_equal(h, f.astype(np.float16))
    # int8 codes scale each row to unit length first: the same codes for unnormalized vectors
    raw = [d["embedding"] for d in minilm_server.embed(TEXTS, encoding_format="int8", normalize=False).json()["data"]]
    assert raw == cohere_codes["int8"]
    # binary of a Matryoshka size: ceil(100 / 8) bytes, the bits of the truncated vector
    short = minilm_server.embed(TEXTS, encoding_format="ubinary", dimensions=100).json()["data"]
    ref = quantize_embeddings(minilm_server.vectors(TEXTS, dimensions=100), precision="ubinary")
    np.testing.assert_array_equal(np.asarray([d["embedding"] for d in short]), ref.astype(np.int64))
    assert ref.shape == (4, 13)
    # chunks carry the same encoding as their input's vector
    r = minilm_server.embed([LONG], long_input="chunks", encoding_format="binary").json()["data"][0]
    assert len(r["embedding"]) == 48 and all(len(c["embedding"]) == 48 for c in r["chunks"]) and len(r["chunks"]) > 1
    for bad in ("int4", "", "BINARY", 8):
        r = minilm_server.embed(TEXTS, encoding_format=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format", (bad, r.text)
    openai = pytest.importorskip("openai")  # the OpenAI client asks base64 by default and still gets floats
    out = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused").embeddings.create(model=MODEL, input=TEXTS)
    np.testing.assert_allclose(np.asarray([d.embedding for d in out.data]), f, atol=1e-7)


def test_truncate_start_end_none(minilm_server):
    co = cohere.ClientV2(base_url=minilm_server.url, api_key="unused")
    end = co.embed(model=MODEL, texts=[LONG], input_type="search_document", truncate="END").embeddings.float_
    start = co.embed(model=MODEL, texts=[LONG], input_type="search_document", truncate="START").embeddings.float_
    default = co.embed(model=MODEL, texts=[LONG], input_type="search_document").embeddings.float_
    np.testing.assert_allclose(end, minilm_server.vectors([LONG], truncation_side="right"), atol=1e-6)
    np.testing.assert_allclose(start, minilm_server.vectors([LONG], truncation_side="left"), atol=1e-6)
    np.testing.assert_allclose(default, end, atol=1e-6)  # the server truncates by default, at the end
    # END keeps the cats (the start), START the rockets (the end)
    cats, rockets = minilm_server.vectors(["Cats sleep on warm windowsills.", "Rockets launch from the coast."])
    assert float(np.dot(end[0], cats)) > float(np.dot(end[0], rockets))
    assert float(np.dot(start[0], rockets)) > float(np.dot(start[0], cats))
    with pytest.raises(cohere.BadRequestError) as e:
        co.embed(model=MODEL, texts=["short", LONG], input_type="search_document", truncate="NONE")
    assert "texts[1]" in e.value.body["message"] and "256" in e.value.body["message"]


BAD = [  # (body change, status, word the message must contain)
    ({"model": None}, 400, "model"), ({"model": "embed-v4.0"}, 404, "embed-v4.0"),
    ({"texts": None}, 400, "texts"), ({"texts": "one string"}, 400, "texts"), ({"texts": []}, 400, "texts"),
    ({"texts": ["a", ""]}, 400, "texts[1]"), ({"texts": ["a", 3]}, 400, "texts[1]"),
    ({"input_type": None}, 400, "input_type"), ({"input_type": "query"}, 400, "input_type"),
    ({"input_type": "image"}, 400, "image"), ({"embedding_types": "float"}, 400, "embedding_types"),
    ({"embedding_types": []}, 400, "embedding_types"), ({"embedding_types": ["float", "fp16"]}, 400, "embedding_types[1]"),
    ({"truncate": "end"}, 400, "truncate"), ({"truncate": True}, 400, "truncate"),
    ({"output_dimension": 0}, 400, "output_dimension"), ({"output_dimension": 385}, 400, "output_dimension"),
    ({"output_dimension": "64"}, 400, "output_dimension"), ({"images": ["data:image/png;base64,AA=="]}, 400, "images"),
    ({"inputs": [{"content": []}]}, 400, "inputs"), ({"max_tokens": 16}, 400, "max_tokens"), ({"priority": 1}, 400, "priority"),
]


@pytest.mark.parametrize("change,status,word", BAD, ids=[json.dumps(b[0])[:40] for b in BAD])
def test_errors_in_cohere_shape(minilm_server, change, status, word):
    body = {"model": MODEL, "texts": ["a"], "input_type": "search_document", **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(minilm_server.url + "/v2/embed", json=body, timeout=60)
    assert r.status_code == status and set(r.json()) == {"message"} and word in r.json()["message"], r.text


def test_route_errors_openapi_and_sdk_exceptions(minilm_server):
    for content in (b"{", b"[]", b'{"texts": ["a"],}'):
        r = httpx.post(minilm_server.url + "/v2/embed", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()) == {"message"}, r.text
    r = httpx.get(minilm_server.url + "/v2/embed")
    assert r.status_code == 405 and set(r.json()) == {"message"}
    r = httpx.post(minilm_server.url + "/v2/nothing", json={})
    assert r.status_code == 404 and set(r.json()) == {"message"}
    op = httpx.get(minilm_server.url + "/openapi.json").json()["paths"]["/v2/embed"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["required"]) == {"model", "texts", "input_type"}
    assert schema["properties"]["embedding_types"]["items"]["enum"] == TYPES
    assert op["responses"]["400"]["content"]["application/json"]["schema"]["required"] == ["message"]
    co = cohere.ClientV2(base_url=minilm_server.url, api_key="unused")
    with pytest.raises(cohere.NotFoundError):
        co.embed(model="embed-v4.0", texts=["a"], input_type="search_query")


def test_cohere_client_rerank_v2(minilm_server):
    """``ClientV2.rerank`` posts to /v2/rerank: the same ranking and scores as /v1/rerank, in Cohere's v2
    shape; fields bouquet does not implement → 400 (the SDK's BadRequestError), in Cohere's error shape."""
    docs = ["A man is playing a guitar.", "Stocks fell sharply on Monday.", "Someone plays an instrument on stage.",
            "The cat sleeps."]
    query = "a person playing music"
    co = cohere.ClientV2(base_url=minilm_server.url, api_key="unused")
    r = co.rerank(model=MODEL, query=query, documents=docs, top_n=3)
    v1 = httpx.post(minilm_server.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 3},
                    timeout=60).json()
    assert [(x.index, x.relevance_score) for x in r.results] == [(x["index"], x["relevance_score"]) for x in v1["results"]]
    assert [x.index for x in r.results][:2] == [2, 0] and isinstance(r.id, str) and r.id
    assert r.meta.billed_units.input_tokens == v1["usage"]["prompt_tokens"] > 0
    with pytest.raises(cohere.BadRequestError):
        co.rerank(model=MODEL, query=query, documents=docs, max_tokens_per_doc=64)
    for extra in ({"relevant_spans": {"enabled": True}}, {"priority": 1}, {"model": None}):
        body = {k: v for k, v in {"model": MODEL, "query": query, "documents": docs, **extra}.items() if v is not None}
        e = httpx.post(minilm_server.url + "/v2/rerank", json=body, timeout=60)
        assert e.status_code == 400 and set(e.json()) == {"message"}, e.text
        assert next(iter(k for k in extra)) in e.json()["message"], e.text
    op = httpx.get(minilm_server.url + "/openapi.json").json()["paths"]["/v2/rerank"]["post"]
    assert set(op["requestBody"]["content"]["application/json"]["schema"]["required"]) == {"model", "query", "documents"}


@pytest.fixture(scope="module")
def prompted_server(tmp_path_factory):
    """MiniLM (files linked) declaring sentence-transformers prompts and Matryoshka sizes, behind an API key."""
    from bouquet.modelspec import resolve_model_path

    src = resolve_model_path(None)
    out = tmp_path_factory.mktemp("prompted")
    for p in src.rglob("*"):
        if p.is_file() and str(p.relative_to(src)) not in ("config_sentence_transformers.json", "config.json"):
            (out / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(p, out / p.relative_to(src))
    prompts = {"query": "query: ", "passage": "passage: ", "Clustering": "cluster: "}
    (out / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    cfg = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "bouquet": {"matryoshka_dimensions": [128, 256]}}))
    srv = BouquetProcess("--model", str(out), "--served-model-name", "prompted", "--api-key", KEY)
    yield srv
    srv.stop()


def test_input_type_maps_to_the_models_prompts(prompted_server):
    co = cohere.ClientV2(base_url=prompted_server.url, api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}

    def v1(**extra) -> np.ndarray:
        r = httpx.post(prompted_server.url + "/v1/embeddings", json={"input": TEXTS, **extra}, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)

    def v2f(input_type: str, **extra) -> np.ndarray:
        return np.asarray(co.embed(model="prompted", texts=TEXTS, input_type=input_type, **extra).embeddings.float_)

    expected = {"search_query": v1(prompt_name="query"), "search_document": v1(prompt_name="passage"),
                "clustering": v1(prompt_name="Clustering"), "classification": v1()}  # no "classification" prompt
    for input_type, ref in expected.items():
        np.testing.assert_allclose(v2f(input_type), ref, atol=1e-6, err_msg=input_type)
    assert not np.allclose(expected["search_query"], expected["classification"], atol=1e-3)  # the prompts matter
    np.testing.assert_allclose(v2f("search_query", output_dimension=128), v1(prompt_name="query", dimensions=128),
                               atol=1e-6)
    with pytest.raises(cohere.BadRequestError) as e:  # a size the model does not declare
        co.embed(model="prompted", texts=TEXTS, input_type="search_query", output_dimension=100)
    assert "output_dimension" in e.value.body["message"] and "[128, 256]" in e.value.body["message"]
    with pytest.raises(cohere.UnauthorizedError) as e:
        cohere.ClientV2(base_url=prompted_server.url, api_key="wrong").embed(
            model="prompted", texts=["a"], input_type="search_query")
    assert set(e.value.body) == {"message"}


# Spearman margins below the float vectors' on STSb test (docs/api.md, "Compact vectors")
MARGINS = {"float16 (cosine)": 0.001, "int8 (cosine)": 0.002, "uint8 − 128 (cosine)": 0.002,
           "binary (Hamming)": 0.02, "ubinary (Hamming)": 0.02}


def stsb_spearman(srv) -> dict[str, float]:
    """Spearman of each encoding's similarity with the STSb test gold scores, through the server."""
    s1, s2, gold = read_sts("test")
    uniq = sorted(set(s1) | set(s2))
    row = {s: i for i, s in enumerate(uniq)}
    a, b = np.asarray([row[s] for s in s1]), np.asarray([row[s] for s in s2])
    got: dict[str, list] = {t: [] for t in TYPES[:-1]}
    for i in range(0, len(uniq), 512):
        r = v2(srv, {"texts": uniq[i:i + 512], "embedding_types": list(got)})
        assert r.status_code == 200, r.text
        for t in got:
            got[t] += r.json()["embeddings"][t]
    e = {t: np.asarray(v) for t, v in got.items()}
    h = e["float"].astype(np.float16).astype(np.float32)  # the server's float16 (test_v1_encoding_formats_extension)

    def rho(sim: np.ndarray) -> float:
        return float(spearmanr(sim, gold).statistic)

    def hamming(bits: np.ndarray) -> np.ndarray:
        packed = bits.astype(np.int8).view(np.uint8)  # binary's int8 and ubinary's uint8 hold the same bits
        return np.unpackbits(packed[a] ^ packed[b], axis=1).sum(1).astype(np.int64)

    return {"float (cosine)": rho(cosine_rows(e["float"][a], e["float"][b])),
            "float16 (cosine)": rho(cosine_rows(h[a], h[b])),
            "int8 (cosine)": rho(cosine_rows(e["int8"][a], e["int8"][b])),
            "uint8 − 128 (cosine)": rho(cosine_rows(e["uint8"][a] - 128, e["uint8"][b] - 128)),
            "uint8 as stored (cosine)": rho(cosine_rows(e["uint8"][a], e["uint8"][b])),
            "binary (Hamming)": rho(-hamming(e["binary"])),
            "ubinary (Hamming)": rho(-hamming(e["ubinary"]))}


@pytest.mark.slow  # ~30 s on 2 CPU cores: 2552 sentences
def test_stsb_spearman_per_encoding(minilm_server):
    res = stsb_spearman(minilm_server)
    full = res["float (cosine)"]
    print("\n| encoding (similarity) | bytes / vector | Spearman × 100 | vs float |\n|---|---|---|---|")
    size = {"float": 1536, "float16": 768, "int8": 384, "uint8": 384, "binary": 48, "ubinary": 48}
    for name, value in res.items():
        print(f"| {name} | {size[name.split()[0]]} | {100 * value:.2f} | {100 * (value - full):+.2f} |")
    assert abs(full - 0.8203) < 0.002  # what sentence-transformers' own vectors score (0.82032)
    for name, margin in MARGINS.items():
        assert res[name] >= full - margin, (name, res[name], full)
    assert res["binary (Hamming)"] == res["ubinary (Hamming)"]
