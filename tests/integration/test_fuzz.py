"""Fuzzing: schemathesis over every route ``/openapi.json`` declares, plus hand-made malformed bodies.

Property: no reply is a 5xx, and every error is in the documented shape of its route family.
Bounded: a few dozen generated examples per operation, positive and negative, no shrinking.
"""
from __future__ import annotations

import httpx
import pytest

from reliability import any_error_shape

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

MAX_EXAMPLES = 25


def operations(url: str) -> list:
    """Every operation the served /openapi.json declares (whatever routes this tree has)."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


@pytest.mark.slow
def test_schemathesis_no_5xx_documented_error_shape(minilm_server):
    # Driven through hypothesis directly: schemathesis' pytest plugin does not support pytest 9 yet.
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    ops = operations(minilm_server.url)
    assert any(op.path == "/v1/embeddings" for op in ops)
    seen: list[tuple[str, str, int]] = []
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case) -> None:  # type: ignore[no-untyped-def]
                r = case.call(base_url=minilm_server.url, timeout=120)
                seen.append((case.method, case.path, r.status_code))
                assert r.status_code < 500, (case.method, case.path, case.body, r.status_code, r.text[:500])
                if r.status_code >= 400:
                    any_error_shape(case.path, r.json())

            try:
                check()
            except Unsatisfiable:  # no invalid request exists (e.g. GET without parameters)
                assert mode == GenerationMode.NEGATIVE, op.path
    assert len(seen) >= len(ops)  # main declares no body schemas yet: one case per operation
    assert minilm_server.embed("alive").status_code == 200


def _deep(n: int) -> bytes:
    return b'{"input": ' + b"[" * n + b'"x"' + b"]" * n + b"}"


MALFORMED = [
    b"", b"{", b"null", b"[]", b'"just a string"', b"123", b"{'input': 'single quotes'}",
    b'{"input": "a",}', b'{"input": "\xff\xfe invalid utf-8"}', b'{"input": "\xed\xa0\x80 surrogate"}',
    b'{"input": "a", "dimensions": 1e400}', b'{"input": "a", "dimensions": 99999999999999999999999999999}',
    b'{"input": [1e308]}', b'{"input": [-99999999999999999999999]}', b'{"input": NaN}', b'{"input": Infinity}',
    _deep(100), _deep(5000), b'{"input": {"a": ' * 300 + b"1" + b"}" * 300 + b"}",
    b'{"input": "a", "input": 5}', b'\x00\x00\x00\x00', b"\xef\xbb\xbf{\"input\": \"bom\"}",
]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/embed", "/embed", "/v1/rerank", "/rerank", "/v1/score", "/predict",
                                  "/"])
def test_malformed_bodies_are_4xx(minilm_server, path):
    for body in MALFORMED:
        for ctype in ("application/json", "text/plain"):
            r = httpx.post(minilm_server.url + path, content=body, headers={"content-type": ctype}, timeout=60)
            assert 400 <= r.status_code < 500, (path, body[:60], r.status_code, r.text[:300])
            any_error_shape(path, r.json())
    assert minilm_server.embed("alive").status_code == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_wrong_method_4xx(minilm_server, method):
    r = httpx.request(method, minilm_server.url + "/v1/embeddings", timeout=30)
    assert r.status_code in (404, 405), r.text


ROUTES = ["/v1/embeddings", "/v2/embed", "/v1/rerank", "/v1/score", "/embed", "/rerank", "/tokenize", "/embed_sparse", "/embed_all",
          "/predict", "/", "/invocations", "/health", "/metrics",
          "/v1/models", "/v1/models/sentence-transformers/all-MiniLM-L6-v2", "/v1/models/unknown", "/info", "/nope"]


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_every_method_on_every_route(minilm_server, method):
    """No 5xx for any method on any route (HEAD and item routes included); errors in the route
    family's JSON shape; HEAD answers like GET without a body."""
    for path in ROUTES:
        r = httpx.request(method, minilm_server.url + path, json={"input": "x"} if method == "POST" else None, timeout=60)
        assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
        if method == "HEAD":
            assert r.content == b""
            assert r.status_code == httpx.request("GET", minilm_server.url + path, timeout=60).status_code, path
        elif r.status_code >= 400:
            any_error_shape(path, r.json())
