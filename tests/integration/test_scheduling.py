"""Scheduling through the real stack (one CPU replica, small batches): priority classes, the bounded
queue (429 + Retry-After) and cancellation of an abandoned request's queued work.

Timing-robust by construction: each check compares the order in which work finishes, or counts,
against a bulk load many batches long, never an absolute latency.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from helpers import BouquetProcess

# 16,000 tokens: 32 batches of 512 tokens, in 16 chunks of 1,024 (under the 20,000-token queue
# bound). Large enough that well over a second of it is left when the short query arrives 0.5 s in,
# however fast the gateway parses it (10,000 tokens once left only 0.93 s on a quiet CI machine).
BULK_SEQS, BULK_LEN = 160, 100


@pytest.fixture(scope="module")
def small_queue():
    srv = BouquetProcess("--max-batch-tokens", "512", "--chunk-tokens", "1024", "--max-queue-tokens", "20000")
    yield srv
    srv.stop()


def token_lists(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(1000, 20000, size=(n, length)).tolist()


def replica(srv: BouquetProcess) -> dict:
    return httpx.get(srv.url + "/health", timeout=10).json()["replicas"][0]


def race(srv: BouquetProcess, bulk_priority: str | None) -> tuple[float, float, float]:
    """Send a bulk request, then (while it runs) one short text. Returns (time the short text was
    sent, its latency, time from sending it until the bulk request finished)."""
    body: dict[str, object] = {"input": token_lists(BULK_SEQS, BULK_LEN, seed=1)}
    if bulk_priority is not None:
        body["priority"] = bulk_priority
    bulk_done: list[float] = []

    def bulk() -> None:
        r = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=120)
        assert r.status_code == 200, r.text
        bulk_done.append(time.monotonic())

    t = threading.Thread(target=bulk)
    t.start()
    time.sleep(0.5)  # the bulk chunks are queued on the replica
    sent = time.monotonic()
    assert srv.embed("a short interactive query").status_code == 200
    latency = time.monotonic() - sent
    t.join(120)
    assert bulk_done, "bulk request did not finish"
    return sent, latency, bulk_done[0] - sent


def test_interactive_waits_for_the_batch_in_flight_not_the_bulk_queue(small_queue):
    srv = small_queue
    srv.embed("warm up")
    # Default rule: a 16,000-token request is `batch` (> --interactive-max-tokens 2048), and so is
    # each of its 1,024-token chunks, although a chunk alone would count as interactive.
    _, latency, bulk_left = race(srv, None)
    assert bulk_left > 1.0, "bulk finished too early for the comparison to mean anything"
    assert latency < 0.5 * bulk_left, (latency, bulk_left)
    # Same class for everyone: first come, first served, so the query waits for the whole bulk.
    _, latency_fcfs, bulk_left_fcfs = race(srv, "interactive")
    assert latency_fcfs >= 0.8 * bulk_left_fcfs, (latency_fcfs, bulk_left_fcfs)


def _raw_post(url: str, body: bytes) -> socket.socket:
    """Send a POST and return the open socket without reading the answer (a client that will
    hang up)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    s.sendall(head + body)
    return s


def test_queue_full_is_429_and_disconnect_drops_queued_work(small_queue):
    srv = small_queue
    before = replica(srv)["cancelled_sequences"]
    # A: 95 × 200 = 19,000 tokens (fits the 20,000-token queue), from a client that will hang up.
    a_body = json.dumps({"input": token_lists(95, 200, seed=2), "priority": "batch"}).encode()
    sock = _raw_post(srv.url, a_body)
    deadline = time.monotonic() + 15
    while replica(srv)["pending_tokens"] < 10_000:  # A is queued on the replica
        assert time.monotonic() < deadline, "bulk request never reached the replica"
        time.sleep(0.1)
    # B: another 19,000 tokens do not fit while A waits: 429 with Retry-After, not a hang.
    r = srv.embed(token_lists(95, 200, seed=3), priority="batch")
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
    sock.close()  # A's client goes away
    deadline = time.monotonic() + 20
    while True:
        rep = replica(srv)
        if rep["pending_tokens"] == 0 and rep["cancelled_sequences"] - before >= 30:
            break  # B's own dropped chunks account for at most ~10 sequences; A's for the rest
        assert time.monotonic() < deadline, rep
        time.sleep(0.2)
    assert srv.embed(["the queue is free again"]).status_code == 200
