"""The HTTP front end's own refusals (protocol.py) are logged at INFO with their request id and
counted in /metrics (``bouquet_http_refusals_total``), like the app's answers (docs/api.md), on raw
sockets against a real `bouquet serve --engine noop`; the log's rate limit (refusals.py) on its own."""
from __future__ import annotations

import logging
import re
import time
from typing import Iterator

import httpx
import pytest

from bouquet.gateway.refusals import Refusals
from helpers import BouquetProcess
from tests.integration.test_http_front import connect, post, read_reply, refused


@pytest.fixture(scope="module")
def front() -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--engine", "noop", "--gateway-workers", "1")
    yield srv
    srv.stop()


def refusals_metric(srv: BouquetProcess, status: int, code: str) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    m = re.search(rf'^bouquet_http_refusals_total\{{(?=[^}}]*code="{code}")(?=[^}}]*status="{status}")[^}}]*\}} (\S+)$',
                  text, re.M)
    return float(m.group(1)) if m else 0.0


def logged(srv: BouquetProcess, needle: str, timeout: float = 5.0) -> str:
    """The server's log line holding ``needle`` (waits for it: the log is written asynchronously)."""
    end = time.monotonic() + timeout
    while True:
        line = next((ln for ln in srv.log_path.read_text(errors="replace").splitlines() if needle in ln), "")
        if line or time.monotonic() > end:
            return line
        time.sleep(0.1)


def test_a_413_and_a_431_are_logged_with_their_request_id_and_counted(front):
    before = refusals_metric(front, 413, "payload_too_large"), refusals_metric(front, 431, "request_header_fields_too_large")
    with connect(front) as s:
        s.sendall(post("/v1/embeddings", b"", length=9999999, extra=b"X-Request-Id: trial2-big\r\n"))
        refused(s, 413, "payload_too_large", "/v1/embeddings")
    line = logged(front, "request_id=trial2-big")
    assert "413" in line and "payload_too_large" in line and "/v1/embeddings" in line, line
    # 120 field lines are past --max-header-count's default: its head was parsed, so the id is the client's
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(120))
    with connect(front) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Request-Id: trial2-fields\r\n" + fields + b"\r\n")
        refused(s, 431, "request_header_fields_too_large")
    line = logged(front, "request_id=trial2-fields")
    assert "431" in line and "request_header_fields_too_large" in line, line
    # a head past --max-header-bytes never completes: the id logged is the one generated and answered
    with connect(front) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        status, headers, _ = read_reply(s)
    assert status == 431
    assert logged(front, f"request_id={headers['x-request-id']}")
    assert refusals_metric(front, 413, "payload_too_large") == before[0] + 1
    assert refusals_metric(front, 431, "request_header_fields_too_large") == before[1] + 2
    r = httpx.post(f"{front.url}/v1/embeddings", json={"input": "hi"}, timeout=10)  # the next request is served
    assert r.status_code == 200, r.text


def test_the_refusal_log_is_rate_limited_and_summarised(caplog):
    """At most ``lines_per_s`` lines a second; the rest are summarised when the next second
    begins; every refusal is counted."""
    now = [100.0]
    counts: list[tuple[str, str]] = []

    class Counter:  # records labels: the prometheus_client counter itself is exercised above
        def labels(self, status: str, code: str) -> "Counter":
            counts.append((status, code))
            return self

        def inc(self) -> None:
            pass

    rec = Refusals(Counter(), lines_per_s=3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="bouquet.access"):
        for i in range(10):
            rec.record(400, "invalid_http_request", "/x", b"id-%d" % i)
        assert [r.getMessage().endswith(f"request_id=id-{i}") for i, r in enumerate(caplog.records)] == [True] * 3
        now[0] += 1.0
        rec.record(413, "payload_too_large", "/y", b"id-next")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 5 and "refused 7 more requests" in messages[3], messages
    assert messages[4] == "refused '/y' 413 payload_too_large request_id=id-next"
    assert counts == [("400", "invalid_http_request"), ("413", "payload_too_large")]  # label children cached
