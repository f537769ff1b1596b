"""API edges on the real server (issue 16): chunk offsets with a prompt, prompts with token ids,
errors raised below the routes (HTTP parsing, body framing, media type) in the API's JSON shape
without costing a neighbour its response, ties in rerank, and which input an error names."""
from __future__ import annotations

import gzip
import socket

import httpx
import orjson
import pytest

from reliability import openai_error, tei_error

LONG = " ".join(f"word{i}" for i in range(400))  # 3,089 characters, 1,128 tokens with MiniLM


def windows(srv, text: str, **extra: object) -> list[dict]:
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": text, "long_input": "chunks", **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["chunks"]


def test_chunk_offsets_stay_in_the_inputs_coordinates_with_a_prompt(minilm_server):
    own = httpx.post(minilm_server.url + "/tokenize", json={"inputs": LONG, "add_special_tokens": False}).json()[0]
    assert len(LONG) == 3089 and len(own) == 1128
    plain = windows(minilm_server, LONG)
    prompted = windows(minilm_server, LONG, prompt="query: ")
    for chunks in (plain, prompted):
        assert chunks[0]["tokens"][0] == 0 and chunks[0]["chars"][0] == 0
        assert chunks[-1]["tokens"][1] == 1128 and chunks[-1]["chars"][1] == 3089
        for c in chunks:  # every window's characters begin and end on one of its own tokens
            t0, t1 = c["tokens"]
            assert c["chars"] == [own[t0]["start"], own[t1 - 1]["stop"]], c["tokens"]
    # The prompt ("query", ":") takes two tokens of the first window only; overlaps do not change.
    assert prompted[0]["tokens"][1] == plain[0]["tokens"][1] - 2
    overlap = [a["tokens"][1] - b["tokens"][0] for a, b in zip(plain, plain[1:])]
    assert [a["tokens"][1] - b["tokens"][0] for a, b in zip(prompted, prompted[1:])] == overlap


def test_prompt_with_token_ids_is_a_400(minilm_server):
    for field, value in (("prompt", "query: "), ("prompt_name", "query")):
        for ids in ([101, 7592, 102], [[101, 7592, 102]]):
            r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": ids, field: value}, timeout=60)
            err = openai_error(r, 400, field, "invalid_value")
            assert "token ids" in err["message"]
            r = httpx.post(minilm_server.url + "/embed", json={"inputs": ids, field: value}, timeout=60)
            assert "token ids" in tei_error(r, 400)["error"]
    assert minilm_server.embed([101, 7592, 102]).status_code == 200  # without a prompt: embedded as given


def test_out_of_vocabulary_id_names_its_input(minilm_server):
    r = minilm_server.embed([[101, 7592, 102], [101, 10**7, 102]])
    assert openai_error(r, 400, "input[1]", "invalid_token_id")
    r = minilm_server.embed([101, 10**7, 102])  # one bare sequence: the field itself
    assert openai_error(r, 400, "input", "invalid_token_id")
    r = minilm_server.embed([[101, 102], [101, 10**7] + [7592] * 600], long_input="chunk_mean")
    assert openai_error(r, 400, "input[1]", "invalid_token_id")


def test_error_messages_name_the_item_their_param_names(minilm_server):
    """The message starts with what ``param`` says (a new user found "input 0 has token id -1"
    under param "input", and "input[0][0]" in a message under "input[0]"); ``param`` names the input, the message
    the position of the id at fault in it; integers past 64 bits,
    which the JSON parser reads as floats, are out of range rather than "a number"."""
    big = 10**23
    cases = [
        ({"input": [-1, 5]}, "input", "invalid_token_id", "input has token id -1 at position 0"),
        ({"input": [[101, 102], [101, 7592, -1]]}, "input[1]", "invalid_token_id", "input[1] has token id -1 at position 2"),
        # one bare list of ids is one input, "input" (issue 39: it was "input[1]", read as a second input)
        ({"input": [["a", "b"]]}, "input[0]", "invalid_type", "input[0] has a string at position 0"),
        ({"input": [101, "x"]}, "input", "invalid_type", "input has a string at position 1"),
        ({"input": [101, 7592, 10**7]}, "input", "invalid_token_id", "input has token id 10000000 at position 2"),
        ({"input": [101, 2**40]}, "input", "invalid_token_id", "input has token id 1099511627776 at position 1, out of range"),
        ({"input": [big]}, "input", "invalid_token_id", "input has a token id past 64 bits at position 0, out of range"),
        ({"input": [101, 2**64]}, "input", "invalid_token_id", "input has a token id past 64 bits at position 1"),
        ({"input": [[101, big]]}, "input[0]", "invalid_token_id", "at position 1, out of range"),
        ({"input": "a", "dimensions": big}, "dimensions", "invalid_value", "out of range"),
        ({"input": "a", "dimensions": 4.0}, "dimensions", "invalid_type", "must be an integer"),
        ({"input": [1.5]}, "input[0]", "invalid_type", "a token id or a list of token ids; got 1.5, not an integer"),
        ({"input": [101] * 600, "truncate": False}, "input", "context_length_exceeded", "input has 600 tokens"),
        ({"input": ["a", " ".join(["word"] * 600)], "truncate": False}, "input[1]", "context_length_exceeded",
         "input[1] has"),
    ]
    for body, param, code, words in cases:
        r = httpx.post(minilm_server.url + "/v1/embeddings", json=body, timeout=60)
        err = openai_error(r, 400, param, code)
        assert words in err["message"], (body if len(str(body)) < 200 else param, err)
    assert minilm_server.embed([101, 7592, 102]).status_code == 200


