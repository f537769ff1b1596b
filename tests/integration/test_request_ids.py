"""Issue 39, item 3: every response carries ``X-Request-Id`` (the client's when sane, else a
generated one), errors included; the request's log line names it; a W3C ``traceparent`` reaches the
replica, whose log shows it with the request id. (The gRPC path's metadata and the 401 are in
test_replica_auth.py.)"""
from __future__ import annotations

import re
import socket
import time

import httpx
import pytest

from bouquet.config import ServeConfig
from helpers import BouquetProcess, free_port

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GENERATED = re.compile(r"[0-9a-f]{32}")
# (method, path, body or None, the status expected): success and every error the front answers
CASES = [
    ("POST", "/v1/embeddings", {"input": "ok"}, 200),
    ("POST", "/embed", {"inputs": "ok"}, 200),
    ("GET", "/health", None, 200),
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/embeddings", {"input": []}, 400),
    ("POST", "/v1/embeddings", b"{not json", 400),
    ("GET", "/no/such/route", None, 404),
    ("PUT", "/v1/embeddings", {"input": "x"}, 405),
    ("POST", "/v1/embeddings", b'{"input": "' + b"x" * ServeConfig().request_bytes_limit + b'"}', 413),
]


def send(srv: BouquetProcess, method: str, path: str, body: object, headers: dict[str, str]) -> httpx.Response:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    return httpx.request(method, srv.url + path, headers={"content-type": "application/json", **headers}, timeout=60,
                         **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("method,path,body,status", CASES, ids=[f"{m}{p}-{s}" for m, p, _, s in CASES])
def test_request_id_echoed_or_generated_on_every_response(minilm_server, method, path, body, status):
    sent = send(minilm_server, method, path, body, {"X-Request-Id": "client-id_1.2:3"})
    assert sent.status_code == status, sent.text[:300]
    assert sent.headers.get_list("x-request-id") == ["client-id_1.2:3"]
    a, b = (send(minilm_server, method, path, body, {}) for _ in range(2))
    assert a.status_code == status and GENERATED.fullmatch(a.headers["x-request-id"]), a.headers
    assert a.headers["x-request-id"] != b.headers["x-request-id"]


@pytest.mark.parametrize("bad", ["x" * 129, "two words", "a;b=c", "<script>", "caf\u00e9", ""])
def test_request_id_not_sane_is_replaced(minilm_server, bad):
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": "x"},
                   headers=[("X-Request-Id", bad.encode())], timeout=60)
    assert r.status_code == 200 and GENERATED.fullmatch(r.headers["x-request-id"]), r.headers


def wait_for_log(srv: BouquetProcess, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (log := srv.log_path.read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return log


def test_error_log_line_names_the_request_id(minilm_server):
    r = httpx.get(minilm_server.url + "/no/such/thing", headers={"X-Request-Id": "find-me-404"})
    assert r.status_code == 404
    log = wait_for_log(minilm_server, "request_id=find-me-404")
    assert re.search(r"bouquet\.access: GET '/no/such/thing' 404 [\d.]+ ms request_id=find-me-404", log), log[-2000:]


def test_traceparent_reaches_the_replica_log(minilm_server):
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": ["traced", "twice"]},
                   headers={"traceparent": TRACEPARENT, "X-Request-Id": "traced-ipc-1"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-request-id"] == "traced-ipc-1"
    log = wait_for_log(minilm_server, "request_id=traced-ipc-1")
    assert re.search(rf"bouquet\.server\.service: call traceparent={TRACEPARENT} request_id=traced-ipc-1 "
                     r"sequences=2: ok, \d+ tokens", log), log[-2000:]
    # malformed trace context (W3C: all-zero trace id; version ff) is dropped, not passed on
    for bad in ("00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"):
        r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": "x"},
                       headers={"traceparent": bad, "X-Request-Id": "bad-trace"}, timeout=60)
        assert r.status_code == 200
    time.sleep(0.5)
    assert "request_id=bad-trace" not in minilm_server.log_path.read_text(errors="replace")


def test_request_id_on_503_without_a_replica():
    # a gateway whose only replica address answers nothing: /health and inference are 503
    srv = BouquetProcess("--server", f"127.0.0.1:{free_port()}", wait_for=(503,))
    try:
        for method, path, body in (("GET", "/health", None), ("POST", "/v1/embeddings", {"input": "x"})):
            r = send(srv, method, path, body, {"X-Request-Id": "no-replica-1"})
            assert r.status_code == 503 and r.headers["x-request-id"] == "no-replica-1", r.text
    finally:
        srv.stop()


@pytest.mark.parametrize("payload", [b"NOT HTTP AT ALL\r\n\r\n",
                                     b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n{}"])
def test_request_id_on_answers_below_the_routes(minilm_server, payload):
    """A request the HTTP layer could not parse still gets an id (a generated one: none was read)."""
    with socket.create_connection(("127.0.0.1", minilm_server.port), timeout=30) as s:
        s.sendall(payload)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert head[0].startswith("HTTP/1.1 400"), head
    ids = [line.split(": ", 1)[1] for line in head[1:] if line.lower().startswith("x-request-id: ")]
    assert len(ids) == 1 and GENERATED.fullmatch(ids[0]), head
