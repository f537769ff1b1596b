"""Issue 8, kind 11 and security: payload limits, request limits, model names, API key, weights.

One module-scoped server runs with a raised body limit, a low input limit and an API key, so the
configured limits (not only the defaults) are what is tested.
"""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from helpers import BouquetProcess, free_port
from reliability import openai_error, tei_error

from bouquet.config import ServeConfig

KEY = "s3cret-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
RAISED = 8 * 1024 * 1024
DEFAULT = ServeConfig().request_bytes_limit  # derived from the default --max-request-tokens: 4,325,376
TOKENS = 64 * 256  # the strict server's --max-request-tokens: 64 inputs of all-MiniLM-L6-v2's 256 tokens
OUTPUT = 1 << 20  # its --max-output-bytes: 170 token vectors of 384 floats at 16 bytes each


@pytest.fixture(scope="module")
def strict_server() -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--max-request-bytes", str(RAISED), "--max-inputs", "64", "--api-key", KEY,
                         "--max-request-tokens", str(TOKENS), "--max-output-bytes", str(OUTPUT))
    yield srv
    srv.stop()


def post(srv: BouquetProcess, path: str, headers: dict[str, str] | None = None, **kw: object) -> httpx.Response:
    return httpx.post(srv.url + path, headers=headers if headers is not None else AUTH, timeout=120, **kw)  # type: ignore[arg-type]


# ---- 11. payload limit ------------------------------------------------------------------------
@pytest.mark.parametrize("size", [DEFAULT + 1, 6 * 1024 * 1024])
def test_body_over_default_limit_413(minilm_server, size):
    body = b'{"input": "x", "user": "' + b"u" * size + b'"}'
    err = openai_error(httpx.post(minilm_server.url + "/v1/embeddings", content=body,
                                  headers={"content-type": "application/json"}, timeout=60), 413, code="payload_too_large")
    assert f"limit of {DEFAULT} bytes" in err["message"] and "--max-request-bytes" in err["message"], err
    assert minilm_server.embed("after 413").status_code == 200


def test_content_length_over_limit_413_closes_at_once(minilm_server):
    """A Content-Length past the limit is answered 413 before any of the body is read, with
    ``Connection: close``, and the connection is closed then (after the front end's short linger),
    not when the body deadline or the read-gap timeout (10 s) ends it."""
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (DEFAULT + 1))
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", minilm_server.port), timeout=20) as s:
        s.sendall(head + b'{"input": "' + b"x" * 1000)
        data = b""
        while chunk := s.recv(65536):  # until the server closes
            data += chunk
        closed_after = time.monotonic() - t0
    status, _, rest = data.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status.split()[1] == b"413" and b"connection: close" in headers.lower(), data[:300]
    err = openai_error(httpx.Response(413, content=body, headers={"content-type": "application/json"}), 413,
                       code="payload_too_large")
    assert f"limit of {DEFAULT} bytes" in err["message"] and "--max-request-bytes" in err["message"], err
    assert closed_after < 6, closed_after
    assert minilm_server.embed("after 413").status_code == 200


def test_body_over_limit_chunked_without_content_length_413(minilm_server):
    def gen() -> Iterator[bytes]:
        yield b'{"input": "x", "user": "'
        for _ in range(DEFAULT // 65536 + 1):
            yield b"u" * 65536
        yield b'"}'

    r = httpx.post(minilm_server.url + "/v1/embeddings", content=gen(), headers={"content-type": "application/json"}, timeout=60)
    openai_error(r, 413, code="payload_too_large")


def test_raised_limit_serves_body_under_it(strict_server):
    body = b'{"input": "served", "user": "' + b"u" * (DEFAULT + 2**20) + b'"}'  # over the default, under the raised
    r = post(strict_server, "/v1/embeddings", {**AUTH, "content-type": "application/json"}, content=body)
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["data"]) == 1
    over = b'{"input": "x", "user": "' + b"u" * RAISED + b'"}'
    openai_error(post(strict_server, "/v1/embeddings", {**AUTH, "content-type": "application/json"}, content=over), 413)


