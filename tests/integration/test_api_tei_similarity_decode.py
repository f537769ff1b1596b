"""TEI's ``/similarity`` and ``/decode`` on the real server, against sentence-transformers' cosine
similarity and the model's own (transformers) tokenizer; bad bodies get TEI-shaped 400s that name
the field at fault, and the next request is served."""
from __future__ import annotations

import httpx
import numpy as np

from reliability import tei_error

SOURCE = "A man is playing a guitar."
SENTENCES = ["Someone plays an instrument.", "A woman is slicing an onion.", "A man is playing a guitar.",
             "The stock market fell sharply today."]


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_similarity_is_sentence_transformers_cosine(minilm_server, st_minilm):
    from sentence_transformers.util import cos_sim

    r = post(minilm_server, "/similarity", {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json())
    v = st_minilm.encode([SOURCE, *SENTENCES], convert_to_tensor=True)
    want = cos_sim(v[:1], v[1:]).numpy()[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got.shape == (4,) and abs(got[2] - 1) < 1e-6 and got[0] > got[1] and got[0] > got[3]
    # `parameters` as TEI spells them; null parameters are no parameters
    r = post(minilm_server, "/similarity", {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES[:1]},
                                            "parameters": {"truncate": True, "truncation_direction": "Right"}})
    assert r.status_code == 200 and abs(r.json()[0] - want[0]) < 1e-5, r.text
    r = post(minilm_server, "/similarity", {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES[:1]},
                                            "parameters": None})
    assert r.status_code == 200, r.text


def test_similarity_errors_name_the_field(minilm_server):
    long = " ".join(["word"] * 600)
    cases = [
        ({}, "'inputs'"),
        ({"inputs": ["a", "b"]}, "'inputs' must be an object"),
        ({"inputs": {"sentences": ["a"]}}, "inputs.source_sentence"),
        ({"inputs": {"source_sentence": "", "sentences": ["a"]}}, "inputs.source_sentence"),
        ({"inputs": {"source_sentence": "a", "sentences": []}}, "inputs.sentences"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b", ""]}}, "inputs.sentences[1]"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b", long]}, "parameters": {"truncate": False}},
         "inputs.sentences[1] has"),
        ({"inputs": {"source_sentence": long, "sentences": ["b"]}, "parameters": {"truncate": False}},
         "inputs.source_sentence has"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": "x"}, "'parameters'"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"truncation_direction": "up"}},
         "truncation_direction"),
    ]
    for body, words in cases:
        err = tei_error(post(minilm_server, "/similarity", body), 400)
        assert words in err["error"], (body.get("parameters"), err)
    r = post(minilm_server, "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}})
    assert r.status_code == 200 and len(r.json()) == 1


def test_decode_is_the_tokenizers_decode(minilm_server, st_minilm):
    tok = st_minilm.tokenizer  # transformers' tokenizer of the same tokenizer.json: the reference
    texts = ["Hello world!", "A man is playing a guitar."]
    ids = [tok(t)["input_ids"] for t in texts]
    r = post(minilm_server, "/decode", {"ids": ids})
    assert r.status_code == 200, r.text
    assert r.json() == [tok.decode(i, skip_special_tokens=True) for i in ids] == ["hello world!", "a man is playing a guitar."]
    r = post(minilm_server, "/decode", {"ids": ids[0], "skip_special_tokens": False})  # one bare list: one string
    assert r.json() == [tok.decode(ids[0], skip_special_tokens=False)] == ["[CLS] hello world! [SEP]"], r.text
    # /tokenize then /decode round trip
    toks = post(minilm_server, "/tokenize", {"inputs": texts[1]}).json()[0]
    assert post(minilm_server, "/decode", {"ids": [t["id"] for t in toks]}).json() == ["a man is playing a guitar."]


def test_decode_errors_name_the_sequence(minilm_server):
    cases = [
        ({}, "'ids'"),
        ({"ids": "hello"}, "not text"),
        ({"ids": ["hello"]}, "not text"),
        ({"ids": []}, "empty"),
        ({"ids": [[101], []]}, "ids[1]"),
        ({"ids": [[101, 102], [101, 30522]]}, "ids[1] has token id 30522 at position 1"),
        ({"ids": [-5]}, "ids has token id -5 at position 0"),
        ({"ids": [101], "skip_special_tokens": "yes"}, "skip_special_tokens"),
    ]
    for body, words in cases:
        err = tei_error(post(minilm_server, "/decode", body), 400)
        assert words in err["error"], (body, err)
    assert post(minilm_server, "/decode", {"ids": [7592]}).json() == ["hello"]


def test_decode_errors_never_offer_text(minilm_server):
    """/decode refuses text, so a wrong shape of ``ids`` is answered with what /decode takes (token ids),
    not with the text-input message of the embedding routes ("must be a string, ...")."""
    for body, param in [({"ids": 5}, "ids"), ({"ids": {"a": 1}}, "ids"), ({"ids": [1.5]}, "ids[0]"),
                        ({"ids": [True]}, "ids[0]"), ({"ids": [{"a": 1}]}, "ids[0]"), ({"ids": [[1], 2]}, "ids[1]")]:
        err = tei_error(post(minilm_server, "/decode", body), 400)
        assert "token id" in err["error"] and "string" not in err["error"], (body, err)
        assert err["error"].startswith(param if param != "ids" else "'ids'"), (body, err)
