"""Client disconnects and graceful shutdown (drain) of the real `bouquet serve`."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from helpers import BouquetProcess
from reliability import child_pids, openai_error, tei_error

# ~16k tokens: seconds of CPU work, long enough to be in flight when the test acts on it
# 64 distinct texts: the gateway runs identical inputs once, so copies would finish at once.
BIG = [f"text {i}: a fairly long sentence about rivers, mountains and the cities between them " * 20 for i in range(64)]


def cancelled(srv: BouquetProcess) -> int:
    return sum(r.get("cancelled_sequences") or 0 for r in httpx.get(srv.url + "/health", timeout=10).json()["replicas"])


def closed_count(srv: BouquetProcess) -> float:
    """bouquet_http_requests_total for POST /v1/embeddings with status 499 (client closed request)."""
    for line in httpx.get(srv.url + "/metrics", timeout=10).text.splitlines():
        if (line.startswith("bouquet_http_requests_total{") and 'route="/v1/embeddings"' in line
                and 'method="POST"' in line and 'status="499"' in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_client_disconnect_server_keeps_serving(minilm_server):
    before = cancelled(minilm_server)
    closed = closed_count(minilm_server)
    for _ in range(3):
        with pytest.raises(httpx.TimeoutException):  # the client gives up and closes its connection
            httpx.post(minilm_server.url + "/v1/embeddings", json={"input": BIG}, timeout=httpx.Timeout(60, read=0.3))
    t0 = time.monotonic()
    assert minilm_server.embed(["still serving"]).status_code == 200
    assert httpx.get(minilm_server.url + "/health", timeout=10).status_code == 200
    # The abandoned requests' queued sequences were dropped, not computed ...
    deadline = time.monotonic() + 30
    while cancelled(minilm_server) <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(minilm_server) > before
    # ... the requests are counted, as status 499 (nothing was sent: the client had gone) ...
    while closed_count(minilm_server) < closed + 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert closed_count(minilm_server) == closed + 3
    # ... and the small request did not wait behind 3 × 16k abandoned tokens (minutes on a busy CPU).
    assert time.monotonic() - t0 < 60


def test_sigterm_drains_then_exits():
    srv = BouquetProcess()
    try:
        replicas = child_pids(srv.proc.pid)
        result: dict[str, httpx.Response] = {}
        inflight = threading.Thread(target=lambda: result.setdefault("r", srv.embed(BIG)))
        inflight.start()
        time.sleep(0.5)  # the big request is now running on the replica
        t_term = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # new requests: 503 in the API's error shape with Retry-After; /health says 503 too
        err = openai_error(httpx.post(srv.url + "/v1/embeddings", json={"input": "new"}, timeout=10), 503, code="shutting_down")
        assert "shutting down" in err["message"]
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "new"}, timeout=10)
        assert int(r.headers["retry-after"]) >= 1
        health = httpx.get(srv.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "shutting_down", health.text
        assert health.json()["error_type"] == "Unhealthy" and int(health.headers["retry-after"]) >= 1
        tei_error(httpx.post(srv.url + "/embed", json={"inputs": "x"}, timeout=10), 503)
        # the request that was in flight finishes normally
        inflight.join(60)
        assert result["r"].status_code == 200, result["r"].text[:300]
        assert len(result["r"].json()["data"]) == len(BIG)
        # then the process exits on its own, cleanly, and takes its replicas with it
        assert srv.proc.wait(45) == 0
        assert time.monotonic() - t_term < 45
        assert "draining: 1 request(s) in flight" in srv.log()
        for pid in replicas:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not _gone(pid):
                time.sleep(0.1)
            assert _gone(pid), f"replica {pid} outlived the launcher"
    finally:
        srv.stop()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _drain_case(srv: BouquetProcess, settle_s: float) -> tuple[dict[str, httpx.Response], threading.Thread, float]:
    """Start BIG in flight, SIGTERM the launcher, wait ``settle_s``; new requests must get 503."""
    result: dict[str, httpx.Response] = {}
    inflight = threading.Thread(target=lambda: result.setdefault("r", srv.embed(BIG * 4)))
    inflight.start()
    time.sleep(0.5)
    t_term = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(settle_s)
    for _ in range(4):  # with gateway workers, new connections may land on any of them
        with httpx.Client() as fresh:
            openai_error(fresh.post(srv.url + "/v1/embeddings", json={"input": "new"}, timeout=10), 503, code="shutting_down")
    return result, inflight, t_term


def test_drain_timeout_answers_the_requests_still_running_503():
    # BIG * 4 (~64k tokens) takes far longer than the 1 s drain on a CPU: at the deadline the
    # gateway answers it 503 in the API's shape (not a plain-text 500 or a reset) and exits cleanly.
    srv = BouquetProcess("--drain-timeout", "1")
    try:
        result, inflight, t_term = _drain_case(srv, 0.3)
        inflight.join(30)
        err = openai_error(result["r"], 503, code="shutting_down")
        assert "shut down before this request finished" in err["message"]
        assert int(result["r"].headers["retry-after"]) >= 1
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - t_term < 20
        assert "answering them 503" in srv.log()
    finally:
        srv.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_second_sigterm_ends_the_drain_with_503(workers: str):
    # with gateway workers the supervisor relays the second signal too (it did not: the workers
    # drained to the end; fresh-clone trial)
    srv = BouquetProcess("--gateway-workers", workers)  # the default 30 s drain
    try:
        result, inflight, t_term = _drain_case(srv, 0.3 if workers == "1" else 1.0)
        srv.proc.send_signal(signal.SIGTERM)
        inflight.join(30)
        openai_error(result["r"], 503, code="shutting_down")
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - t_term < 15
        assert "Traceback" not in srv.log()
    finally:
        srv.stop()


def test_gateway_workers_drain_on_sigterm():
    srv = BouquetProcess("--gateway-workers", "2", "--drain-timeout", "60")
    try:
        result, inflight, _ = _drain_case(srv, 1.0)  # the supervisor signals its workers within 0.5 s
        inflight.join(120)
        assert result["r"].status_code == 200, result["r"].text[:300]
        assert len(result["r"].json()["data"]) == len(BIG) * 4
        assert srv.proc.wait(45) == 0
    finally:
        srv.stop()