# ---- limits on inputs and tokens per request -----------------------------------------------------
def test_input_count_limit(strict_server):
    assert post(strict_server, "/v1/embeddings", json={"input": ["a"] * 64}).status_code == 200
    err = openai_error(post(strict_server, "/v1/embeddings", json={"input": ["a"] * 65}), 413, "input", "too_many_inputs")
    assert "64" in err["message"]
    openai_error(post(strict_server, "/v1/embeddings", json={"input": [[101, 102]] * 65}), 413, "input")
    assert "--max-inputs" in err["message"], err


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"input": [101] + [7592] * 998 + [102]}),  # truncated to 256
    ("/v1/embeddings", {"input": [101] + [7592] * 998 + [102], "long_input": "chunk_mean"}),  # windows
    ("/embed", {"inputs": [101] + [7592] * 998 + [102]}),
    ("/decode", {"ids": [7592] * 1000}),
])
def test_one_token_id_list_is_one_input(strict_server, path, body):
    """A bare list of 1,000 token ids is one input under --max-inputs 64 (it was refused as 1,000 inputs)."""
    r = post(strict_server, path, json=body)
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    assert len(out["data"] if isinstance(out, dict) else out) == 1


def test_tokens_per_request_bounded(strict_server):
    """Tokens per request ≤ max_inputs × max_seq_length: long inputs are cut, never passed whole.
    They are counted after the cut: exactly at --max-request-tokens, served."""
    r = post(strict_server, "/v1/embeddings", json={"input": ["word " * 2000] * 64})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 64 * 256 == TOKENS


LONG = "word " * 2000  # ~2,000 tokens: 9 windows of 256 in the chunk modes


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": [LONG] * 9, "long_input": "chunk_mean"}, "input"),  # every window counts
    ("/v1/embeddings", {"input": [list(range(1000, 3000))] * 9, "long_input": "chunks"}, "input"),  # token ids
    ("/v1/rerank", {"query": "word " * 100, "documents": [LONG + str(i) for i in range(64)]}, None),  # query + documents
    ("/v1/score", {"text_1": "word", "text_2": [LONG + str(i) for i in range(64)]}, None),
    ("/embed", {"inputs": [LONG] * 9, "long_input": "chunk_mean"}, None),
    ("/similarity", {"inputs": {"source_sentence": "word " * 100, "sentences": [LONG] * 64},
                     "parameters": {"long_input": "truncate"}}, None),
    ("/rerank", {"query": "word " * 100, "texts": [LONG + str(i) for i in range(64)]}, None),
    ("/tokenize", {"inputs": [LONG] * 9}, None),  # never truncated: 9 × 2,002 tokens
    ("/decode", {"ids": [list(range(1000, 3000))] * 9}, None),
])
def test_token_limit_on_every_route(strict_server, path, body, param):
    """Over --max-request-tokens after tokenization: 413 in the route's error shape naming the limit
    and the flag, whatever the route; the server answers the next request."""
    r = post(strict_server, path, json=body)
    if path.startswith("/v1/"):
        message = openai_error(r, 413, code="too_many_tokens")["message"]
        assert openai_error(r, 413)["param"] == param
    else:
        message = tei_error(r, 413)["error"]
    assert f"limit of {TOKENS:,}" in message and "--max-request-tokens" in message, message
    assert post(strict_server, "/v1/embeddings", json={"input": "after 413"}).status_code == 200


@pytest.mark.parametrize("path, field", [("/embed_all", "inputs"), ("/v1/embeddings", "input")])
def test_output_cap_configured(strict_server, path, field):
    """--max-output-bytes 1 MiB: 170 token vectors of all-MiniLM-L6-v2 at most; 10 × ~22 tokens → 413
    naming the cap and its flag, 2 × ~22 served."""
    extra = {"output": "multi_vector"} if path.startswith("/v1/") else {}
    texts = [f"text number {i} with a few more words to pass twenty tokens in all of it" for i in range(10)]
    r = post(strict_server, path, json={field: texts, **extra})
    if path.startswith("/v1/"):
        message = openai_error(r, 413, field, "output_too_large")["message"]
    else:
        message = tei_error(r, 413)["error"]
    assert f"limit of {OUTPUT:,}" in message and "--max-output-bytes" in message, message
    r = post(strict_server, path, json={field: texts[:2], **extra})
    assert r.status_code == 200, r.text[:300]


# ---- a request can only name the served model ----------------------------------------------------
@pytest.mark.parametrize("model", ["/etc/passwd", "../../etc/passwd", "sentence-transformers/all-MiniLM-L6-v2/../../x",
                                   "file:///etc/passwd", "all-MiniLM-L6-v2\x00", "bert-base-uncased"])