def test_rerank_ties_get_identical_scores_in_input_order(minilm_server):
    # Different texts with the same token ids (the model's tokenizer lowercases) are one input.
    docs = ["Hello world", "a guitar on a stage", "hello world", "HELLO WORLD", "a guitar on a stage"]
    r = httpx.post(minilm_server.url + "/v1/rerank", json={"query": "greeting the world", "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    score = {x["index"]: x["relevance_score"] for x in res}
    assert score[0] == score[2] == score[3] and score[1] == score[4]
    order = [x["index"] for x in res]
    assert order.index(0) < order.index(2) < order.index(3) and order.index(1) < order.index(4)
    v = minilm_server.vectors(["Hello world", "x", "hello world"])
    assert (v[0] == v[2]).all()


# ---- errors below the routes: raw HTTP/1.1 on one connection -------------------------------
EMBED = b'{"input": "hi"}'


def post_bytes(path: str, body: bytes, headers: str = "Content-Type: application/json\r\n", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return f"POST {path} HTTP/1.1\r\nHost: t\r\n{headers}Content-Length: {n}\r\n\r\n".encode() + body


def exchange(srv, payload: bytes, half_close: bool = False, timeout: float = 30.0) -> list[tuple[int, dict]]:
    """Send ``payload`` on one connection; every response read until the server closes it."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as s:
        s.sendall(payload)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        n = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), orjson.loads(rest[:n])))
        data = rest[n:]
    return out


def test_http_level_errors_are_json_in_the_routes_shape(minilm_server):
    cases = [  # (payload, status, code or None for the TEI shape)
        (b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n{}", 400, "invalid_http_request"),
        (b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400,
         "invalid_http_request"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, None),
        (b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 411, "length_required"),
        (post_bytes("/v1/embeddings", EMBED, "Content-Type: text/plain\r\nConnection: close\r\n"), 415,
         "unsupported_media_type"),
        (post_bytes("/v1/embeddings", b"", "Connection: close\r\n", length=10**9), 413, "payload_too_large"),
        (post_bytes("/embed", b"{}", "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n"), 415, None),
        (post_bytes("/v1/embeddings", gzip.compress(EMBED), "Content-Encoding: gzip\r\nConnection: close\r\n"), 415,
         "unsupported_media_type"),
    ]
    for payload, status, code in cases:
        (got, body), = exchange(minilm_server, payload)
        assert got == status, (payload[:60], body)
        if code is None:
            assert isinstance(body["error"], str) and body["error_type"] == "Validation"
        else:
            assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error", body
    # JSON with a charset, a +json type, or no Content-Type at all is read as JSON.
    for headers in ("Content-Type: application/json; charset=utf-8\r\n", "Content-Type: application/vnd.x+json\r\n", "",
                    "Content-Encoding: identity\r\n"):
        (got, body), = exchange(minilm_server, post_bytes("/v1/embeddings", EMBED, headers + "Connection: close\r\n"))
        assert got == 200, body


@pytest.mark.parametrize("bad", ["header", "short_body", "cut_head"])
def test_a_bad_request_never_costs_its_neighbour_the_response(minilm_server, bad):
    good = post_bytes("/v1/embeddings", EMBED)
    tail = {"header": b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n{}",
            "short_body": post_bytes("/v1/embeddings", EMBED, length=100),  # then the client stops sending
            "cut_head": b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Le"}[bad]
    replies = exchange(minilm_server, good + good + tail, half_close=True)
    assert [status for status, _ in replies] == [200, 200, 400], replies
    assert len(replies[0][1]["data"][0]["embedding"]) == 384
    code = replies[2][1]["error"]["code"]
    assert code == {"header": "invalid_http_request", "short_body": "incomplete_body", "cut_head": "incomplete_request"}[bad]
    assert minilm_server.embed("still alive").status_code == 200


def test_cosine_scores_stay_in_range(minilm_server):
    """STSb dev row 1469: two sentences differing only in case; the cosine of their (equal)
    vectors came out 1.0000000000000002 before it was clamped to the documented [-1, 1]."""
    from helpers import read_sts

    s1, s2, _ = read_sts("dev")
    assert s1[1469].lower() == s2[1469].lower() and s1[1469] != s2[1469]
    rows = [1469, *range(0, 60)]
    r = httpx.post(minilm_server.url + "/v1/score", json={"text_1": [s1[i] for i in rows], "text_2": [s2[i] for i in rows]},
                   timeout=120)
    assert r.status_code == 200, r.text
    scores = [d["score"] for d in r.json()["data"]]
    assert all(-1.0 <= s <= 1.0 for s in scores) and scores[0] == 1.0


def test_unknown_model_name_is_quoted_cut(minilm_server):
    """A 404's message quotes an unknown model name cut to 200 characters (a 1 MB name came back
    whole), on POST routes and on ``GET /v1/models/{model}``."""
    name = "m" * 1_000_000
    r = minilm_server.embed("hi", model=name)
    err = openai_error(r, 404, "model", "model_not_found")
    assert f"The model '{'m' * 199}…' does not exist" in err["message"] and len(r.content) < 1_000, err
    r = httpx.get(minilm_server.url + "/v1/models/" + "m" * 50_000, timeout=60)
    assert r.status_code == 404 and len(r.content) < 1_000, r.text[:300]
    assert minilm_server.embed("hi", model="nope").json()["error"]["message"].startswith("The model 'nope' does not exist")


def test_unknown_model_is_404_on_every_post_route(minilm_server):
    """A single-model server refuses a name it does not serve on the TEI routes too (they have no
    ``model`` field in TEI, but docs/api.md accepts one on every POST route)."""
    bodies = {"/v1/embeddings": {"input": "hi"}, "/v1/rerank": {"query": "q", "documents": ["a"]},
              "/v1/score": {"text_1": "a", "text_2": "b"}, "/embed": {"inputs": "hi"},
              "/rerank": {"query": "q", "texts": ["a"]}, "/tokenize": {"inputs": "hi"}}
    for path, body in bodies.items():
        r = httpx.post(minilm_server.url + path, json={**body, "model": "nope"}, timeout=60)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
        if path.startswith("/v1/"):
            assert r.json()["error"]["code"] == "model_not_found"
        else:
            assert r.json()["error_type"] == "Validation"
        assert httpx.post(minilm_server.url + path, json=body, timeout=60).status_code == 200, path


def test_a_body_for_another_api_names_the_field_it_sent(minilm_server):
    # TEI's {"inputs"} posted to OpenAI's route and the reverse, Cohere's {"documents"} to TEI's
    # /rerank and the reverse: each was told only "'input' is required" (new-user run, 2026-12-05).
    url = minilm_server.url
    cases = [("/v1/embeddings", {"inputs": "a"}, "input", "'input' is required; this body has 'inputs', TEI's name "
              "for it (POST /embed)"),
             ("/embed", {"input": "a"}, "inputs", "'inputs' is required; this body has 'input', the OpenAI API's name "
              "for it (POST /v1/embeddings)"),
             ("/v1/rerank", {"query": "q", "texts": ["a"]}, "documents", "'documents' is required; this body has "
              "'texts', TEI's name for it (POST /rerank)"),
             ("/rerank", {"query": "q", "documents": ["a"]}, "texts", "'texts' is required; this body has "
              "'documents', the Cohere and Jina name for it (POST /v1/rerank)")]
    for path, body, param, message in cases:
        r = httpx.post(url + path, json=body, timeout=60)
        if path.startswith("/v1/"):
            assert openai_error(r, 400, param, "missing_required_parameter")["message"] == message
        else:
            assert tei_error(r, 400)["error"] == message
    # the field the route takes wins when both are sent; the next request is served as usual
    assert httpx.post(url + "/v1/embeddings", json={"input": "a", "inputs": "b"}, timeout=60).status_code == 200
    assert httpx.post(url + "/rerank", json={"query": "q", "texts": ["a"], "documents": ["b"]}, timeout=60).status_code == 200