def test_model_name_cannot_be_a_path(strict_server, model):
    err = openai_error(post(strict_server, "/v1/embeddings", json={"input": "x", "model": model}), 404, "model", "model_not_found")
    assert "passwd" not in err["message"] or "does not exist" in err["message"]
    r = post(strict_server, "/v1/rerank", json={"query": "q", "documents": ["d"], "model": model})
    assert r.status_code in (400, 404), r.text  # 400 when this model cannot rerank at all


def test_model_directory_path_is_not_a_name(strict_server):
    from bouquet.modelspec import resolve_model_path

    path = str(resolve_model_path(None))
    openai_error(post(strict_server, "/v1/embeddings", json={"input": "x", "model": path}), 404, "model")


# ---- API key on every route but /health --------------------------------------------------------
def test_api_key_every_route_but_health(strict_server):
    assert httpx.get(strict_server.url + "/health").status_code == 200
    schema = httpx.get(strict_server.url + "/openapi.json", headers=AUTH).json()
    routes = [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops if p != "/health"]
    assert ("POST", "/v1/embeddings") in routes and len(routes) >= 5, routes
    for method, path in routes + [("GET", "/openapi.json"), ("GET", "/metrics")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
            r = httpx.request(method, strict_server.url + path, headers=headers, json={}, timeout=30)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.headers.get("www-authenticate", "").startswith("Bearer")
        r = httpx.request(method, strict_server.url + path, headers=AUTH, json={}, timeout=30)
        assert r.status_code != 401, (method, path)


def test_api_key_refusal_names_what_was_wrong(strict_server):
    """A 401 says whether the header was missing, used another scheme (named: a client set up with a
    user and password sends ``Basic``), had no scheme (the bare value is not echoed), or held another key."""
    url = strict_server.url + "/v1/embeddings"
    for headers, words in (({}, "missing 'Authorization: Bearer' header"),
                           ({"Authorization": "Basic dXNlcjpwYXNz"}, "uses the 'Basic' scheme"),
                           ({"Authorization": KEY}, "is not of the form 'Bearer <API key>'"),
                           ({"Authorization": "Bearer wrong"}, "invalid API key")):
        r = httpx.post(url, headers=headers, json={"input": "x"}, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 401 and err["code"] == "invalid_api_key" and words in err["message"], r.text
        assert KEY not in r.text and "dXNlcjpwYXNz" not in r.text


# ---- weights only from safetensors -------------------------------------------------------------
class _Boom:
    """Unpickling this runs a command: what loading an untrusted pytorch_model.bin can do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def pickle_only_model(tmp_path_factory) -> tuple[Path, Path]:
    from bouquet.modelspec import resolve_model_path

    src = resolve_model_path(None)
    dst = tmp_path_factory.mktemp("pickle-model")
    for f in src.rglob("*"):
        if f.is_file() and not f.name.endswith(".safetensors"):
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst / f.relative_to(src))
    marker = dst / "PWNED"
    with open(dst / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"weights": _Boom(marker)}, fh)
    return dst, marker


def test_pickle_weights_refused_by_loader(pickle_only_model):
    from bouquet.engine.models.weights import WeightError, load_safetensors

    path, marker = pickle_only_model
    with pytest.raises(WeightError, match="safetensors"):
        load_safetensors(path)
    assert not marker.exists()


def test_allow_pickle_unpickles_tensors_only(pickle_only_model):
    """--allow-pickle loads through torch.load(weights_only=True): a crafted pickle is still refused."""
    from bouquet.engine.models.weights import WeightError, load_weights

    path, marker = pickle_only_model
    with pytest.raises(WeightError, match="--allow-pickle"):
        load_weights(path)
    with pytest.raises(WeightError, match="weights_only"):
        load_weights(path, allow_pickle=True)
    assert not marker.exists(), "the pickle was executed"


def test_pickle_only_model_dir_refused_by_serve(pickle_only_model):
    path, marker = pickle_only_model
    cmd = [sys.executable, "-m", "bouquet", "serve", "--model", str(path), "--device", "cpu", "--port", str(free_port())]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    assert "safetensors" in out and "--allow-pickle" in out, out[-2000:]
    assert not marker.exists(), "the pickle was executed"
